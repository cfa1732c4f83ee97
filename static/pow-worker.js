/*
 * sluice proof-of-work Web Worker.
 *
 * Solves one puzzle at a time: find a counter n (decimal ASCII, no leading
 * zeros) such that SHA-256(challenge ":" index ":" n) begins with at least
 * `bits` zero bits (API.md, "Proof of work").
 *
 * Load it as a dedicated worker from a same-origin URL
 * (`new Worker('/_sluice/static/pow-worker.js')`): no blob:, no eval, so a
 * strict Content-Security-Policy (`worker-src 'self'`) works.
 *
 * Messages in:
 *   {type: 'solve', challenge, index, bits, start = 0, step = 1}
 *   {type: 'stop'}
 * Messages out:
 *   {type: 'progress', index, next, hashes}   about every 50 ms
 *   {type: 'solution', index, nonce, hashes}  nonce is a decimal string
 *   {type: 'error', message}
 *
 * SHA-256 is written here for this input shape (never crypto.subtle per
 * hash: 10-100x slower): the constant prefix `challenge:index:` is
 * compressed once up to its last full 64-byte block; each counter only
 * hashes the tail (the prefix's remaining bytes, the digits, padding), one
 * or two blocks, in Int32 arithmetic.
 *
 * In Node the hashing functions are exported (module.exports) for the
 * tests in static/test/; the browser ignores that branch.
 */
'use strict';

var K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
]);

var IV = new Int32Array([
  0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
]);

/* Compresses the 64 bytes of `bytes` at `off` into state H (Int32Array(8)),
 * using W (Int32Array(64)) as scratch. */
function compress(H, W, bytes, off) {
  var t, a, b, c, d, e, f, g, h, t1, t2, w15, w2;
  for (t = 0; t < 16; t++) {
    var i = off + (t << 2);
    W[t] = (bytes[i] << 24) | (bytes[i + 1] << 16) | (bytes[i + 2] << 8) | bytes[i + 3];
  }
  for (t = 16; t < 64; t++) {
    w15 = W[t - 15];
    w2 = W[t - 2];
    W[t] = (W[t - 16] +
      (((w15 >>> 7) | (w15 << 25)) ^ ((w15 >>> 18) | (w15 << 14)) ^ (w15 >>> 3)) +
      W[t - 7] +
      (((w2 >>> 17) | (w2 << 15)) ^ ((w2 >>> 19) | (w2 << 13)) ^ (w2 >>> 10))) | 0;
  }
  a = H[0]; b = H[1]; c = H[2]; d = H[3]; e = H[4]; f = H[5]; g = H[6]; h = H[7];
  for (t = 0; t < 64; t++) {
    t1 = (h +
      (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) +
      ((e & f) ^ (~e & g)) + K[t] + W[t]) | 0;
    t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) +
      ((a & b) ^ (a & c) ^ (b & c))) | 0;
    h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  H[0] = (H[0] + a) | 0; H[1] = (H[1] + b) | 0; H[2] = (H[2] + c) | 0; H[3] = (H[3] + d) | 0;
  H[4] = (H[4] + e) | 0; H[5] = (H[5] + f) | 0; H[6] = (H[6] + g) | 0; H[7] = (H[7] + h) | 0;
}

/* Writes the 64-bit big-endian bit length of a `len`-byte message at off. */
function writeBitLength(buf, off, len) {
  var hi = Math.floor(len / 0x20000000); // (len * 8) / 2^32
  var lo = (len * 8) >>> 0;
  buf[off] = hi >>> 24; buf[off + 1] = hi >>> 16; buf[off + 2] = hi >>> 8; buf[off + 3] = hi;
  buf[off + 4] = lo >>> 24; buf[off + 5] = lo >>> 16; buf[off + 6] = lo >>> 8; buf[off + 7] = lo;
}

/* SHA-256 of any byte array (for tests and vectors); returns Uint8Array(32). */
function sha256(bytes) {
  var H = new Int32Array(IV), W = new Int32Array(64);
  var full = bytes.length >> 6, i;
  for (i = 0; i < full; i++) compress(H, W, bytes, i << 6);
  var rest = bytes.length - (full << 6);
  var blocks = rest + 9 <= 64 ? 1 : 2;
  var tail = new Uint8Array(blocks << 6);
  tail.set(bytes.subarray(full << 6));
  tail[rest] = 0x80;
  writeBitLength(tail, (blocks << 6) - 8, bytes.length);
  for (i = 0; i < blocks; i++) compress(H, W, tail, i << 6);
  return wordsToBytes(H);
}

function wordsToBytes(H) {
  var out = new Uint8Array(32);
  for (var i = 0; i < 8; i++) {
    out[i * 4] = H[i] >>> 24; out[i * 4 + 1] = H[i] >>> 16;
    out[i * 4 + 2] = H[i] >>> 8; out[i * 4 + 3] = H[i];
  }
  return out;
}

function asciiBytes(s) {
  return new TextEncoder().encode(s);
}

/* Leading zero bits of a hash given as 8 Int32 words (or as bytes). */
function leadingZeroBits(h) {
  var n = 0, i;
  if (h instanceof Int32Array) {
    for (i = 0; i < h.length; i++) {
      if (h[i] === 0) { n += 32; } else { return n + Math.clz32(h[i]); }
    }
    return n;
  }
  for (i = 0; i < h.length; i++) {
    if (h[i] === 0) { n += 8; } else { return n + Math.clz32(h[i]) - 24; }
  }
  return n;
}

