// The demo shop's event page. It talks to the gateway's public
// reservation API (API.md) from the browser, same origin, with the
// admission cookie the gateway set: live availability, a hold with an
// Idempotency-Key, a countdown to the hold's expiry, release, pay. An event
// with categories gets a quantity per category, held in one request.
(function () {
  'use strict';
  var root = document.getElementById('shop');
  if (!root) return;
  var event = root.getAttribute('data-event');
  var api = '/_sluice/events/' + encodeURIComponent(event);
  var $ = function (id) { return document.getElementById(id); };
  var availableEl = $('available'), totalEl = $('of-total'), fill = $('meter-fill');
  var waveEl = $('next-wave');
  var qtyEl = $('qty'), form = $('hold-form'), holdBtn = $('hold-btn');
  var holdBox = $('hold'), buyBox = $('buy'), countdownEl = $('countdown');
  var holdQtyEl = $('hold-qty'), payLink = $('pay'), releaseBtn = $('release'), msg = $('message');
  var singleEl = $('single'), tiersEl = $('tiers'), holdItemsEl = $('hold-items');
  var tiers = [];            // the event's categories, when it has any
  var storeKey = 'sluice-demo-hold:' + event;
  var hold = null;           // {hold_id, qty, deadline (performance.now() ms)}
  var ticking = null;
  var refreshing = false;
  var pendingKey = null;     // the Idempotency-Key of a hold attempt not yet answered

  function say(text) { msg.textContent = text; }

  function call(method, url, body, headers) {
    var opts = { method: method, credentials: 'same-origin', headers: { accept: 'application/json' } };
    Object.keys(headers || {}).forEach(function (k) { opts.headers[k] = headers[k]; });
    if (body !== undefined) { opts.headers['content-type'] = 'application/json'; opts.body = JSON.stringify(body); }
    return fetch(url, opts).then(function (res) {
      return res.json().catch(function () { return {}; }).then(function (json) {
        return { status: res.status, body: json, date: res.headers.get('date') };
      });
    });
  }

  function notAdmitted() {
    say('Your session in the shop ended. Reload the page to get back in line.');
  }

  function itemsText(items) {
    return (items || []).map(function (i) { return i.category + ' × ' + i.qty; }).join(', ');
  }

  // One row per category: what is left and a quantity (0 to what the
  // category and the cart limit allow).
  function showTiers(e) {
    tiers = e.categories || [];
    singleEl.hidden = tiers.length > 0;
    tiersEl.hidden = tiers.length === 0;
    var body = tiersEl.tBodies[0];
    tiers.forEach(function (c, n) {
      var row = body.rows[n];
      if (!row || row.getAttribute('data-category') !== c.id) {
        body.textContent = '';
        tiers.forEach(function (t) {
          var r = body.insertRow();
          r.setAttribute('data-category', t.id);
          r.insertCell().textContent = t.id;
          r.insertCell();
          var sel = document.createElement('select');
          sel.setAttribute('aria-label', 'Tickets of ' + t.id);
          sel.id = 'qty-' + t.id;
          r.insertCell().appendChild(sel);
        });
        row = body.rows[n];
      }
      row.cells[1].textContent = c.available.toLocaleString() + ' of ' + c.total.toLocaleString();
      var sel = row.cells[2].firstChild;
      var most = Math.min(c.cart_limit || e.cart_limit, e.cart_limit, c.available);
      if (sel.options.length !== most + 1) {
        var keep = Number(sel.value) || 0;
        sel.textContent = '';
        for (var i = 0; i <= most; i++) {
          var o = document.createElement('option');
          o.value = String(i); o.textContent = String(i);
          sel.appendChild(o);
        }
        sel.value = String(Math.min(keep, most));
      }
    });
  }

  // What the form asks for: {qty} or, with categories, {items}.
  function request() {
    if (tiers.length === 0) return { qty: Number(qtyEl.value) };
    var items = tiers.map(function (c) {
      return { category: c.id, qty: Number($('qty-' + c.id).value) || 0 };
    }).filter(function (i) { return i.qty > 0; });
    return items.length ? { items: items } : null;
  }

  function showStock(e) {
    showTiers(e);
    availableEl.textContent = e.available.toLocaleString();
    totalEl.textContent = 'of ' + e.total.toLocaleString() + ' left';
    fill.style.width = (e.total > 0 ? Math.round(100 * e.available / e.total) : 0) + '%';
    var want = Math.max(1, Math.min(e.cart_limit, e.available || 1));
    if (qtyEl.options.length !== want) {
      var keep = Number(qtyEl.value) || 1;
      qtyEl.textContent = '';
      for (var i = 1; i <= want; i++) {
        var o = document.createElement('option');
        o.value = String(i); o.textContent = String(i);
        qtyEl.appendChild(o);
      }
      qtyEl.value = String(Math.min(keep, want));
    }
    holdBtn.disabled = e.available === 0 && !hold;
    var wave = nextWaveText(e);
    waveEl.hidden = !wave;
    waveEl.textContent = wave;
    if (e.available === 0 && !hold) {
      say(wave ? 'Sold out for now. ' + wave + ' Keep this page open.'
        : 'Sold out. Held tickets that are not paid come back: keep this page open.');
    }
  }

  // A scheduled wave is pending (next_wave_at_ms): when, and how many.
  function nextWaveText(e) {
    if (typeof e.next_wave_at_ms !== 'number') return '';
    var d = new Date(e.next_wave_at_ms);
    var when = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
    return 'Next release: ' + (e.next_wave_qty || 0).toLocaleString() + ' more tickets at ' + when + ' (your time).';
  }

  function refresh() {
    if (refreshing) return;
    refreshing = true;
    call('GET', api).then(function (r) {
      refreshing = false;
      if (r.status === 200) showStock(r.body);
      else if (r.status === 401) notAdmitted();
    }, function () { refreshing = false; });
  }

  // The server's clock decides expiry: the countdown runs from the
  // response's Date header, not from the visitor's clock.
  function serverNow(date) {
    var t = date ? Date.parse(date) : NaN;
    return (isNaN(t) ? Date.now() : t) / 1000;
  }

  function showHold(h, date) {
    var left = Math.max(0, h.expires_at - serverNow(date));
    hold = { hold_id: h.hold_id, qty: h.qty, deadline: performance.now() + left * 1000 };
    try { sessionStorage.setItem(storeKey, h.hold_id); } catch (e) { /* private mode */ }
    holdQtyEl.textContent = String(h.qty);
    holdItemsEl.textContent = itemsText(h.items);
    holdItemsEl.hidden = !(h.items && h.items.length);
    payLink.href = '/demo-pay/' + encodeURIComponent(h.hold_id);
    holdBox.hidden = false;
    buyBox.hidden = true;
    tick();
    if (!ticking) ticking = setInterval(tick, 1000);
  }

  function clearHold(text) {
    hold = null;
    try { sessionStorage.removeItem(storeKey); } catch (e) { /* private mode */ }
    if (ticking) { clearInterval(ticking); ticking = null; }
    holdBox.hidden = true;
    buyBox.hidden = false;
    if (text) say(text);
    refresh();
  }

  function tick() {
    if (!hold) return;
    var s = Math.max(0, Math.round((hold.deadline - performance.now()) / 1000));
    countdownEl.textContent = Math.floor(s / 60) + ':' + ('0' + (s % 60)).slice(-2);
    if (s === 0) clearHold('Your hold expired: the tickets went back on sale.');
  }

  function newKey() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return String(Date.now()) + '-' + Math.random().toString(36).slice(2);
  }

  form.addEventListener('submit', function (ev) {
    ev.preventDefault();
    var asked = request();
    if (!asked) { say('Choose at least one ticket.'); return; }
    // Retrying after a network error reuses the key: at most one hold.
    pendingKey = pendingKey || newKey();
    holdBtn.disabled = true;
    say('Holding your tickets…');
    call('POST', api + '/holds', asked, { 'idempotency-key': pendingKey }).then(function (r) {
      pendingKey = null;
      holdBtn.disabled = false;
      if (r.status === 201) {
        say(r.body.qty + ' ticket(s) held. Pay before the countdown ends.');
        showHold(r.body, r.date);
        refresh();
      } else if (r.status === 401) {
        notAdmitted();
      } else if (r.body.code === 'sold_out') {
        var where = r.body.category ? ' in ' + r.body.category : '';
        say('Not enough tickets left' + where + ': ' + r.body.available + ' available.');
        refresh();
      } else if (r.body.code === 'cart_limit_exceeded') {
        var of = r.body.category ? ' of ' + r.body.category : '';
        say('You can hold at most ' + r.body.limit + ' ticket(s)' + of + '; you already hold ' + r.body.held + '.');
      } else {
        say((r.body.title || 'Something went wrong') + '. Please try again.');
      }
    }, function () {
      holdBtn.disabled = false;
      say('Network trouble: press the button again, you will not get two holds.');
    });
  });

  releaseBtn.addEventListener('click', function () {
    if (!hold) return;
    releaseBtn.disabled = true;
    call('DELETE', '/_sluice/holds/' + encodeURIComponent(hold.hold_id)).then(function (r) {
      releaseBtn.disabled = false;
      if (r.status === 200) clearHold('Released: the tickets went back on sale.');
      else if (r.body.code === 'hold_confirmed') say('This order is already paid.');
      else say('Could not release the hold. Please try again.');
    }, function () { releaseBtn.disabled = false; say('Network trouble: please try again.'); });
  });

  // A reload keeps the hold on screen.
  var saved = null;
  try { saved = sessionStorage.getItem(storeKey); } catch (e) { saved = null; }
  if (saved) {
    call('GET', '/_sluice/holds/' + encodeURIComponent(saved)).then(function (r) {
      if (r.status === 200 && r.body.status === 'held') showHold(r.body, r.date);
      else { try { sessionStorage.removeItem(storeKey); } catch (e) { /* ignore */ } }
    }, function () { /* shown as not held */ });
  }
  refresh();
  setInterval(function () { if (!document.hidden) refresh(); }, 3000);
})();
