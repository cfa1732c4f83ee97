// The demo shop's front page: the control that sends the crowd through the
// gateway, and a live panel of the line it makes. The crowd's own figures
// come from the shop (GET /demo/crowd/status, never queued in the embedded
// demo's room); the line's from the gateway's public room state
// (GET /_sluice/rooms/{room}, API.md), which anyone may read. Pressing the
// control gives this browser's admission back (the shop answers with
// Sluice-Command: revoke), so once the line has formed the next page it
// opens puts it in line with the fans. Nothing here opens a guarded page
// by itself: a request before the line forms would pass straight through.
(function () {
  'use strict';
  var root = document.getElementById('crowd');
  if (!root) return;
  var room = root.getAttribute('data-room') || 'default';
  var $ = function (id) { return document.getElementById(id); };
  var startBtn = $('crowd-start'), live = $('crowd-live'), msg = $('crowd-message');
  var joinBox = $('crowd-join-box');
  // A line this long is worth joining: the newcomer waits a few seconds
  // behind it at the demo room's rate.
  var JOIN_AT = 40;
  var timer = null;
  var pressed = false;       // this page started or joined a crowd
  var formed = false;        // the line got long enough to join once
  var seenRunning = false;

  var nf = new Intl.NumberFormat('en');
  function set(id, v) { var e = $(id); if (e.textContent !== v) e.textContent = v; }
  function say(text) { if (msg.textContent !== text) msg.textContent = text; }

  function getJson(url) {
    return fetch(url, { credentials: 'same-origin', cache: 'no-store', headers: { accept: 'application/json' } })
      .then(function (res) {
        return res.json().catch(function () { return {}; }).then(function (body) {
          return { status: res.status, body: body };
        });
      });
  }

  function show(crowd, line) {
    var q = line ? line.queue_length : 0;
    var running = !!(crowd && crowd.running);
    var arrived = crowd ? crowd.arrived : 0;
    if (running) seenRunning = true;
    if (q >= JOIN_AT) formed = true;
    live.hidden = !(pressed || running || q > 0 || arrived > 0);
    if (crowd) {
      set('crowd-joined', nf.format(crowd.joined) + '/' + nf.format(crowd.visitors));
      set('crowd-admitted', nf.format(crowd.admitted));
    }
    if (line) {
      set('crowd-queue', nf.format(q));
      set('crowd-rate', nf.format(line.rate_per_sec) + '/s');
    }
    var joinable = pressed && formed && q > 0;
    joinBox.hidden = !joinable;
    if (joinable) {
      say('A line of ' + nf.format(q) + ' has formed. You gave your own pass back: open the shop in a new tab now and you wait in line with the fans (about ' +
        nf.format(line.eta_seconds_for_new_visitor) + ' s).');
    } else if (running && !formed) {
      say('The fans are arriving: each solves its proof of work and joins. The line forms…');
    } else if (q > 0) {
      say('A line of ' + nf.format(q) + ' is moving at ' + nf.format(line.rate_per_sec) + ' visitors/s.');
    } else if (running) {
      say('The line is empty: the last fans are being let in.');
    } else if (crowd && (seenRunning || arrived > 0)) {
      say('The line has drained: ' + nf.format(crowd.admitted) + ' of the ' + nf.format(crowd.visitors) + ' fans were let in. Send them again whenever you like.');
    }
    return running || q > 0;
  }

  function poll() {
    clearTimeout(timer);
    Promise.all([
      getJson('/demo/crowd/status').then(function (r) { return r.status === 200 ? r.body.crowd : null; }),
      getJson('/_sluice/rooms/' + encodeURIComponent(room)).then(function (r) { return r.status === 200 ? r.body : null; }),
    ]).then(function (got) {
      var busy = show(got[0], got[1]);
      startBtn.disabled = !!(got[0] && got[0].running);
      timer = setTimeout(poll, busy ? 1000 : 5000);
    }).catch(function () {
      say('The gateway did not answer; trying again.');
      timer = setTimeout(poll, 2000);
    });
  }

  startBtn.addEventListener('click', function () {
    startBtn.disabled = true;
    fetch('/demo/crowd', {
      method: 'POST',
      credentials: 'same-origin',
      headers: { accept: 'application/json', 'x-demo-crowd': 'start' },
    }).then(function (res) {
      return res.json().catch(function () { return {}; }).then(function (body) {
        if (res.status === 202 || res.status === 200) {
          pressed = true;
          formed = false;
          say(res.status === 202 ? nf.format(body.crowd.visitors) + ' fans are on their way.' :
            'A crowd is already on its way: nothing more was sent.');
          poll();
        } else if (body.code === 'waiting_room_active') {
          // this browser is no longer admitted (it pressed before, in
          // another tab): it is already set to queue
          pressed = true;
          say('You are not past the waiting room any more: open the shop to take your place in line.');
          poll();
        } else {
          startBtn.disabled = false;
          say(body.error || body.title || ('The shop answered ' + res.status + '.'));
        }
      });
    }).catch(function () {
      startBtn.disabled = false;
      say('The shop did not answer. Try again.');
    });
  });

  poll();
})();
