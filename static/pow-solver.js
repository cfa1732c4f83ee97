/*
 * sluice proof-of-work coordinator (page side).
 *
 *   SluicePow.solveChallenge(
 *     {challenge, puzzles, difficulty_bits},      // the challenge endpoint's answer
 *     {onProgress, workerUrl, signal})            // all optional
 *   -> Promise<string[]>                          // the k counters, in puzzle order
 *
 * Starts clamp(hardwareConcurrency - 1, 1, 8) dedicated Web Workers from
 * `workerUrl` (default '/_sluice/static/pow-worker.js', a same-origin URL:
 * no blob:, no eval, fine under a strict CSP) and hands each one puzzle at a
 * time until all k are solved. onProgress({solved, total, fraction, hashes})
 * is called as puzzles complete (fraction = solved / k: an honest progress
 * bar) and with hash counts in between. While the tab is hidden only one
 * worker runs; the others are stopped and their puzzles resume, from the
 * counter they reached, when it is visible again. Every worker is terminated
 * on success, on error, when `signal` aborts, and on `pagehide`.
 *
 * Submitting the solutions (and resubmitting the same ones after a network
 * error) is the page's job: a solution stays valid until the challenge
 * expires, and the server accepts it once.
 *
 * A plain script: it defines `window.SluicePow` (and module.exports under
 * Node, for the tests).
 */
(function (root) {
  'use strict';

  var DEFAULT_WORKER_URL = '/_sluice/static/pow-worker.js';

  function workerCount(env) {
    var hc = env.navigator && env.navigator.hardwareConcurrency;
    var n = (typeof hc === 'number' && hc > 0 ? hc : 2) - 1;
    return Math.max(1, Math.min(8, Math.floor(n)));
  }

  function abortError() {
    try {
      return new DOMException('proof of work aborted', 'AbortError');
    } catch (e) {
      var err = new Error('proof of work aborted');
      err.name = 'AbortError';
      return err;
    }
  }

  /* `env` lets tests substitute Worker, document, navigator and window. */
  function solveChallenge(ch, opts, env) {
    opts = opts || {};
    env = env || root;
    var WorkerCtor = env.Worker;
    var doc = env.document;
    var win = env.window || env;
    var k = ch.puzzles | 0;
    var bits = ch.difficulty_bits | 0;
    var url = opts.workerUrl || DEFAULT_WORKER_URL;
    var onProgress = typeof opts.onProgress === 'function' ? opts.onProgress : null;
    var signal = opts.signal;
    var maxWorkers = workerCount(env);

    return new Promise(function (resolve, reject) {
      if (!(k >= 1 && k <= 64)) { reject(new RangeError('puzzles must be 1..64')); return; }
      if (!WorkerCtor) { reject(new Error('Web Workers unavailable')); return; }
      if (signal && signal.aborted) { reject(abortError()); return; }

      var solutions = new Array(k);
      var solved = 0;
      var next = new Array(k);          // counter each puzzle resumes from
      var doneHashes = 0;               // hashes of finished or reassigned work
      var queue = [];                   // puzzles waiting for a worker
      var workers = [];                 // {w, index (or -1), hashes}
      var finished = false;
      var i;
      for (i = 0; i < k; i++) { next[i] = 0; queue.push(i); }

      function totalHashes() {
        var t = doneHashes;
        for (var j = 0; j < workers.length; j++) t += workers[j].hashes;
        return t;
      }
      function progress() {
        if (onProgress) {
          try {
            onProgress({ solved: solved, total: k, fraction: solved / k, hashes: totalHashes() });
          } catch (e) { /* a broken callback must not stop the work */ }
        }
      }
      function desired() {
        return doc && doc.hidden ? 1 : maxWorkers;
      }
      function dispatch(slot) {
        if (finished) return;
        if (queue.length === 0) { slot.index = -1; return; }
        slot.index = queue.shift();
        slot.hashes = 0;
        slot.w.postMessage({ type: 'solve', challenge: ch.challenge, index: slot.index, bits: bits, start: next[slot.index], step: 1 });
      }
      function retire(slot) {
        // Stop a worker; its puzzle (if any) goes back to the front of the queue.
        try { slot.w.terminate(); } catch (e) { /* already gone */ }
        doneHashes += slot.hashes;
        slot.hashes = 0;
        if (slot.index >= 0 && solutions[slot.index] === undefined) queue.unshift(slot.index);
        slot.index = -1;
        var at = workers.indexOf(slot);
        if (at >= 0) workers.splice(at, 1);
      }
      function spawn() {
        var slot = { w: null, index: -1, hashes: 0 };
        try {
          slot.w = new WorkerCtor(url);
        } catch (e) {
          fail(e);
          return;
        }
        slot.w.onmessage = function (ev) { onMessage(slot, ev.data || {}); };
        slot.w.onerror = function (ev) {
          if (ev && typeof ev.preventDefault === 'function') ev.preventDefault();
          fail(new Error('proof-of-work worker failed' + (ev && ev.message ? ': ' + ev.message : '')));
        };
        workers.push(slot);
        dispatch(slot);
      }
      function rebalance() {
        if (finished) return;
        var want = desired();
        // Idle workers beyond need go first, then busy ones (their work is kept in next[]).
        while (workers.length > want) {
          var victim = null;
          for (var j = workers.length - 1; j >= 0; j--) {
            if (workers[j].index < 0) { victim = workers[j]; break; }
          }
          retire(victim || workers[workers.length - 1]);
        }
        while (workers.length < want && queue.length > 0 && !finished) spawn();
        for (var m = 0; m < workers.length; m++) {
          if (workers[m].index < 0) dispatch(workers[m]);
        }
      }
      function onMessage(slot, m) {
        if (finished || workers.indexOf(slot) < 0) return;
        if (m.type === 'progress') {
          if (m.index === slot.index) {
            next[m.index] = m.next;
            slot.hashes = m.hashes;
            progress();
          }
        } else if (m.type === 'solution') {
          if (m.index !== slot.index || solutions[m.index] !== undefined) return;
          solutions[m.index] = String(m.nonce);
          solved++;
          doneHashes += m.hashes;
          slot.hashes = 0;
          slot.index = -1;
          progress();
          if (solved === k) { succeed(); return; }
          dispatch(slot);
          if (slot.index < 0 && workers.length > desired()) retire(slot);
        } else if (m.type === 'error') {
          fail(new Error('proof-of-work worker: ' + m.message));
        }
      }
      function cleanup() {
        finished = true;
        while (workers.length) {
          var s = workers.pop();
          try { s.w.terminate(); } catch (e) { /* already gone */ }
        }
        if (doc && doc.removeEventListener) doc.removeEventListener('visibilitychange', rebalance);
        if (win && win.removeEventListener) win.removeEventListener('pagehide', onPageHide);
        if (signal && signal.removeEventListener) signal.removeEventListener('abort', onAbort);
      }
      function succeed() { cleanup(); resolve(solutions); }
      function fail(err) { if (!finished) { cleanup(); reject(err); } }
      function onAbort() { fail(abortError()); }
      function onPageHide() { fail(abortError()); }

      if (doc && doc.addEventListener) doc.addEventListener('visibilitychange', rebalance);
      if (win && win.addEventListener) win.addEventListener('pagehide', onPageHide);
      if (signal && signal.addEventListener) signal.addEventListener('abort', onAbort);
      rebalance();
    });
  }

  var api = { solveChallenge: solveChallenge, workerCount: workerCount };
  if (typeof module !== 'undefined' && module.exports) {
    module.exports = api;
  } else {
    root.SluicePow = api;
  }
})(typeof self !== 'undefined' ? self : globalThis);