/* Whether state words H begin with at least `bits` zero bits. */
function meetsDifficulty(H, bits) {
  var i = 0;
  while (bits >= 32) {
    if (H[i] !== 0) return false;
    i++; bits -= 32;
  }
  return bits === 0 || (H[i] >>> (32 - bits)) === 0;
}

/* The hasher of one puzzle: state after the full blocks of
 * `challenge:index:`, plus a 128-byte scratch holding the remaining tail. */
function PuzzleHasher(challenge, index) {
  var prefix = asciiBytes(challenge + ':' + index + ':');
  this.state = new Int32Array(IV);
  this.W = new Int32Array(64);
  this.H = new Int32Array(8);
  var full = prefix.length >> 6;
  for (var i = 0; i < full; i++) compress(this.state, this.W, prefix, i << 6);
  this.tailLen = prefix.length - (full << 6);
  this.prefixLen = prefix.length;
  this.block = new Uint8Array(128);
  this.block.set(prefix.subarray(full << 6));
  this.digits = new Uint8Array(20);
}

/* SHA-256(prefix + decimal(n)) as 8 Int32 words (a view reused per call).
 * n: a non-negative safe integer. */
PuzzleHasher.prototype.hash = function (n) {
  var d = this.digits, len = 0, q;
  do {
    q = Math.floor(n / 10);
    d[len++] = 48 + (n - q * 10);
    n = q;
  } while (n > 0);
  var block = this.block, pos = this.tailLen, i;
  for (i = len - 1; i >= 0; i--) block[pos++] = d[i];
  block[pos++] = 0x80;
  var end = pos + 8 <= 64 ? 64 : 128;
  for (i = pos; i < end - 8; i++) block[i] = 0;
  writeBitLength(block, end - 8, this.prefixLen + len);
  var H = this.H;
  H.set(this.state);
  compress(H, this.W, block, 0);
  if (end === 128) compress(H, this.W, block, 64);
  return H;
};

/* Scans n = start, start + step, ... for at most maxTries counters.
 * Returns the decimal string of the first solution, or null. */
function solvePuzzle(challenge, index, bits, start, step, maxTries) {
  var h = new PuzzleHasher(challenge, index);
  var n = start || 0, s = step || 1, limit = maxTries === undefined ? Infinity : maxTries;
  for (var tries = 0; tries < limit; tries++, n += s) {
    if (meetsDifficulty(h.hash(n), bits)) return String(n);
  }
  return null;
}

/* === the worker loop === */

var SLICE_MS = 50;

function installWorker(scope) {
  var job = null;
  var pending = false;
  var yieldNow;
  if (typeof MessageChannel !== 'undefined') {
    var ch = new MessageChannel();
    ch.port1.onmessage = function () { pending = false; run(); };
    yieldNow = function () { ch.port2.postMessage(null); };
  } else {
    yieldNow = function () { setTimeout(function () { pending = false; run(); }, 0); };
  }
  function schedule() {
    if (!pending) { pending = true; yieldNow(); }
  }
  function now() {
    return typeof performance !== 'undefined' ? performance.now() : Date.now();
  }
  function run() {
    var j = job;
    if (!j) return;
    var deadline = now() + SLICE_MS;
    var h = j.hasher, bits = j.bits, step = j.step, n = j.next, done = 0;
    for (;;) {
      for (var k = 0; k < 1024; k++) {
        if (meetsDifficulty(h.hash(n), bits)) {
          j.hashes += done + k + 1;
          job = null;
          scope.postMessage({ type: 'solution', index: j.index, nonce: String(n), hashes: j.hashes });
          return;
        }
        n += step;
      }
      done += 1024;
      if (!(n <= Number.MAX_SAFE_INTEGER)) {
        job = null;
        scope.postMessage({ type: 'error', message: 'counter space exhausted' });
        return;
      }
      if (now() >= deadline) break;
    }
    j.next = n;
    j.hashes += done;
    scope.postMessage({ type: 'progress', index: j.index, next: n, hashes: j.hashes });
    schedule();
  }
  scope.onmessage = function (e) {
    var m = e.data || {};
    if (m.type === 'solve') {
      try {
        job = {
          hasher: new PuzzleHasher(String(m.challenge), m.index | 0),
          index: m.index | 0,
          bits: m.bits | 0,
          next: m.start || 0,
          step: m.step || 1,
          hashes: 0
        };
      } catch (err) {
        scope.postMessage({ type: 'error', message: String(err) });
        return;
      }
      schedule();
    } else if (m.type === 'stop') {
      job = null;
    }
  };
}

if (typeof WorkerGlobalScope !== 'undefined' && typeof self !== 'undefined' && self instanceof WorkerGlobalScope) {
  installWorker(self);
}

if (typeof module !== 'undefined' && module.exports) {
  module.exports = {
    sha256: sha256,
    PuzzleHasher: PuzzleHasher,
    leadingZeroBits: leadingZeroBits,
    meetsDifficulty: meetsDifficulty,
    solvePuzzle: solvePuzzle,
    wordsToBytes: wordsToBytes,
    installWorker: installWorker
  };
}
