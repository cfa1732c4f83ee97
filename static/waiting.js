// The waiting-room page: fetch a challenge, solve it in Web Workers
// (pow-solver.js), join, then hear the status pushed as server-sent events
// (one EventSource per tab) or, where a stream cannot be had (no
// EventSource, refused, or a proxy that buffers it: nothing heard within
// STREAM_SILENCE_MS), poll it at the pace the server asks; and go back to
// the page the visitor wanted the moment it is admitted.
// Reloading or a second tab keeps the place: the queue token lives in an
// HttpOnly cookie that the status call sends by itself. Before a scheduled
// room opens (`prequeue: true`), it shows the opening time in the visitor's
// local time and a countdown: everyone who arrives before then gets a place
// in a random draw.
// A room that is by invitation, or for the shop's signed-in customers,
// takes an invite code and an enqueue token from the URL's fragment
// (`#sluice_invite=CODE`, `#sluice_enqueue=JWT`, docs/waiting-page.md): a
// fragment is never sent to a server nor logged by a proxy. The page takes
// them out of the address bar at once, keeps them in this tab only
// (sessionStorage, per room) until it is admitted, and asks for a code in
// a small form when the room refuses the one it has.
(function () {
  'use strict';
  // Longest code and token the gateway takes (API.md); a token is a JWT.
  var MAX_INVITE = 128, MAX_TOKEN = 4096;
  function decode(v) {
    try { return decodeURIComponent(v.replace(/\+/g, ' ')); } catch (e) { return null; }
  }
  // Splits a fragment (`#a&sluice_invite=X&b`) into the code and token it
  // carries and the rest, kept as it was (`a&b`). A value out of bounds
  // is dropped all the same: it never stays in the address bar.
  function takeFragment(hash) {
    var out = { invite: null, enqueue: null, rest: '', found: false };
    var kept = [];
    String(hash || '').replace(/^#/, '').split('&').forEach(function (part) {
      if (!part) return;
      var eq = part.indexOf('=');
      var key = eq < 0 ? part : part.slice(0, eq);
      if (key !== 'sluice_invite' && key !== 'sluice_enqueue') { kept.push(part); return; }
      out.found = true;
      var v = decode(eq < 0 ? '' : part.slice(eq + 1));
      v = v === null ? '' : v.trim();
      if (key === 'sluice_invite' && v && v.length <= MAX_INVITE) out.invite = v;
      if (key === 'sluice_enqueue' && v.length <= MAX_TOKEN && /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/.test(v)) out.enqueue = v;
    });
    out.rest = kept.join('&');
    return out;
  }
  // What the page says when the room refuses a code, by the refusal's
  // `reason` (API.md, invite_invalid).
  function inviteText(reason) {
    if (reason === 'required') return 'invite_required';
    if (reason === 'exhausted' || reason === 'revoked' || reason === 'expired') return 'invite_used';
    return 'invite_unknown';
  }
  // The words for a waiting status: the text's key and its values. A
  // random room's visitor not yet drawn has no place to tell, only the
  // draw (its position is the expected one).
  function waitingText(s) {
    if (s.awaiting_draw === true) return ['draw_waiting', {}];
    if (s.position <= 1) return ['next', {}];
    return ['waiting', { position: s.position.toLocaleString() }];
  }
  if (typeof module !== 'undefined' && module.exports) {
    module.exports = { takeFragment: takeFragment, inviteText: inviteText, waitingText: waitingText };
    return;
  }

  var root = document.getElementById('sluice');
  if (!root) return;
  var room = root.getAttribute('data-room');
  var fallbackReturn = root.getAttribute('data-return-to') || '/';
  var T = {};
  try { T = JSON.parse(document.getElementById('sluice-texts').textContent); } catch (e) { T = {}; }
  var base = '/_sluice/rooms/' + encodeURIComponent(room);
  var stateEl = document.getElementById('state');
  var positionEl = document.getElementById('position');
  var aheadEl = document.getElementById('ahead');
  // the label beside "ahead" says "in the draw so far" before the opening
  var aheadLabel = aheadEl && aheadEl.previousElementSibling;
  var aheadText = aheadLabel ? aheadLabel.textContent : '';
  var leadEl = document.querySelector('#sluice .lead');
  var leadText = leadEl ? leadEl.textContent : '';
  var etaEl = document.getElementById('eta');
  var bar = document.querySelector('.bar');
  var fill = document.getElementById('bar-fill');
  var startPosition = null;   // the position at joining: the bar's zero
  var startKey = null;
  var errorDelay = 1000;
  var polling = false;
  var lastAnnounced = '';
  var countdown = null;       // the pre-queue's countdown timer
  var opensAtMs = null;       // the opening, on this browser's clock
  // The status stream: open while it carries the status; `streamOff` once
  // it failed (the page polls for good).
  var STREAM_SILENCE_MS = 6000;
  var stream = null;
  var streamOff = typeof window.EventSource !== 'function' || root.getAttribute('data-stream') === 'off';
  if (streamOff) root.setAttribute('data-transport', 'poll');

  // The invite code and enqueue token of this tab for this room: from the
  // fragment (taken out of the address bar at once), else kept from an
  // earlier load of this tab.
  var INVITE_KEY = 'sluice-invite:' + room, TOKEN_KEY = 'sluice-enqueue:' + room;
  function stored(key) { try { return sessionStorage.getItem(key); } catch (e) { return null; } }
  function store(key, v) {
    try { if (v) sessionStorage.setItem(key, v); else sessionStorage.removeItem(key); } catch (e) { /* storage off */ }
  }
  var invite = stored(INVITE_KEY);
  var enqueueToken = stored(TOKEN_KEY);
  // The gateway says when the room takes only visitors signed in at the
  // shop: the page then asks for no work it could not use.
  var enqueueRequired = root.getAttribute('data-enqueue') === 'required';
  // the shop's sign-in page (the operator's `sign_in_url`), if any
  var signInUrl = root.getAttribute('data-sign-in') || '';
  function takeCredentials() {
    var f = takeFragment(window.location.hash);
    if (!f.found) return false;
    var clean = window.location.pathname + window.location.search + (f.rest ? '#' + f.rest : '');
    try { window.history.replaceState(window.history.state, '', clean); } catch (e) { window.location.hash = f.rest; }
    if (f.invite) { invite = f.invite; store(INVITE_KEY, invite); }
    if (f.enqueue) { enqueueToken = f.enqueue; store(TOKEN_KEY, enqueueToken); }
    return !!(f.invite || f.enqueue);
  }
  takeCredentials();

  function t(key, vars) {
    var s = T[key] || key;
    if (vars) Object.keys(vars).forEach(function (k) { s = s.split('{' + k + '}').join(String(vars[k])); });
    return s;
  }
  // While a scheduled wave is pending (the status answer's
  // next_wave_at_ms), every message says when more goes on sale.
  var waveNote = '';
  function say(text) {
    text = waveNote ? text + ' ' + waveNote : text;
    if (text !== lastAnnounced) { stateEl.textContent = text; lastAnnounced = text; }
  }
  // The bar: the first tenth while the browser solves the challenge, the
  // rest as the line moves from the position at joining to the front, so
  // it never moves backwards.
  var SOLVE_SHARE = 0.1;
  function setProgress(fraction) {
    var pct = Math.max(0, Math.min(100, Math.round(fraction * 100)));
    fill.style.width = pct + '%';
    bar.setAttribute('aria-valuenow', String(pct));
  }
  // Same-origin paths only: anything else goes to "/".
  function safePath(p) {
    if (typeof p !== 'string' || p.charAt(0) !== '/' || p.charAt(1) === '/' || p.indexOf('\\') >= 0) return '/';
    return p;
  }
  function etaRange(seconds) {
    if (seconds == null) return '–';
    if (seconds < 60) return t('eta_under_minute');
    var lo = Math.max(1, Math.floor(seconds * 0.8 / 60));
    var hi = Math.max(lo + 1, Math.ceil(seconds * 1.25 / 60));
    if (hi >= 120) return t('eta_hours', { lo: Math.floor(lo / 60), hi: Math.ceil(hi / 60) });
    return t('eta_minutes', { lo: lo, hi: hi });
  }
  function two(n) { return (n < 10 ? '0' : '') + n; }
  // "2:05:09", "5:09": time left before the opening.
  function clock(ms) {
    var s = Math.max(0, Math.ceil(ms / 1000));
    var h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
    return (h > 0 ? h + ':' + two(m) : String(m)) + ':' + two(s % 60);
  }
  // The opening in the visitor's local time: the time only when it is
  // today, else with the day.
  function localTime(iso) {
    var d = new Date(iso);
    if (isNaN(d.getTime())) return iso;
    var lang = T.lang || undefined;
    var opts = { hour: '2-digit', minute: '2-digit' };
    if (d.toDateString() !== new Date().toDateString()) {
      opts.weekday = 'short'; opts.day = 'numeric'; opts.month = 'short';
    }
    try { return d.toLocaleString(lang, opts); } catch (e) { return d.toLocaleString(); }
  }
  function tickCountdown() {
    var left = opensAtMs - Date.now();
    etaEl.textContent = left > 0 ? t('prequeue_countdown', { countdown: clock(left) }) : t('prequeue_opening');
  }
  function stopCountdown() {
    if (countdown !== null) { clearInterval(countdown); countdown = null; }
    if (aheadLabel) aheadLabel.textContent = aheadText;
    if (leadEl) leadEl.textContent = leadText;
  }
  // Before the opening: no place yet, only the draw. The countdown runs on
  // the server's figure (eta_seconds), not this browser's clock.
  function showPrequeue(s) {
    if (typeof s.eta_seconds === 'number') opensAtMs = Date.now() + s.eta_seconds * 1000;
    say(t('prequeue', { time: localTime(s.opens_at) }));
    positionEl.textContent = t('prequeue_position');
    aheadEl.textContent = typeof s.prequeue_tickets === 'number' ? s.prequeue_tickets.toLocaleString() : '–';
    if (aheadLabel) aheadLabel.textContent = t('prequeue_tickets_label');
    if (leadEl) leadEl.textContent = t('prequeue_lead');
    setProgress(SOLVE_SHARE);
    if (opensAtMs !== null) {
      tickCountdown();
      if (countdown === null) countdown = setInterval(tickCountdown, 1000);
    }
  }

  function jitter(ms) { return Math.round(ms * (0.85 + Math.random() * 0.3)); }

  function request(method, url, body) {
    var opts = { method: method, credentials: 'same-origin', headers: { 'accept': 'application/json' } };
    if (body !== undefined) { opts.headers['content-type'] = 'application/json'; opts.body = JSON.stringify(body); }
    return fetch(url, opts).then(function (res) {
      return res.json().catch(function () { return {}; }).then(function (json) { return { status: res.status, body: json, res: res }; });
    });
  }

  function admitted(s) {
    // In: the code and the token have done their work.
    store(INVITE_KEY, null);
    store(TOKEN_KEY, null);
    say(t('admitted'));
    setProgress(1);
    window.location.replace(safePath(s.return_to || fallbackReturn));
  }

  // The position at joining survives a reload (per room and seq), so the
  // bar does not start again from zero.
  function rememberStart(s) {
    if (startKey === null && typeof s.seq === 'number') {
      startKey = 'sluice-start:' + room + ':' + s.seq;
      try { var kept = Number(sessionStorage.getItem(startKey)); if (kept > 0) startPosition = kept; } catch (e) { /* storage off */ }
    }
    if (startPosition === null || s.position > startPosition) {
      startPosition = s.position;
      try { if (startKey) sessionStorage.setItem(startKey, String(startPosition)); } catch (e) { /* storage off */ }
    }
  }

  function show(s) {
    root.classList.remove('working');
    if (s.state === 'waiting' && s.prequeue === true) {
      showPrequeue(s);
      return schedule(s.poll_after_ms || 5000);
    }
    stopCountdown();
    waveNote = typeof s.next_wave_at_ms === 'number' && s.state !== 'closed'
      ? t('next_wave', { time: localTime(s.next_wave_at_ms) }) : '';
    if (s.state === 'admitted') return admitted(s);
    if (typeof s.position === 'number') {
      rememberStart(s);
      positionEl.textContent = s.position.toLocaleString();
      aheadEl.textContent = Math.max(0, s.position - 1).toLocaleString();
      var moved = startPosition > 1 ? (startPosition - s.position) / (startPosition - 1) : 0.95;
      setProgress(SOLVE_SHARE + (1 - SOLVE_SHARE) * moved);
    }
    if (s.state === 'waiting') {
      etaEl.textContent = etaRange(s.eta_seconds);
      var words = waitingText(s);
      say(t(words[0], words[1]));
    } else if (s.state === 'paused') {
      say(t('paused')); etaEl.textContent = '–';
    } else if (s.state === 'sold_out') {
      say(t(s.stock_may_return ? 'sold_out_for_now' : 'sold_out')); etaEl.textContent = '–';
    } else if (s.state === 'closed') {
      say(t('closed')); etaEl.textContent = '–';
    }
    schedule(s.poll_after_ms || 5000);
  }

  function schedule(ms) {
    if (openStream()) return; // pushed from now on
    setTimeout(poll, jitter(ms));
  }

  // Opens the status stream, once; false when the page must poll.
  function openStream() {
    if (streamOff) return false;
    if (stream) return true;
    var es;
    try { es = new EventSource(base + '/status', { withCredentials: true }); } catch (e) { streamOff = true; return false; }
    stream = es;
    root.setAttribute('data-transport', 'stream');
    var heard = false;
    // A proxy buffering the stream delivers nothing: poll instead.
    var silence = setTimeout(function () { if (!heard) fallBack(); }, STREAM_SILENCE_MS);
    es.addEventListener('status', function (ev) {
      heard = true;
      clearTimeout(silence);
      var s;
      try { s = JSON.parse(ev.data); } catch (e) { return; }
      errorDelay = 1000;
      if (s.state === 'admitted' || s.state === 'sold_out' || s.state === 'closed') {
        // The stream ends here. Admitted: one poll sets the admission
        // cookie (the same session); otherwise polls take over until the
        // line moves again.
        closeStream();
        if (s.state === 'admitted') return poll();
      }
      show(s);
    });
    // The server's last word (the token expired or its place is spent):
    // the poll says what to do.
    es.addEventListener('end', function () { closeStream(); poll(); });
    es.addEventListener('error', function () {
      // EventSource reconnects by itself (with Last-Event-ID); once it
      // gives up (a refusal, a 204 after an admission) the page polls.
      if (es.readyState === 2 && stream === es) {
        clearTimeout(silence);
        stream = null;
        streamOff = !heard;
        root.setAttribute('data-transport', 'poll');
        poll();
      } else if (!heard) {
        say(t('reconnecting'));
      }
    });
    return true;
  }
  function closeStream() {
    if (stream) { stream.close(); stream = null; }
  }
  function fallBack() {
    closeStream();
    streamOff = true;
    root.setAttribute('data-transport', 'poll');
    poll();
  }

  function poll() {
    if (polling) return; // never more than one poll in flight
    polling = true;
    request('GET', base + '/status').then(function (r) {
      polling = false;
      if (r.status === 200) { errorDelay = 1000; return show(r.body); }
      if (r.status === 401) return join();
      throw new Error('status ' + r.status);
    }).catch(function () {
      polling = false;
      say(t('reconnecting'));
      errorDelay = Math.min(errorDelay * 2, 30000);
      schedule(errorDelay);
    });
  }

  // A room of the `reject` method keeps no line: when it is full it says
  // so at once (503 room_full, before any work) and the page tries again
  // when the gateway says a place may be free.
  function isFull(r) {
    return r.status === 503 && r.body && r.body.code === 'room_full';
  }
  function roomFull(r) {
    root.classList.remove('working');
    root.setAttribute('data-state', 'full');
    say(t('full'));
    var wait = Number(r.res && r.res.headers.get('retry-after')) * 1000 || 5000;
    setTimeout(join, jitter(Math.max(wait, 1000)));
  }

  // The refusals that no retry can mend: a code the room does not take,
  // a visitor not signed in at the shop.
  function refusal(r) {
    var code = r.body && r.body.code;
    if (r.status === 403 && code === 'invite_invalid') return 'invite';
    if (r.status === 403 && code === 'enqueue_token_required') return 'sign_in';
    if (r.status === 401 && code === 'enqueue_token_invalid') return 'sign_in_again';
    return null;
  }
  function refused(r, why) {
    if (why === 'invite') return askInvite(r.body.reason);
    return needSignIn(why === 'sign_in_again');
  }

  // The form of an invite-only room: made here, so an operator's template
  // needs nothing for it; shown when the room refuses the code the page
  // has (or has none). No work is asked for until a code is accepted.
  var inviteForm = null, inviteInput = null, inviteMsg = null, inviteBtn = null;
  function place(el) {
    var card = root.querySelector('.card');
    if (card && card.parentNode) card.parentNode.insertBefore(el, card.nextSibling);
    else root.appendChild(el);
  }
  function buildInviteForm() {
    inviteForm = document.createElement('form');
    inviteForm.id = 'sluice-invite';
    inviteForm.className = 'card invite';
    inviteForm.noValidate = true;
    var label = document.createElement('label');
    label.htmlFor = 'sluice-invite-code';
    label.textContent = t('invite_label');
    inviteInput = document.createElement('input');
    inviteInput.id = 'sluice-invite-code';
    inviteInput.name = 'invite';
    inviteInput.type = 'text';
    inviteInput.maxLength = MAX_INVITE;
    inviteInput.autocomplete = 'off';
    inviteInput.setAttribute('autocapitalize', 'none');
    inviteInput.spellcheck = false;
    inviteInput.setAttribute('aria-describedby', 'sluice-invite-msg');
    inviteMsg = document.createElement('p');
    inviteMsg.id = 'sluice-invite-msg';
    inviteMsg.setAttribute('aria-live', 'polite');
    inviteBtn = document.createElement('button');
    inviteBtn.type = 'submit';
    inviteBtn.textContent = t('invite_submit');
    [label, inviteInput, inviteMsg, inviteBtn].forEach(function (el) { inviteForm.appendChild(el); });
    inviteForm.addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (inviteBtn.disabled) return;
      var typed = inviteInput.value.trim();
      if (!typed) { inviteMsg.textContent = t('invite_required'); inviteInput.focus(); return; }
      invite = typed;
      inviteBtn.disabled = true;
      inviteInput.removeAttribute('aria-invalid');
      inviteMsg.textContent = t('invite_checking');
      join();
    });
    place(inviteForm);
  }
  function askInvite(reason) {
    root.classList.remove('working');
    root.setAttribute('data-state', 'invite');
    if (leadEl) leadEl.textContent = t('invite_lead');
    setProgress(0);
    invite = null;
    store(INVITE_KEY, null);
    if (!inviteForm) buildInviteForm();
    inviteForm.hidden = false;
    inviteForm.setAttribute('data-reason', String(reason || ''));
    inviteBtn.disabled = false;
    say(t('invite_prompt'));
    inviteMsg.textContent = t(inviteText(reason));
    if (reason !== 'required') inviteInput.setAttribute('aria-invalid', 'true');
    inviteInput.focus();
    if (inviteInput.value) inviteInput.select();
  }
  // A code accepted: the form goes, the code is kept for this tab.
  function inviteAccepted() {
    if (invite) store(INVITE_KEY, invite);
    if (inviteForm) inviteForm.hidden = true;
    if (leadEl) leadEl.textContent = leadText;
  }

  // A room for the shop's signed-in customers, and no (valid) token: say
  // so, with the way back to the page the visitor wanted; nothing retried.
  var signIn = null;
  function needSignIn(again) {
    root.classList.remove('working');
    root.setAttribute('data-state', 'sign-in');
    if (leadEl) leadEl.textContent = t('sign_in_lead');
    setProgress(0);
    if (again) { enqueueToken = null; store(TOKEN_KEY, null); }
    say(t(again ? 'enqueue_invalid' : 'enqueue_required'));
    if (!signIn) {
      signIn = document.createElement('p');
      signIn.id = 'sluice-sign-in';
      signIn.className = 'notice';
      var a = document.createElement('a');
      // the operator's sign-in page (checked by the gateway's config:
      // https or a path of this site), else back to the page asked for
      a.href = signInUrl || safePath(fallbackReturn);
      a.textContent = t(signInUrl ? 'enqueue_sign_in_link' : 'enqueue_link');
      signIn.appendChild(a);
      place(signIn);
    }
    signIn.hidden = false;
  }

  // A code or token that arrives later in the fragment (a link opened in
  // this tab) is taken at once, and the page tries again if it was stuck.
  window.addEventListener('hashchange', function () {
    if (!takeCredentials()) return;
    var stuck = root.getAttribute('data-state');
    if (stuck !== 'invite' && stuck !== 'sign-in') return;
    if (signIn) signIn.hidden = true;
    if (inviteForm) inviteForm.hidden = true;
    if (leadEl) leadEl.textContent = leadText;
    root.removeAttribute('data-state');
    join();
  });

  function join() {
    if (enqueueRequired && !enqueueToken) return needSignIn(false);
    say(t('preparing'));
    request('POST', base + '/challenge', invite ? { invite: invite } : {}).then(function (r) {
      if (isFull(r)) return roomFull(r);
      var why = refusal(r);
      if (why) return refused(r, why);
      if (r.status !== 200) throw r;
      inviteAccepted();
      root.removeAttribute('data-state');
      say(t('solving'));
      root.classList.add('working');
      var received = Date.now();
      return window.SluicePow.solveChallenge(r.body, {
        workerUrl: root.getAttribute('data-worker-url') || '/_sluice/static/pow-worker.js',
        onProgress: function (p) {
          setProgress(SOLVE_SHARE * p.fraction);
          say(t('solving_progress', { done: p.solved, total: p.total }));
        }
      }).then(function (solutions) {
        // Under attack the gateway refuses proofs submitted sooner than
        // min_solve_ms after the challenge was issued: a fast device waits
        // out the rest (plus a margin for the trip) instead of being
        // refused and starting over, forever.
        var rest = minSolveWait(r.body.min_solve_ms, received, Date.now());
        return new Promise(function (ok) { setTimeout(ok, rest); })
          .then(function () { return submit(r.body.challenge, solutions, 0); });
      });
    }).catch(function (err) {
      root.classList.remove('working');
      var wait = (err && err.res && Number(err.res.headers.get('retry-after'))) * 1000 || errorDelay;
      errorDelay = Math.min(errorDelay * 2, 30000);
      if (err && err.status === 429 && root.getAttribute('data-state') === 'invite') {
        // Too many codes tried from this network: the same code, later.
        inviteMsg.textContent = t('invite_wait', { seconds: Math.ceil(wait / 1000) });
      } else {
        say(t('reconnecting'));
      }
      setTimeout(join, jitter(wait));
    });
  }

  // Milliseconds still to wait before submitting a proof solved at `now`
  // for a challenge received at `received`.
  function minSolveWait(minSolveMs, received, now) {
    var min = Number(minSolveMs) || 0;
    if (min <= 0) return 0;
    return Math.max(0, received + min + 250 - now);
  }

  // The same solution is resubmitted after a network error: it is only
  // consumed when the gateway accepts it.
  function submit(challenge, solutions, attempt) {
    var body = { challenge: challenge, solutions: solutions, return_to: fallbackReturn };
    if (invite) body.invite = invite;
    if (enqueueToken) body.enqueue_token = enqueueToken;
    return request('POST', base + '/join', body).then(function (r) {
      if (r.status === 200 || r.status === 201) { errorDelay = 1000; return show(r.body); }
      if (r.status === 423) { say(t('closed')); return; }
      if (isFull(r)) return roomFull(r);
      var why = refusal(r);
      if (why) return refused(r, why);
      // After a network error the first submission may still be on its way
      // (the gateway has not yet noted the place it bought): a little later
      // the same solution gets that place back.
      if (r.status === 409 && attempt > 0 && attempt <= 8) return retry();
      throw r;
    }, function () {
      if (attempt > 8) throw new Error('network');
      return retry();
    });
    function retry() {
      return new Promise(function (ok) { setTimeout(ok, jitter(Math.min(1000 * Math.pow(2, attempt), 15000))); })
        .then(function () { return submit(challenge, solutions, attempt + 1); });
    }
  }

  poll();
})();
