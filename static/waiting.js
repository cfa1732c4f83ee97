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
(function () {
  'use strict';
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
      say(s.position <= 1 ? t('next') : t('waiting', { position: s.position.toLocaleString() }));
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

  function join() {
    say(t('preparing'));
    request('POST', base + '/challenge', {}).then(function (r) {
      if (isFull(r)) return roomFull(r);
      if (r.status !== 200) throw r;
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
      say(t('reconnecting'));
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
    return request('POST', base + '/join', {
      challenge: challenge, solutions: solutions, return_to: fallbackReturn
    }).then(function (r) {
      if (r.status === 200 || r.status === 201) { errorDelay = 1000; return show(r.body); }
      if (r.status === 423) { say(t('closed')); return; }
      if (isFull(r)) return roomFull(r);
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
