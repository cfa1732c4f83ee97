// The operator's dashboard: polls the admin API once a second (one request
// in flight at a time), keeps two minutes of history per figure, draws it
// as hand-written SVG, and applies setting changes after a confirmation
// that shows their simulated effect. The admin token lives in
// sessionStorage (this tab only); a 401 forgets it and asks again. A
// gateway without an admin token (the page's body says
// data-admin-token="none", a 401 says reason "no_admin_token") gets no
// prompt but a plain notice and a read-only view of its rooms from the
// public room state, which anyone may read.
"use strict";

(function () {
  const TOKEN_KEY = "sluice_admin_token";
  const POLL_MS = 1000;
  const HISTORY = 120;
  const STALE_MS = 2500;
  const SVG_NS = "http://www.w3.org/2000/svg";

  const LABELS = {
    rate_per_sec: "Rate",
    burst: "Burst",
    max_active: "Max active sessions",
    difficulty_floor_bits: "PoW floor",
    difficulty_ceiling_bits: "PoW ceiling",
    paused: "Paused",
    body: "The request",
    query: "The simulation",
  };

  const $ = (id) => document.getElementById(id);
  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || "",
    running: false,
    readOnly: false,
    timer: 0,
    lastOk: 0,
    rooms: new Map(), // id -> {view, el, hist, prev, charts}
    origin: { prev: null, hist: { rps: [], p99: [], err: [] }, charts: null },
  };

  // === formatting ===

  const nf0 = new Intl.NumberFormat("en", { maximumFractionDigits: 0 });
  const nf1 = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });
  const num = (x) => (x == null || !isFinite(x) ? "—" : Math.abs(x) >= 100 ? nf0.format(x) : nf1.format(x));

  function duration(s) {
    if (s == null || !isFinite(s)) return "never";
    s = Math.round(s);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }

  function plural(n, one, many) {
    return nf0.format(n) + " " + (n === 1 ? one : many);
  }

  // === the API ===

  class Unauthorized extends Error {
    constructor(message, reason) {
      super(message);
      this.reason = reason;
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + state.token, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), 5000);
    let res;
    try {
      res = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        credentials: "omit",
        signal: ctl.signal,
      });
    } catch (e) {
      throw new Error("The gateway did not answer (" + (e.name === "AbortError" ? "timed out" : e.message) + ").");
    } finally {
      clearTimeout(t);
    }
    const text = await res.text();
    if (res.status === 401) {
      let p = {};
      try { p = JSON.parse(text); } catch (_) { /* not a problem document */ }
      throw new Unauthorized("The admin token was refused.", p.reason);
    }
    if (!res.ok) {
      let p = {};
      try { p = JSON.parse(text); } catch (_) { /* not a problem document */ }
      const err = new Error(plainProblem(res.status, p));
      err.problem = p;
      throw err;
    }
    const ct = res.headers.get("content-type") || "";
    return ct.includes("json") ? JSON.parse(text) : text;
  }

  function plainProblem(status, p) {
    if (p.code === "invalid_setting") {
      const what = LABELS[p.field] || p.field || "A setting";
      return what + ": " + (p.detail || "is out of range") + ". Nothing was changed.";
    }
    if (p.code === "rate_limited") return "Too many refused attempts from your network; wait a minute.";
    if (p.code === "store_unavailable") return "The queue store is not answering; nothing was changed. Try again.";
    if (p.code === "room_not_found") return "This room no longer exists on the gateway.";
    return (p.title || "The gateway answered " + status) + (p.detail ? ": " + p.detail : "") + ".";
  }

  // === login ===

  function askToken(message) {
    stop();
    state.token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    $("login").hidden = false;
    $("logout").hidden = true;
    $("login-error").textContent = message || "";
    $("freshness").textContent = "Not connected";
    $("freshness").classList.remove("stale");
    const input = $("login-token");
    input.value = "";
    input.focus();
  }

  // A 401: the gateway has no admin token at all (say so, and show what is
  // public), or this one is wrong (ask again).
  function refused(e) {
    if (e.reason === "no_admin_token") readOnly();
    else askToken("That token was refused: type it again.");
  }

  function onLogin(ev) {
    ev.preventDefault();
    const t = $("login-token").value.trim();
    if (!t) {
      $("login-error").textContent = "Type the admin token.";
      return;
    }
    state.token = t;
    sessionStorage.setItem(TOKEN_KEY, t);
    $("login").hidden = true;
    $("logout").hidden = false;
    start();
  }

  // === polling ===

  function start() {
    if (state.running) return;
    state.running = true;
    if (state.readOnly) pollPublic();
    else poll();
  }

  function stop() {
    state.running = false;
    clearTimeout(state.timer);
  }

  // One cycle: rooms, events, metrics, one after the other; the next cycle
  // starts a second after this one started (at once if it took longer).
  async function poll() {
    if (!state.running) return;
    const began = performance.now();
    try {
      const rooms = await api("GET", "/_sluice/admin/rooms");
      renderRooms(rooms.rooms || [], performance.now());
      // An invite-only room: its codes issued, redeemed and revoked.
      for (const v of rooms.rooms || []) {
        if (!v.invite_only) continue;
        const inv = await api("GET", "/_sluice/admin/rooms/" + encodeURIComponent(v.room) + "/invites");
        showInvites(state.rooms.get(v.room), inv);
      }
      const events = await api("GET", "/_sluice/admin/events");
      renderEvents(events.events || []);
      const metrics = await api("GET", "/metrics");
      renderOrigin(parseMetrics(metrics), performance.now());
      state.lastOk = Date.now();
      $("global-error").textContent = "";
      tickFreshness();
    } catch (e) {
      if (e instanceof Unauthorized) {
        refused(e);
        return;
      }
      $("global-error").textContent = e.message;
    }
    if (!state.running) return;
    const wait = Math.max(0, POLL_MS - (performance.now() - began));
    state.timer = setTimeout(poll, wait);
  }

  function tickFreshness() {
    const el = $("freshness");
    if (!state.running || !state.lastOk) return;
    const age = (Date.now() - state.lastOk) / 1000;
    el.textContent = "Last updated " + age.toFixed(1) + " s ago";
    el.classList.toggle("stale", age * 1000 > STALE_MS);
  }

  // === read-only: no admin token ===

  // The rooms the read-only view shows: ?room=ID (repeatable), else the
  // embedded default's one room.
  function publicRoomIds() {
    const ids = new URLSearchParams(location.search).getAll("room").filter((x) => x);
    return ids.length ? ids : ["default"];
  }

  function readOnly() {
    stop();
    state.token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    state.readOnly = true;
    $("login").hidden = true;
    $("logout").hidden = true;
    $("readonly").hidden = false;
    // the operator's view, if one was drawn before the token went away
    $("rooms").replaceChildren();
    state.rooms.clear();
    $("origin").hidden = true;
    $("events").hidden = true;
    start();
  }

  async function publicRoom(id) {
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), 5000);
    try {
      const res = await fetch("/_sluice/rooms/" + encodeURIComponent(id), {
        headers: { Accept: "application/json" },
        cache: "no-store",
        credentials: "omit",
        signal: ctl.signal,
      });
      const p = await res.json().catch(() => ({}));
      if (res.status === 404) throw new Error("This gateway has no room " + id + ".");
      if (!res.ok) throw new Error(plainProblem(res.status, p));
      return p;
    } catch (e) {
      if (e.name === "AbortError") throw new Error("The gateway did not answer (timed out).");
      throw e;
    } finally {
      clearTimeout(t);
    }
  }

  async function pollPublic() {
    if (!state.running) return;
    const began = performance.now();
    try {
      for (const id of publicRoomIds()) renderPublicRoom(await publicRoom(id));
      state.lastOk = Date.now();
      $("global-error").textContent = "";
      tickFreshness();
    } catch (e) {
      $("global-error").textContent = e.message;
    }
    if (!state.running) return;
    state.timer = setTimeout(pollPublic, Math.max(0, POLL_MS - (performance.now() - began)));
  }

  function renderPublicRoom(v) {
    let r = state.rooms.get(v.room);
    if (!r) {
      const tpl = $("public-room-template").content.firstElementChild.cloneNode(true);
      const id = v.room;
      tpl.id = "room-" + id;
      tpl.dataset.room = id;
      const title = tpl.querySelector(".room-title");
      title.id = "room-" + id + "-title";
      title.textContent = "Room " + id;
      tpl.setAttribute("aria-labelledby", title.id);
      tpl.querySelectorAll("[data-v]").forEach((el) => (el.id = id + "-" + el.dataset.v));
      const box = tpl.querySelector(".charts");
      r = { id, el: tpl, charts: { queue_length: chart(box, "In line", "") }, hist: { queue_length: [] } };
      $("rooms").append(tpl);
      state.rooms.set(id, r);
    }
    push(r.hist.queue_length, v.queue_length);
    r.charts.queue_length.update(r.hist.queue_length);
    const set = (k, text) => {
      const el = r.el.querySelector('[data-v="' + k + '"]');
      if (el && el.textContent !== text) el.textContent = text;
    };
    set("state", v.state);
    r.el.querySelector(".badge").className = "badge " + v.state;
    set("queue_length", num(v.queue_length));
    set("rate_per_sec", num(v.rate_per_sec) + "/s");
    set("eta", duration(v.eta_seconds_for_new_visitor));
    set("drain", v.queue_length === 0 ? "—" : v.state === "paused" ? "paused" : duration(v.queue_length / v.rate_per_sec));
  }

  // === charts ===

  function chart(container, title, unit, opts) {
    const fig = document.createElement("figure");
    const cap = document.createElement("figcaption");
    const name = document.createElement("span");
    name.textContent = title;
    const now = document.createElement("b");
    now.textContent = "—";
    cap.append(name, now);
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("class", "chart" + (opts && opts.bad ? " chart-bad" : ""));
    svg.setAttribute("viewBox", "0 0 " + HISTORY + " 40");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("role", "img");
    const base = document.createElementNS(SVG_NS, "line");
    base.setAttribute("x1", "0");
    base.setAttribute("x2", String(HISTORY));
    base.setAttribute("y1", "39.5");
    base.setAttribute("y2", "39.5");
    const area = document.createElementNS(SVG_NS, "polygon");
    const line = document.createElementNS(SVG_NS, "polyline");
    svg.append(base, area, line);
    fig.append(cap, svg);
    container.append(fig);
    return {
      update(values) {
        const last = values.length ? values[values.length - 1] : null;
        now.textContent = num(last) + (unit && last != null ? " " + unit : "");
        const finite = values.filter((v) => v != null && isFinite(v));
        const max = Math.max(1e-9, ...finite);
        const peak = finite.length ? Math.max(...finite) : null;
        // At least 30 s wide, so a young chart is not a sliver at the edge.
        const span = Math.max(30, values.length);
        const off = span - values.length;
        const dx = HISTORY / Math.max(1, span - 1);
        const pts = [];
        values.forEach((v, i) => {
          if (v == null || !isFinite(v)) return;
          pts.push(((off + i) * dx).toFixed(1) + "," + (38 - (v / max) * 36).toFixed(2));
        });
        line.setAttribute("points", pts.join(" "));
        if (pts.length) {
          const first = pts[0].split(",")[0];
          const lastX = pts[pts.length - 1].split(",")[0];
          area.setAttribute("points", first + ",39 " + pts.join(" ") + " " + lastX + ",39");
        } else {
          area.setAttribute("points", "");
        }
        svg.setAttribute(
          "aria-label",
          title + " over the last " + values.length + " s: now " + num(last) + (unit ? " " + unit : "") + ", peak " + num(peak)
        );
      },
    };
  }

  function push(arr, v) {
    arr.push(v);
    if (arr.length > HISTORY) arr.shift();
  }

  // === rooms ===

  const ROOM_CHARTS = [
    ["queue_length", "In line", ""],
    ["joins_per_sec", "Joins", "/s"],
    ["admits_per_sec", "Admitted", "/s"],
    ["claimed_per_sec", "Claimed", "/s"],
    ["active_sessions", "Active sessions", ""],
    ["difficulty_bits", "PoW difficulty", "bits"],
  ];
  const FIELDS = ["rate_per_sec", "burst", "max_active", "difficulty_floor_bits", "difficulty_ceiling_bits"];

  function renderRooms(views, now) {
    for (const v of views) {
      let r = state.rooms.get(v.room);
      if (!r) r = addRoom(v);
      const dt = r.prevAt ? (now - r.prevAt) / 1000 : 0;
      const claimed = r.prev && dt > 0 ? Math.max(0, (v.claimed_total - r.prev.claimed_total) / dt) : null;
      r.prev = v;
      r.prevAt = now;
      r.view = v;
      const sample = Object.assign({}, v, { claimed_per_sec: claimed });
      for (const [key] of ROOM_CHARTS) push(r.hist[key], sample[key]);
      for (const [key] of ROOM_CHARTS) r.charts[key].update(r.hist[key]);
      showFacts(r, sample);
      fillForm(r);
    }
  }

  function addRoom(v) {
    const tpl = $("room-template").content.firstElementChild.cloneNode(true);
    const id = v.room;
    tpl.id = "room-" + id;
    tpl.dataset.room = id;
    const title = tpl.querySelector(".room-title");
    title.id = "room-" + id + "-title";
    title.textContent = "Room " + id;
    tpl.setAttribute("aria-labelledby", title.id);
    tpl.querySelectorAll("[data-v]").forEach((el) => (el.id = id + "-" + el.dataset.v));
    const form = tpl.querySelector("form");
    form.id = "controls-" + id;
    form.setAttribute("aria-label", "Settings of room " + id);
    FIELDS.forEach((f) => (form.elements[f].id = id + "-input-" + f));
    const charts = {};
    const box = tpl.querySelector(".charts");
    for (const [key, label, unit] of ROOM_CHARTS) charts[key] = chart(box, label, unit);
    const hist = {};
    for (const [key] of ROOM_CHARTS) hist[key] = [];
    const r = { id, el: tpl, form, charts, hist, view: v, prev: null, prevAt: 0 };
    form.addEventListener("input", (e) => markDirty(r, e.target));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      reviewChanges(r);
    });
    form.querySelector(".pause").addEventListener("click", () => reviewPause(r));
    form.querySelector(".revert").addEventListener("click", () => {
      FIELDS.forEach((f) => form.elements[f].classList.remove("dirty"));
      say(r, "", "");
      fillForm(r);
    });
    $("rooms").append(tpl);
    state.rooms.set(id, r);
    return r;
  }

  function showFacts(r, s) {
    const set = (k, text) => {
      const el = r.el.querySelector('[data-v="' + k + '"]');
      if (el) el.textContent = text;
    };
    set("state", s.state + (s.store_ok === false ? " · store down" : ""));
    const badge = r.el.querySelector(".badge");
    badge.className = "badge " + s.state;
    set("queue_length", num(s.queue_length));
    set("joins_per_sec", num(s.joins_per_sec));
    set("admits_per_sec", num(s.admits_per_sec));
    set("claimed_per_sec", num(s.claimed_per_sec));
    set("active_sessions", num(s.active_sessions) + (s.max_active != null ? " / " + num(s.max_active) : ""));
    set("rate_per_sec", num(s.rate_per_sec) + "/s");
    set("method", { fifo: "FIFO", queue_all: "queue all (no passthrough)", reject: "reject when full (no line)", random: "random draws" }[s.method] || "FIFO");
    // A random room's current draw, and whether its seed is out yet.
    const draw = r.el.querySelector(".draw");
    if (draw) {
      draw.hidden = s.method !== "random";
      set("draw", s.draw_index == null
        ? "none yet"
        : "#" + num(s.draw_index) + " · " + num(s.draw_tickets) + " drawn from seq " + num(s.draw_first_seq) +
          (s.prequeue_seed ? " · seed revealed" : " · seed secret until closed"));
    }
    set(
      "lanes",
      Array.isArray(s.lanes) && s.lanes.length
        ? (s.lane_mode === "strict" ? "strict: " : "") +
            s.lanes.map((l) => l.id + " " + l.weight + ": " + num(l.waiting) + " waiting, " + num(l.admitted_total) + " in").join(" · ")
        : "—"
    );
    set("difficulty", s.difficulty_bits + " bits × " + s.puzzles + (s.under_attack ? " (attack)" : ""));
    set("drain", s.paused ? "paused" : s.sold_out ? "sold out" : s.queue_length === 0 ? "—" : duration(s.queue_length / s.rate_per_sec));
    const a = s.adaptive || { enabled: false, mode: "off" };
    set(
      "adaptive",
      !a.enabled
        ? "off"
        : a.mode +
            (a.mode === "overridden" && a.override_remaining_secs != null ? " (" + duration(a.override_remaining_secs) + " left)" : "") +
            " · " + num(a.floor) + "–" + num(a.ceiling) + "/s" +
            (a.p99_ms != null ? " · p99 " + num(a.p99_ms) + " ms / " + num(a.latency_p99_objective_ms) + " ms" : "") +
            (a.error_ratio != null ? " · errors " + num(a.error_ratio * 100) + "%" : "")
    );
    set("adaptive_reason", a.enabled ? a.reason || "—" : "—");
    // A scheduled room: its opening, and the pre-queue draw.
    const sched = r.el.querySelector(".schedule");
    if (sched) {
      sched.hidden = !s.opens_at && (!s.prequeue_seed || s.method === "random");
      const when = s.opens_at ? new Date(s.opens_at).toLocaleString() : "";
      if (s.prequeue_open) {
        set("opens", when + " · " + num(s.prequeue_tickets) + " in the draw so far");
        set("drain", "opens " + when);
      } else if (s.prequeue_seed) {
        set("opens", (when ? "opened " + when + " · " : "") + "draw of " + num(s.prequeue_tickets));
      } else {
        set("opens", when);
      }
    }
    // Verified crawlers of the room (this gateway's count): passes, those
    // over their rate limit, requests that claimed to be one and were not.
    const crawl = r.el.querySelector(".crawlers");
    const c = s.crawlers;
    if (crawl) {
      const agents = (c && c.agents) || [];
      crawl.hidden = agents.length === 0;
      if (agents.length) {
        set(
          "crawlers",
          num(c.passed) + " passed · " + num(c.rate_limited) + " over their limit · " + num(c.refused) + " not verified" +
            " (" + agents.map((a) => a.name + " " + num(a.passed)).join(", ") + ")"
        );
      }
    }
    const pause = r.form.querySelector(".pause");
    pause.textContent = s.paused ? "Resume admission…" : "Pause admission…";
    pause.classList.toggle("resume", !!s.paused);
  }

  function showInvites(r, inv) {
    if (!r) return;
    const box = r.el.querySelector(".invites");
    box.hidden = false;
    r.el.querySelector('[data-v="invites"]').textContent =
      num(inv.issued) + " issued · " + num(inv.redeemed) + " redeemed · " + num(inv.revoked) + " revoked";
  }

  function viewValue(v, f) {
    const x = v[f];
    return x == null ? "" : String(x);
  }

  function fillForm(r) {
    for (const f of FIELDS) {
      const input = r.form.elements[f];
      if (input.classList.contains("dirty") || document.activeElement === input) continue;
      input.value = viewValue(r.view, f);
    }
  }

  function markDirty(r, input) {
    if (!FIELDS.includes(input.name)) return;
    input.classList.toggle("dirty", input.value !== viewValue(r.view, input.name));
  }

  function say(r, error, note) {
    r.form.querySelector(".error").textContent = error;
    r.form.querySelector(".note").textContent = note;
  }

  // The edited fields, parsed, or an error in plain words.
  function changes(r) {
    const out = {};
    for (const f of FIELDS) {
      const input = r.form.elements[f];
      const raw = input.value.trim();
      if (raw === viewValue(r.view, f)) continue;
      if (f === "max_active" && raw === "") {
        out[f] = null;
        continue;
      }
      const x = Number(raw);
      if (raw === "" || !isFinite(x)) return { error: LABELS[f] + " must be a number." };
      if (f !== "rate_per_sec" && f !== "burst" && !Number.isInteger(x)) return { error: LABELS[f] + " must be a whole number." };
      if (x < 0) return { error: LABELS[f] + " cannot be negative." };
      if (x === r.view[f]) continue;
      out[f] = x;
    }
    return { patch: out };
  }

  function reviewChanges(r) {
    const c = changes(r);
    if (c.error) {
      say(r, c.error, "");
      return;
    }
    const patch = c.patch;
    const keys = Object.keys(patch);
    if (!keys.length) {
      say(r, "", "Nothing to apply: no setting was changed.");
      return;
    }
    const list = document.createElement("ul");
    for (const k of keys) {
      const li = document.createElement("li");
      const before = r.view[k] == null ? "no cap" : num(r.view[k]);
      const after = patch[k] == null ? "no cap" : num(patch[k]);
      li.textContent = LABELS[k] + ": " + before + " → " + after + unitOf(k);
      list.append(li);
    }
    const sim = {};
    for (const k of ["rate_per_sec", "burst", "max_active"]) if (k in patch) sim[k] = patch[k] == null ? "" : patch[k];
    confirmChange(r, "Change room " + r.id + "?", list, patch, Object.keys(sim).length ? sim : null, keys.some((k) => k.startsWith("difficulty")));
  }

  function unitOf(k) {
    return k === "rate_per_sec" ? " visitors/s" : k.startsWith("difficulty") ? " bits" : "";
  }

  function reviewPause(r) {
    const pausing = !r.view.paused;
    const p = document.createElement("p");
    const n = plural(r.view.queue_length, "visitor", "visitors");
    p.textContent = pausing
      ? "Pause admission of room " + r.id + ": the line of " + n + " stops moving. Everyone keeps their place and new visitors can still join."
      : "Resume admission of room " + r.id + " at " + num(r.view.rate_per_sec) + " visitors/s.";
    confirmChange(r, pausing ? "Pause room " + r.id + "?" : "Resume room " + r.id + "?", p, { paused: pausing }, pausing ? null : {}, false);
  }

  // Shows the confirmation with the simulated effect; applies on "Apply".
  async function confirmChange(r, title, body, patch, sim, difficulty) {
    const dlg = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-body").replaceChildren(body);
    const effect = $("confirm-effect");
    const q = r.view.queue_length;
    if (sim) {
      const rate = "rate_per_sec" in sim ? sim.rate_per_sec : r.view.rate_per_sec;
      effect.textContent = estimate(r, q, rate) + " (estimating with the simulator…)";
      const qs = new URLSearchParams(sim).toString();
      api("GET", "/_sluice/admin/rooms/" + encodeURIComponent(r.id) + "/whatif" + (qs ? "?" + qs : ""))
        .then((w) => {
          if (dlg.open) effect.textContent = simulated(r, w);
        })
        .catch((e) => {
          if (e instanceof Unauthorized) return;
          if (dlg.open) effect.textContent = estimate(r, q, rate) + " (simulator unavailable: " + e.message + ")";
        });
    } else if (difficulty) {
      const floor = "difficulty_floor_bits" in patch ? patch.difficulty_floor_bits : r.view.difficulty_floor_bits;
      const ceil = "difficulty_ceiling_bits" in patch ? patch.difficulty_ceiling_bits : r.view.difficulty_ceiling_bits;
      effect.textContent =
        "New challenges will ask for " + floor + " to " + ceil + " bits (" + r.view.puzzles + " puzzles of about 2^bits hashes each); today " + r.view.difficulty_bits + " bits. Visitors already in line are not affected.";
    } else {
      effect.textContent = "";
    }
    dlg.returnValue = "";
    dlg.showModal();
    $("confirm-cancel").focus();
    const answer = await new Promise((resolve) => dlg.addEventListener("close", () => resolve(dlg.returnValue), { once: true }));
    if (answer !== "apply") {
      say(r, "", "Cancelled: nothing was changed.");
      return;
    }
    try {
      const after = await api("PATCH", "/_sluice/admin/rooms/" + encodeURIComponent(r.id), patch);
      r.view = after;
      FIELDS.forEach((f) => r.form.elements[f].classList.remove("dirty"));
      fillForm(r);
      showFacts(r, Object.assign({}, after, { claimed_per_sec: r.hist.claimed_per_sec[r.hist.claimed_per_sec.length - 1] }));
      say(r, "", "Applied at " + new Date().toLocaleTimeString() + ": " + describe(patch) + ".");
    } catch (e) {
      if (e instanceof Unauthorized) {
        refused(e);
        return;
      }
      say(r, e.message, "");
    }
  }

  function describe(patch) {
    return Object.keys(patch)
      .map((k) => (k === "paused" ? (patch[k] ? "paused" : "resumed") : LABELS[k].toLowerCase() + " " + (patch[k] == null ? "no cap" : num(patch[k])) + unitOf(k)))
      .join(", ");
  }

  function estimate(r, q, rate) {
    if (q === 0) return "Nobody is in line now.";
    if (!(rate > 0)) return "At rate 0 nobody is admitted: the line of " + plural(q, "visitor", "visitors") + " will not move.";
    return "The line of " + plural(q, "visitor", "visitors") + " drains in about " + duration(q / rate) + " at " + num(rate) + " visitors/s";
  }

  function simulated(r, w) {
    if (w.queue_length === 0) return "Nobody is in line now.";
    const who = "the line of " + plural(w.queue_length, "visitor", "visitors");
    const at = " at " + num(w.rate_per_sec) + " visitors/s" + (w.max_active != null ? ", at most " + num(w.max_active) + " active" : "");
    const paused = r.view.paused ? " once admission is resumed" : "";
    if (w.drain_seconds == null) return "Simulated: " + who + " does not drain within " + duration(w.horizon_seconds) + at + ".";
    return "Simulated: " + who + " drains in " + duration(w.drain_seconds) + at + paused + (w.scaled ? " (scaled from " + nf0.format(w.simulated_visitors) + " simulated)" : "") + ".";
  }

  // === origin (from /metrics) ===

  // Sums of the upstream histogram over status classes: {le -> count},
  // the 5xx count, and the upstream error counter.
  function parseMetrics(text) {
    const buckets = new Map();
    let fivexx = 0;
    let errors = 0;
    let count = 0;
    let seen = false;
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const [, name, labels, value] = m;
      const x = Number(value);
      if (!isFinite(x) && value !== "+Inf") continue;
      const label = (k) => {
        const lm = new RegExp("(?:^|,)" + k + '="([^"]*)"').exec(labels || "");
        return lm ? lm[1] : null;
      };
      if (name === "sluice_upstream_request_duration_seconds_bucket") {
        const le = label("le");
        const key = le === "+Inf" ? Infinity : Number(le);
        buckets.set(key, (buckets.get(key) || 0) + x);
        seen = true;
      } else if (name === "sluice_upstream_request_duration_seconds_count") {
        count += x;
        if (label("status_class") === "5xx") fivexx += x;
        seen = true;
      } else if (name === "sluice_upstream_errors_total") {
        errors += x;
      }
    }
    return { buckets, count, fivexx, errors, seen };
  }

  // The 99th percentile of the requests between two scrapes, interpolated
  // within its bucket as Prometheus' histogram_quantile does.
  function p99(prev, cur) {
    const les = [...cur.buckets.keys()].sort((a, b) => a - b);
    const delta = les.map((le) => Math.max(0, cur.buckets.get(le) - (prev.buckets.get(le) || 0)));
    const total = delta.length ? delta[delta.length - 1] : 0;
    if (!(total > 0)) return null;
    const rank = 0.99 * total;
    for (let i = 0; i < les.length; i++) {
      if (delta[i] >= rank) {
        const hi = les[i];
        const lo = i === 0 ? 0 : les[i - 1];
        if (hi === Infinity) return lo;
        const below = i === 0 ? 0 : delta[i - 1];
        const inBucket = delta[i] - below;
        return inBucket > 0 ? lo + ((hi - lo) * (rank - below)) / inBucket : hi;
      }
    }
    return null;
  }

  function renderOrigin(m, now) {
    const o = state.origin;
    if (!o.charts) {
      $("origin").hidden = false;
      const box = $("origin-charts");
      o.charts = {
        rps: chart(box, "Origin requests", "/s"),
        p99: chart(box, "Origin p99 latency", "ms"),
        err: chart(box, "Origin 5xx + failures", "/s", { bad: true }),
      };
    }
    if (o.prev) {
      const dt = (now - o.prevAt) / 1000;
      if (dt > 0) {
        push(o.hist.rps, Math.max(0, (m.count - o.prev.count) / dt));
        const q = p99(o.prev, m);
        push(o.hist.p99, q == null ? null : q * 1000);
        push(o.hist.err, Math.max(0, (m.fivexx - o.prev.fivexx + m.errors - o.prev.errors) / dt));
      }
    }
    o.prev = m;
    o.prevAt = now;
    o.charts.rps.update(o.hist.rps);
    o.charts.p99.update(o.hist.p99);
    o.charts.err.update(o.hist.err);
  }

  // === events ===

  // Rows are updated in place (not rebuilt) so focus, selection and
  // assistive technology keep their place between polls.
  function renderEvents(events) {
    $("events").hidden = events.length === 0;
    const body = $("events-body");
    const keep = new Set();
    for (const e of events) {
      const rowId = "ev-" + e.event;
      keep.add(rowId);
      let tr = $(rowId);
      if (!tr) {
        tr = document.createElement("tr");
        tr.id = rowId;
        for (const key of ["event", "room", "total", "available", "held", "confirmed", "invariant", "ledger"]) {
          const td = document.createElement(key === "event" ? "th" : "td");
          if (key === "event") td.scope = "row";
          td.id = rowId + "-" + key;
          tr.append(td);
        }
        body.append(tr);
      }
      const set = (key, text, cls) => {
        const td = $(rowId + "-" + key);
        if (td.textContent !== text) td.textContent = text;
        td.className = cls || "";
      };
      const ready = e.ready !== false;
      set("event", e.event);
      set("room", e.room || "");
      set("total", ready ? num(e.total) : "—");
      set("available", ready ? num(e.available) : "not loaded", ready ? "" : "bad");
      set("held", ready ? num(e.held) : "—");
      set("confirmed", ready ? num(e.confirmed) : "—");
      set("invariant", !ready ? "—" : e.invariant_holds ? "holds" : "BROKEN", !ready ? "" : e.invariant_holds ? "ok" : "bad");
      // The ledger's lag on the event's stream (with Redis): entries not
      // yet in PostgreSQL and the age of the oldest.
      const l = e.ledger;
      const lag = !l ? "—" : !l.read ? "no ledger" : num(l.lag_entries) + " behind, " + l.lag_seconds.toFixed(1) + " s";
      set("ledger", l && l.behind ? lag + " (BEHIND)" : lag, l && l.behind ? "bad" : "");
    }
    for (const tr of [...body.children]) if (!keep.has(tr.id)) tr.remove();
  }

  // === start ===

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", onLogin);
    $("logout").addEventListener("click", () => askToken("Token forgotten."));
    setInterval(tickFreshness, 250);
    if (document.body.dataset.adminToken === "none") {
      readOnly();
    } else if (state.token) {
      $("logout").hidden = false;
      start();
    } else {
      askToken("");
    }
  });
})();
