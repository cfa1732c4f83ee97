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

/* Counters hashed between two looks at the clock (about 2 ms). */
var CHUNK = 4096;

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

/* The hasher of one puzzle. The prefix `challenge:index:` is constant, so
 * it is compressed once up to its last full 64-byte block (`state`); the
 * rest of it (the tail) starts every last block, followed by the digits of
 * the counter, 0x80, zeros and the bit length. Per counter only the words
 * holding digits change:
 *   - the rounds that read only tail words are run once per puzzle
 *     (`roundState`, after `fixedRounds` rounds);
 *   - the counter is kept as ASCII digits in the block and incremented in
 *     place (an odometer), never divided;
 *   - the compression runs on local variables (K inlined as literals, the
 *     16-word message schedule rolled in locals), and only the first
 *     output word is formed unless the difficulty needs more.
 * Counters whose tail spills into a second block (a long challenge, or a
 * huge counter) take the generic two-block path. */
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
  this.digits = new Uint8Array(24);
  // Rounds over the words made only of tail bytes, run once.
  this.fixedRounds = this.tailLen >> 2;
  this.roundState = new Int32Array(8);
  this.words = new Int32Array(16);
  for (i = 0; i < this.fixedRounds; i++) this.words[i] = wordAt(this.block, i << 2);
  runRounds(this.roundState, this.state, this.words, this.fixedRounds);
  this.len = 0;      // digits of the counter now in the block (0: none)
  this.n = -1;       // that counter
}

function wordAt(b, i) {
  return (b[i] << 24) | (b[i + 1] << 16) | (b[i + 2] << 8) | b[i + 3];
}

/* out = state after rounds 0..r-1 of a compression of words w from H. */
function runRounds(out, H, w, r) {
  var a = H[0], b = H[1], c = H[2], d = H[3], e = H[4], f = H[5], g = H[6], h = H[7], t1, t2;
  for (var t = 0; t < r; t++) {
    t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) +
      ((e & f) ^ (~e & g)) + K[t] + w[t]) | 0;
    t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) +
      ((a & b) ^ (a & c) ^ (b & c))) | 0;
    h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  out[0] = a; out[1] = b; out[2] = c; out[3] = d; out[4] = e; out[5] = f; out[6] = g; out[7] = h;
}

/* Writes the decimal digits of n (a non-negative safe integer) after the
 * tail, then 0x80, zeros and the length; returns whether it fits one block. */
PuzzleHasher.prototype.place = function (n) {
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
  this.len = len;
  if (end === 64) {
    var w = this.words;
    for (i = this.fixedRounds; i < 16; i++) w[i] = wordAt(block, i << 2);
  }
  return end === 64;
};

/* Adds one to the counter in the block; false when its digit count grows
 * (the caller places the next counter afresh). */
PuzzleHasher.prototype.increment = function () {
  var block = this.block, i = this.tailLen + this.len - 1, stop = this.tailLen;
  while (i >= stop && block[i] === 57) { block[i] = 48; i--; }
  if (i < stop) return false;
  block[i]++;
  // Words from the one holding the changed digit to the last digit.
  var w = this.words, last = (this.tailLen + this.len - 1) >> 2;
  for (var j = i >> 2; j <= last; j++) w[j] = (block[j << 2] << 24) | (block[(j << 2) + 1] << 16) | (block[(j << 2) + 2] << 8) | block[(j << 2) + 3];
  return true;
};

/* SHA-256(prefix + decimal(n)) as 8 Int32 words (a view reused per call).
 * n: a non-negative safe integer. */
PuzzleHasher.prototype.hash = function (n) {
  var H = this.H;
  if (this.place(n)) {
    this.n = n;
    firstWord(this.roundState, this.fixedRounds, this.words, this.state, H, true);
    return H;
  }
  this.len = 0;
  this.n = -1;
  H.set(this.state);
  compress(H, this.W, this.block, 0);
  compress(H, this.W, this.block, 64);
  return H;
};

/* Scans `count` counters n, n + step, ...; returns the first solution
 * (a number), or -1. */
PuzzleHasher.prototype.scan = function (n, count, step, bits) {
  var H = this.H, rs = this.roundState, fr = this.fixedRounds, w = this.words, st = this.state;
  var one = this.place(n);
  // The top `bits` bits must be zero: with up to 32, only the first word
  // of the hash is needed.
  var shift = 32 - bits, limit = n + (count - 1) * step;
  for (;;) {
    if (one) {
      var h0 = firstWord(rs, fr, w, st, H, bits > 32);
      if (bits <= 32 ? (bits === 0 || (h0 >>> shift) === 0) : meetsDifficulty(H, bits)) return n;
    } else if (meetsDifficulty(this.hash(n), bits)) {
      return n;
    }
    if (n >= limit) return -1;
    n += step;
    one = step === 1 && one ? (this.increment() || this.place(n)) : this.place(n);
  }
};

/* The compression of the last block from the precomputed round state,
 * generated code: rounds `from`..15 through a falling-through switch, then
 * rounds 16..63 fully unrolled with K as literals and the 16-word message
 * schedule rolled in locals (w[t mod 16]); the working variables rotate
 * their names instead of moving values. Returns the hash's first word and
 * fills H (all 8 words) when `all`. */
function firstWord(rs, from, w, st, H, all) {
  var w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6], w7 = w[7];
  var w8 = w[8], w9 = w[9], w10 = w[10], w11 = w[11], w12 = w[12], w13 = w[13], w14 = w[14], w15 = w[15];
  var a = rs[0], b = rs[1], c = rs[2], d = rs[3], e = rs[4], f = rs[5], g = rs[6], h = rs[7];
  var t1, t2;
  switch (from) {
    case 0:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 1116352408 + w0) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 1:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 1899447441 + w1) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 2:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -1245643825 + w2) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 3:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -373957723 + w3) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 4:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 961987163 + w4) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 5:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 1508970993 + w5) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 6:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -1841331548 + w6) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 7:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -1424204075 + w7) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 8:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -670586216 + w8) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 9:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 310598401 + w9) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 10:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 607225278 + w10) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 11:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 1426881987 + w11) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 12:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 1925078388 + w12) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 13:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -2132889090 + w13) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 14:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -1680079193 + w14) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    case 15:
      t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -1046744716 + w15) | 0;
      t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  w0 = (((w14 >>> 17) | (w14 << 15)) ^ ((w14 >>> 19) | (w14 << 13)) ^ (w14 >>> 10)) + w9 + (((w1 >>> 7) | (w1 << 25)) ^ ((w1 >>> 18) | (w1 << 14)) ^ (w1 >>> 3)) + w0 | 0;
  t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -459576895 + w0) | 0;
  d = (d + t1) | 0;
  h = (t1 + (((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
  w1 = (((w15 >>> 17) | (w15 << 15)) ^ ((w15 >>> 19) | (w15 << 13)) ^ (w15 >>> 10)) + w10 + (((w2 >>> 7) | (w2 << 25)) ^ ((w2 >>> 18) | (w2 << 14)) ^ (w2 >>> 3)) + w1 | 0;
  t1 = (g + (((d >>> 6) | (d << 26)) ^ ((d >>> 11) | (d << 21)) ^ ((d >>> 25) | (d << 7))) + ((d & e) ^ (~d & f)) + -272742522 + w1) | 0;
  c = (c + t1) | 0;
  g = (t1 + (((h >>> 2) | (h << 30)) ^ ((h >>> 13) | (h << 19)) ^ ((h >>> 22) | (h << 10))) + ((h & a) ^ (h & b) ^ (a & b))) | 0;
  w2 = (((w0 >>> 17) | (w0 << 15)) ^ ((w0 >>> 19) | (w0 << 13)) ^ (w0 >>> 10)) + w11 + (((w3 >>> 7) | (w3 << 25)) ^ ((w3 >>> 18) | (w3 << 14)) ^ (w3 >>> 3)) + w2 | 0;
  t1 = (f + (((c >>> 6) | (c << 26)) ^ ((c >>> 11) | (c << 21)) ^ ((c >>> 25) | (c << 7))) + ((c & d) ^ (~c & e)) + 264347078 + w2) | 0;
  b = (b + t1) | 0;
  f = (t1 + (((g >>> 2) | (g << 30)) ^ ((g >>> 13) | (g << 19)) ^ ((g >>> 22) | (g << 10))) + ((g & h) ^ (g & a) ^ (h & a))) | 0;
  w3 = (((w1 >>> 17) | (w1 << 15)) ^ ((w1 >>> 19) | (w1 << 13)) ^ (w1 >>> 10)) + w12 + (((w4 >>> 7) | (w4 << 25)) ^ ((w4 >>> 18) | (w4 << 14)) ^ (w4 >>> 3)) + w3 | 0;
  t1 = (e + (((b >>> 6) | (b << 26)) ^ ((b >>> 11) | (b << 21)) ^ ((b >>> 25) | (b << 7))) + ((b & c) ^ (~b & d)) + 604807628 + w3) | 0;
  a = (a + t1) | 0;
  e = (t1 + (((f >>> 2) | (f << 30)) ^ ((f >>> 13) | (f << 19)) ^ ((f >>> 22) | (f << 10))) + ((f & g) ^ (f & h) ^ (g & h))) | 0;
  w4 = (((w2 >>> 17) | (w2 << 15)) ^ ((w2 >>> 19) | (w2 << 13)) ^ (w2 >>> 10)) + w13 + (((w5 >>> 7) | (w5 << 25)) ^ ((w5 >>> 18) | (w5 << 14)) ^ (w5 >>> 3)) + w4 | 0;
  t1 = (d + (((a >>> 6) | (a << 26)) ^ ((a >>> 11) | (a << 21)) ^ ((a >>> 25) | (a << 7))) + ((a & b) ^ (~a & c)) + 770255983 + w4) | 0;
  h = (h + t1) | 0;
  d = (t1 + (((e >>> 2) | (e << 30)) ^ ((e >>> 13) | (e << 19)) ^ ((e >>> 22) | (e << 10))) + ((e & f) ^ (e & g) ^ (f & g))) | 0;
  w5 = (((w3 >>> 17) | (w3 << 15)) ^ ((w3 >>> 19) | (w3 << 13)) ^ (w3 >>> 10)) + w14 + (((w6 >>> 7) | (w6 << 25)) ^ ((w6 >>> 18) | (w6 << 14)) ^ (w6 >>> 3)) + w5 | 0;
  t1 = (c + (((h >>> 6) | (h << 26)) ^ ((h >>> 11) | (h << 21)) ^ ((h >>> 25) | (h << 7))) + ((h & a) ^ (~h & b)) + 1249150122 + w5) | 0;
  g = (g + t1) | 0;
  c = (t1 + (((d >>> 2) | (d << 30)) ^ ((d >>> 13) | (d << 19)) ^ ((d >>> 22) | (d << 10))) + ((d & e) ^ (d & f) ^ (e & f))) | 0;
  w6 = (((w4 >>> 17) | (w4 << 15)) ^ ((w4 >>> 19) | (w4 << 13)) ^ (w4 >>> 10)) + w15 + (((w7 >>> 7) | (w7 << 25)) ^ ((w7 >>> 18) | (w7 << 14)) ^ (w7 >>> 3)) + w6 | 0;
  t1 = (b + (((g >>> 6) | (g << 26)) ^ ((g >>> 11) | (g << 21)) ^ ((g >>> 25) | (g << 7))) + ((g & h) ^ (~g & a)) + 1555081692 + w6) | 0;
  f = (f + t1) | 0;
  b = (t1 + (((c >>> 2) | (c << 30)) ^ ((c >>> 13) | (c << 19)) ^ ((c >>> 22) | (c << 10))) + ((c & d) ^ (c & e) ^ (d & e))) | 0;
  w7 = (((w5 >>> 17) | (w5 << 15)) ^ ((w5 >>> 19) | (w5 << 13)) ^ (w5 >>> 10)) + w0 + (((w8 >>> 7) | (w8 << 25)) ^ ((w8 >>> 18) | (w8 << 14)) ^ (w8 >>> 3)) + w7 | 0;
  t1 = (a + (((f >>> 6) | (f << 26)) ^ ((f >>> 11) | (f << 21)) ^ ((f >>> 25) | (f << 7))) + ((f & g) ^ (~f & h)) + 1996064986 + w7) | 0;
  e = (e + t1) | 0;
  a = (t1 + (((b >>> 2) | (b << 30)) ^ ((b >>> 13) | (b << 19)) ^ ((b >>> 22) | (b << 10))) + ((b & c) ^ (b & d) ^ (c & d))) | 0;
  w8 = (((w6 >>> 17) | (w6 << 15)) ^ ((w6 >>> 19) | (w6 << 13)) ^ (w6 >>> 10)) + w1 + (((w9 >>> 7) | (w9 << 25)) ^ ((w9 >>> 18) | (w9 << 14)) ^ (w9 >>> 3)) + w8 | 0;
  t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -1740746414 + w8) | 0;
  d = (d + t1) | 0;
  h = (t1 + (((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
  w9 = (((w7 >>> 17) | (w7 << 15)) ^ ((w7 >>> 19) | (w7 << 13)) ^ (w7 >>> 10)) + w2 + (((w10 >>> 7) | (w10 << 25)) ^ ((w10 >>> 18) | (w10 << 14)) ^ (w10 >>> 3)) + w9 | 0;
  t1 = (g + (((d >>> 6) | (d << 26)) ^ ((d >>> 11) | (d << 21)) ^ ((d >>> 25) | (d << 7))) + ((d & e) ^ (~d & f)) + -1473132947 + w9) | 0;
  c = (c + t1) | 0;
  g = (t1 + (((h >>> 2) | (h << 30)) ^ ((h >>> 13) | (h << 19)) ^ ((h >>> 22) | (h << 10))) + ((h & a) ^ (h & b) ^ (a & b))) | 0;
  w10 = (((w8 >>> 17) | (w8 << 15)) ^ ((w8 >>> 19) | (w8 << 13)) ^ (w8 >>> 10)) + w3 + (((w11 >>> 7) | (w11 << 25)) ^ ((w11 >>> 18) | (w11 << 14)) ^ (w11 >>> 3)) + w10 | 0;
  t1 = (f + (((c >>> 6) | (c << 26)) ^ ((c >>> 11) | (c << 21)) ^ ((c >>> 25) | (c << 7))) + ((c & d) ^ (~c & e)) + -1341970488 + w10) | 0;
  b = (b + t1) | 0;
  f = (t1 + (((g >>> 2) | (g << 30)) ^ ((g >>> 13) | (g << 19)) ^ ((g >>> 22) | (g << 10))) + ((g & h) ^ (g & a) ^ (h & a))) | 0;
  w11 = (((w9 >>> 17) | (w9 << 15)) ^ ((w9 >>> 19) | (w9 << 13)) ^ (w9 >>> 10)) + w4 + (((w12 >>> 7) | (w12 << 25)) ^ ((w12 >>> 18) | (w12 << 14)) ^ (w12 >>> 3)) + w11 | 0;
  t1 = (e + (((b >>> 6) | (b << 26)) ^ ((b >>> 11) | (b << 21)) ^ ((b >>> 25) | (b << 7))) + ((b & c) ^ (~b & d)) + -1084653625 + w11) | 0;
  a = (a + t1) | 0;
  e = (t1 + (((f >>> 2) | (f << 30)) ^ ((f >>> 13) | (f << 19)) ^ ((f >>> 22) | (f << 10))) + ((f & g) ^ (f & h) ^ (g & h))) | 0;
  w12 = (((w10 >>> 17) | (w10 << 15)) ^ ((w10 >>> 19) | (w10 << 13)) ^ (w10 >>> 10)) + w5 + (((w13 >>> 7) | (w13 << 25)) ^ ((w13 >>> 18) | (w13 << 14)) ^ (w13 >>> 3)) + w12 | 0;
  t1 = (d + (((a >>> 6) | (a << 26)) ^ ((a >>> 11) | (a << 21)) ^ ((a >>> 25) | (a << 7))) + ((a & b) ^ (~a & c)) + -958395405 + w12) | 0;
  h = (h + t1) | 0;
  d = (t1 + (((e >>> 2) | (e << 30)) ^ ((e >>> 13) | (e << 19)) ^ ((e >>> 22) | (e << 10))) + ((e & f) ^ (e & g) ^ (f & g))) | 0;
  w13 = (((w11 >>> 17) | (w11 << 15)) ^ ((w11 >>> 19) | (w11 << 13)) ^ (w11 >>> 10)) + w6 + (((w14 >>> 7) | (w14 << 25)) ^ ((w14 >>> 18) | (w14 << 14)) ^ (w14 >>> 3)) + w13 | 0;
  t1 = (c + (((h >>> 6) | (h << 26)) ^ ((h >>> 11) | (h << 21)) ^ ((h >>> 25) | (h << 7))) + ((h & a) ^ (~h & b)) + -710438585 + w13) | 0;
  g = (g + t1) | 0;
  c = (t1 + (((d >>> 2) | (d << 30)) ^ ((d >>> 13) | (d << 19)) ^ ((d >>> 22) | (d << 10))) + ((d & e) ^ (d & f) ^ (e & f))) | 0;
  w14 = (((w12 >>> 17) | (w12 << 15)) ^ ((w12 >>> 19) | (w12 << 13)) ^ (w12 >>> 10)) + w7 + (((w15 >>> 7) | (w15 << 25)) ^ ((w15 >>> 18) | (w15 << 14)) ^ (w15 >>> 3)) + w14 | 0;
  t1 = (b + (((g >>> 6) | (g << 26)) ^ ((g >>> 11) | (g << 21)) ^ ((g >>> 25) | (g << 7))) + ((g & h) ^ (~g & a)) + 113926993 + w14) | 0;
  f = (f + t1) | 0;
  b = (t1 + (((c >>> 2) | (c << 30)) ^ ((c >>> 13) | (c << 19)) ^ ((c >>> 22) | (c << 10))) + ((c & d) ^ (c & e) ^ (d & e))) | 0;
  w15 = (((w13 >>> 17) | (w13 << 15)) ^ ((w13 >>> 19) | (w13 << 13)) ^ (w13 >>> 10)) + w8 + (((w0 >>> 7) | (w0 << 25)) ^ ((w0 >>> 18) | (w0 << 14)) ^ (w0 >>> 3)) + w15 | 0;
  t1 = (a + (((f >>> 6) | (f << 26)) ^ ((f >>> 11) | (f << 21)) ^ ((f >>> 25) | (f << 7))) + ((f & g) ^ (~f & h)) + 338241895 + w15) | 0;
  e = (e + t1) | 0;
  a = (t1 + (((b >>> 2) | (b << 30)) ^ ((b >>> 13) | (b << 19)) ^ ((b >>> 22) | (b << 10))) + ((b & c) ^ (b & d) ^ (c & d))) | 0;
  w0 = (((w14 >>> 17) | (w14 << 15)) ^ ((w14 >>> 19) | (w14 << 13)) ^ (w14 >>> 10)) + w9 + (((w1 >>> 7) | (w1 << 25)) ^ ((w1 >>> 18) | (w1 << 14)) ^ (w1 >>> 3)) + w0 | 0;
  t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 666307205 + w0) | 0;
  d = (d + t1) | 0;
  h = (t1 + (((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
  w1 = (((w15 >>> 17) | (w15 << 15)) ^ ((w15 >>> 19) | (w15 << 13)) ^ (w15 >>> 10)) + w10 + (((w2 >>> 7) | (w2 << 25)) ^ ((w2 >>> 18) | (w2 << 14)) ^ (w2 >>> 3)) + w1 | 0;
  t1 = (g + (((d >>> 6) | (d << 26)) ^ ((d >>> 11) | (d << 21)) ^ ((d >>> 25) | (d << 7))) + ((d & e) ^ (~d & f)) + 773529912 + w1) | 0;
  c = (c + t1) | 0;
  g = (t1 + (((h >>> 2) | (h << 30)) ^ ((h >>> 13) | (h << 19)) ^ ((h >>> 22) | (h << 10))) + ((h & a) ^ (h & b) ^ (a & b))) | 0;
  w2 = (((w0 >>> 17) | (w0 << 15)) ^ ((w0 >>> 19) | (w0 << 13)) ^ (w0 >>> 10)) + w11 + (((w3 >>> 7) | (w3 << 25)) ^ ((w3 >>> 18) | (w3 << 14)) ^ (w3 >>> 3)) + w2 | 0;
  t1 = (f + (((c >>> 6) | (c << 26)) ^ ((c >>> 11) | (c << 21)) ^ ((c >>> 25) | (c << 7))) + ((c & d) ^ (~c & e)) + 1294757372 + w2) | 0;
  b = (b + t1) | 0;
  f = (t1 + (((g >>> 2) | (g << 30)) ^ ((g >>> 13) | (g << 19)) ^ ((g >>> 22) | (g << 10))) + ((g & h) ^ (g & a) ^ (h & a))) | 0;
  w3 = (((w1 >>> 17) | (w1 << 15)) ^ ((w1 >>> 19) | (w1 << 13)) ^ (w1 >>> 10)) + w12 + (((w4 >>> 7) | (w4 << 25)) ^ ((w4 >>> 18) | (w4 << 14)) ^ (w4 >>> 3)) + w3 | 0;
  t1 = (e + (((b >>> 6) | (b << 26)) ^ ((b >>> 11) | (b << 21)) ^ ((b >>> 25) | (b << 7))) + ((b & c) ^ (~b & d)) + 1396182291 + w3) | 0;
  a = (a + t1) | 0;
  e = (t1 + (((f >>> 2) | (f << 30)) ^ ((f >>> 13) | (f << 19)) ^ ((f >>> 22) | (f << 10))) + ((f & g) ^ (f & h) ^ (g & h))) | 0;
  w4 = (((w2 >>> 17) | (w2 << 15)) ^ ((w2 >>> 19) | (w2 << 13)) ^ (w2 >>> 10)) + w13 + (((w5 >>> 7) | (w5 << 25)) ^ ((w5 >>> 18) | (w5 << 14)) ^ (w5 >>> 3)) + w4 | 0;
  t1 = (d + (((a >>> 6) | (a << 26)) ^ ((a >>> 11) | (a << 21)) ^ ((a >>> 25) | (a << 7))) + ((a & b) ^ (~a & c)) + 1695183700 + w4) | 0;
  h = (h + t1) | 0;
  d = (t1 + (((e >>> 2) | (e << 30)) ^ ((e >>> 13) | (e << 19)) ^ ((e >>> 22) | (e << 10))) + ((e & f) ^ (e & g) ^ (f & g))) | 0;
  w5 = (((w3 >>> 17) | (w3 << 15)) ^ ((w3 >>> 19) | (w3 << 13)) ^ (w3 >>> 10)) + w14 + (((w6 >>> 7) | (w6 << 25)) ^ ((w6 >>> 18) | (w6 << 14)) ^ (w6 >>> 3)) + w5 | 0;
  t1 = (c + (((h >>> 6) | (h << 26)) ^ ((h >>> 11) | (h << 21)) ^ ((h >>> 25) | (h << 7))) + ((h & a) ^ (~h & b)) + 1986661051 + w5) | 0;
  g = (g + t1) | 0;
  c = (t1 + (((d >>> 2) | (d << 30)) ^ ((d >>> 13) | (d << 19)) ^ ((d >>> 22) | (d << 10))) + ((d & e) ^ (d & f) ^ (e & f))) | 0;
  w6 = (((w4 >>> 17) | (w4 << 15)) ^ ((w4 >>> 19) | (w4 << 13)) ^ (w4 >>> 10)) + w15 + (((w7 >>> 7) | (w7 << 25)) ^ ((w7 >>> 18) | (w7 << 14)) ^ (w7 >>> 3)) + w6 | 0;
  t1 = (b + (((g >>> 6) | (g << 26)) ^ ((g >>> 11) | (g << 21)) ^ ((g >>> 25) | (g << 7))) + ((g & h) ^ (~g & a)) + -2117940946 + w6) | 0;
  f = (f + t1) | 0;
  b = (t1 + (((c >>> 2) | (c << 30)) ^ ((c >>> 13) | (c << 19)) ^ ((c >>> 22) | (c << 10))) + ((c & d) ^ (c & e) ^ (d & e))) | 0;
  w7 = (((w5 >>> 17) | (w5 << 15)) ^ ((w5 >>> 19) | (w5 << 13)) ^ (w5 >>> 10)) + w0 + (((w8 >>> 7) | (w8 << 25)) ^ ((w8 >>> 18) | (w8 << 14)) ^ (w8 >>> 3)) + w7 | 0;
  t1 = (a + (((f >>> 6) | (f << 26)) ^ ((f >>> 11) | (f << 21)) ^ ((f >>> 25) | (f << 7))) + ((f & g) ^ (~f & h)) + -1838011259 + w7) | 0;
  e = (e + t1) | 0;
  a = (t1 + (((b >>> 2) | (b << 30)) ^ ((b >>> 13) | (b << 19)) ^ ((b >>> 22) | (b << 10))) + ((b & c) ^ (b & d) ^ (c & d))) | 0;
  w8 = (((w6 >>> 17) | (w6 << 15)) ^ ((w6 >>> 19) | (w6 << 13)) ^ (w6 >>> 10)) + w1 + (((w9 >>> 7) | (w9 << 25)) ^ ((w9 >>> 18) | (w9 << 14)) ^ (w9 >>> 3)) + w8 | 0;
  t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + -1564481375 + w8) | 0;
  d = (d + t1) | 0;
  h = (t1 + (((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
  w9 = (((w7 >>> 17) | (w7 << 15)) ^ ((w7 >>> 19) | (w7 << 13)) ^ (w7 >>> 10)) + w2 + (((w10 >>> 7) | (w10 << 25)) ^ ((w10 >>> 18) | (w10 << 14)) ^ (w10 >>> 3)) + w9 | 0;
  t1 = (g + (((d >>> 6) | (d << 26)) ^ ((d >>> 11) | (d << 21)) ^ ((d >>> 25) | (d << 7))) + ((d & e) ^ (~d & f)) + -1474664885 + w9) | 0;
  c = (c + t1) | 0;
  g = (t1 + (((h >>> 2) | (h << 30)) ^ ((h >>> 13) | (h << 19)) ^ ((h >>> 22) | (h << 10))) + ((h & a) ^ (h & b) ^ (a & b))) | 0;
  w10 = (((w8 >>> 17) | (w8 << 15)) ^ ((w8 >>> 19) | (w8 << 13)) ^ (w8 >>> 10)) + w3 + (((w11 >>> 7) | (w11 << 25)) ^ ((w11 >>> 18) | (w11 << 14)) ^ (w11 >>> 3)) + w10 | 0;
  t1 = (f + (((c >>> 6) | (c << 26)) ^ ((c >>> 11) | (c << 21)) ^ ((c >>> 25) | (c << 7))) + ((c & d) ^ (~c & e)) + -1035236496 + w10) | 0;
  b = (b + t1) | 0;
  f = (t1 + (((g >>> 2) | (g << 30)) ^ ((g >>> 13) | (g << 19)) ^ ((g >>> 22) | (g << 10))) + ((g & h) ^ (g & a) ^ (h & a))) | 0;
  w11 = (((w9 >>> 17) | (w9 << 15)) ^ ((w9 >>> 19) | (w9 << 13)) ^ (w9 >>> 10)) + w4 + (((w12 >>> 7) | (w12 << 25)) ^ ((w12 >>> 18) | (w12 << 14)) ^ (w12 >>> 3)) + w11 | 0;
  t1 = (e + (((b >>> 6) | (b << 26)) ^ ((b >>> 11) | (b << 21)) ^ ((b >>> 25) | (b << 7))) + ((b & c) ^ (~b & d)) + -949202525 + w11) | 0;
  a = (a + t1) | 0;
  e = (t1 + (((f >>> 2) | (f << 30)) ^ ((f >>> 13) | (f << 19)) ^ ((f >>> 22) | (f << 10))) + ((f & g) ^ (f & h) ^ (g & h))) | 0;
  w12 = (((w10 >>> 17) | (w10 << 15)) ^ ((w10 >>> 19) | (w10 << 13)) ^ (w10 >>> 10)) + w5 + (((w13 >>> 7) | (w13 << 25)) ^ ((w13 >>> 18) | (w13 << 14)) ^ (w13 >>> 3)) + w12 | 0;
  t1 = (d + (((a >>> 6) | (a << 26)) ^ ((a >>> 11) | (a << 21)) ^ ((a >>> 25) | (a << 7))) + ((a & b) ^ (~a & c)) + -778901479 + w12) | 0;
  h = (h + t1) | 0;
  d = (t1 + (((e >>> 2) | (e << 30)) ^ ((e >>> 13) | (e << 19)) ^ ((e >>> 22) | (e << 10))) + ((e & f) ^ (e & g) ^ (f & g))) | 0;
  w13 = (((w11 >>> 17) | (w11 << 15)) ^ ((w11 >>> 19) | (w11 << 13)) ^ (w11 >>> 10)) + w6 + (((w14 >>> 7) | (w14 << 25)) ^ ((w14 >>> 18) | (w14 << 14)) ^ (w14 >>> 3)) + w13 | 0;
  t1 = (c + (((h >>> 6) | (h << 26)) ^ ((h >>> 11) | (h << 21)) ^ ((h >>> 25) | (h << 7))) + ((h & a) ^ (~h & b)) + -694614492 + w13) | 0;
  g = (g + t1) | 0;
  c = (t1 + (((d >>> 2) | (d << 30)) ^ ((d >>> 13) | (d << 19)) ^ ((d >>> 22) | (d << 10))) + ((d & e) ^ (d & f) ^ (e & f))) | 0;
  w14 = (((w12 >>> 17) | (w12 << 15)) ^ ((w12 >>> 19) | (w12 << 13)) ^ (w12 >>> 10)) + w7 + (((w15 >>> 7) | (w15 << 25)) ^ ((w15 >>> 18) | (w15 << 14)) ^ (w15 >>> 3)) + w14 | 0;
  t1 = (b + (((g >>> 6) | (g << 26)) ^ ((g >>> 11) | (g << 21)) ^ ((g >>> 25) | (g << 7))) + ((g & h) ^ (~g & a)) + -200395387 + w14) | 0;
  f = (f + t1) | 0;
  b = (t1 + (((c >>> 2) | (c << 30)) ^ ((c >>> 13) | (c << 19)) ^ ((c >>> 22) | (c << 10))) + ((c & d) ^ (c & e) ^ (d & e))) | 0;
  w15 = (((w13 >>> 17) | (w13 << 15)) ^ ((w13 >>> 19) | (w13 << 13)) ^ (w13 >>> 10)) + w8 + (((w0 >>> 7) | (w0 << 25)) ^ ((w0 >>> 18) | (w0 << 14)) ^ (w0 >>> 3)) + w15 | 0;
  t1 = (a + (((f >>> 6) | (f << 26)) ^ ((f >>> 11) | (f << 21)) ^ ((f >>> 25) | (f << 7))) + ((f & g) ^ (~f & h)) + 275423344 + w15) | 0;
  e = (e + t1) | 0;
  a = (t1 + (((b >>> 2) | (b << 30)) ^ ((b >>> 13) | (b << 19)) ^ ((b >>> 22) | (b << 10))) + ((b & c) ^ (b & d) ^ (c & d))) | 0;
  w0 = (((w14 >>> 17) | (w14 << 15)) ^ ((w14 >>> 19) | (w14 << 13)) ^ (w14 >>> 10)) + w9 + (((w1 >>> 7) | (w1 << 25)) ^ ((w1 >>> 18) | (w1 << 14)) ^ (w1 >>> 3)) + w0 | 0;
  t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 430227734 + w0) | 0;
  d = (d + t1) | 0;
  h = (t1 + (((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
  w1 = (((w15 >>> 17) | (w15 << 15)) ^ ((w15 >>> 19) | (w15 << 13)) ^ (w15 >>> 10)) + w10 + (((w2 >>> 7) | (w2 << 25)) ^ ((w2 >>> 18) | (w2 << 14)) ^ (w2 >>> 3)) + w1 | 0;
  t1 = (g + (((d >>> 6) | (d << 26)) ^ ((d >>> 11) | (d << 21)) ^ ((d >>> 25) | (d << 7))) + ((d & e) ^ (~d & f)) + 506948616 + w1) | 0;
  c = (c + t1) | 0;
  g = (t1 + (((h >>> 2) | (h << 30)) ^ ((h >>> 13) | (h << 19)) ^ ((h >>> 22) | (h << 10))) + ((h & a) ^ (h & b) ^ (a & b))) | 0;
  w2 = (((w0 >>> 17) | (w0 << 15)) ^ ((w0 >>> 19) | (w0 << 13)) ^ (w0 >>> 10)) + w11 + (((w3 >>> 7) | (w3 << 25)) ^ ((w3 >>> 18) | (w3 << 14)) ^ (w3 >>> 3)) + w2 | 0;
  t1 = (f + (((c >>> 6) | (c << 26)) ^ ((c >>> 11) | (c << 21)) ^ ((c >>> 25) | (c << 7))) + ((c & d) ^ (~c & e)) + 659060556 + w2) | 0;
  b = (b + t1) | 0;
  f = (t1 + (((g >>> 2) | (g << 30)) ^ ((g >>> 13) | (g << 19)) ^ ((g >>> 22) | (g << 10))) + ((g & h) ^ (g & a) ^ (h & a))) | 0;
  w3 = (((w1 >>> 17) | (w1 << 15)) ^ ((w1 >>> 19) | (w1 << 13)) ^ (w1 >>> 10)) + w12 + (((w4 >>> 7) | (w4 << 25)) ^ ((w4 >>> 18) | (w4 << 14)) ^ (w4 >>> 3)) + w3 | 0;
  t1 = (e + (((b >>> 6) | (b << 26)) ^ ((b >>> 11) | (b << 21)) ^ ((b >>> 25) | (b << 7))) + ((b & c) ^ (~b & d)) + 883997877 + w3) | 0;
  a = (a + t1) | 0;
  e = (t1 + (((f >>> 2) | (f << 30)) ^ ((f >>> 13) | (f << 19)) ^ ((f >>> 22) | (f << 10))) + ((f & g) ^ (f & h) ^ (g & h))) | 0;
  w4 = (((w2 >>> 17) | (w2 << 15)) ^ ((w2 >>> 19) | (w2 << 13)) ^ (w2 >>> 10)) + w13 + (((w5 >>> 7) | (w5 << 25)) ^ ((w5 >>> 18) | (w5 << 14)) ^ (w5 >>> 3)) + w4 | 0;
  t1 = (d + (((a >>> 6) | (a << 26)) ^ ((a >>> 11) | (a << 21)) ^ ((a >>> 25) | (a << 7))) + ((a & b) ^ (~a & c)) + 958139571 + w4) | 0;
  h = (h + t1) | 0;
  d = (t1 + (((e >>> 2) | (e << 30)) ^ ((e >>> 13) | (e << 19)) ^ ((e >>> 22) | (e << 10))) + ((e & f) ^ (e & g) ^ (f & g))) | 0;
  w5 = (((w3 >>> 17) | (w3 << 15)) ^ ((w3 >>> 19) | (w3 << 13)) ^ (w3 >>> 10)) + w14 + (((w6 >>> 7) | (w6 << 25)) ^ ((w6 >>> 18) | (w6 << 14)) ^ (w6 >>> 3)) + w5 | 0;
  t1 = (c + (((h >>> 6) | (h << 26)) ^ ((h >>> 11) | (h << 21)) ^ ((h >>> 25) | (h << 7))) + ((h & a) ^ (~h & b)) + 1322822218 + w5) | 0;
  g = (g + t1) | 0;
  c = (t1 + (((d >>> 2) | (d << 30)) ^ ((d >>> 13) | (d << 19)) ^ ((d >>> 22) | (d << 10))) + ((d & e) ^ (d & f) ^ (e & f))) | 0;
  w6 = (((w4 >>> 17) | (w4 << 15)) ^ ((w4 >>> 19) | (w4 << 13)) ^ (w4 >>> 10)) + w15 + (((w7 >>> 7) | (w7 << 25)) ^ ((w7 >>> 18) | (w7 << 14)) ^ (w7 >>> 3)) + w6 | 0;
  t1 = (b + (((g >>> 6) | (g << 26)) ^ ((g >>> 11) | (g << 21)) ^ ((g >>> 25) | (g << 7))) + ((g & h) ^ (~g & a)) + 1537002063 + w6) | 0;
  f = (f + t1) | 0;
  b = (t1 + (((c >>> 2) | (c << 30)) ^ ((c >>> 13) | (c << 19)) ^ ((c >>> 22) | (c << 10))) + ((c & d) ^ (c & e) ^ (d & e))) | 0;
  w7 = (((w5 >>> 17) | (w5 << 15)) ^ ((w5 >>> 19) | (w5 << 13)) ^ (w5 >>> 10)) + w0 + (((w8 >>> 7) | (w8 << 25)) ^ ((w8 >>> 18) | (w8 << 14)) ^ (w8 >>> 3)) + w7 | 0;
  t1 = (a + (((f >>> 6) | (f << 26)) ^ ((f >>> 11) | (f << 21)) ^ ((f >>> 25) | (f << 7))) + ((f & g) ^ (~f & h)) + 1747873779 + w7) | 0;
  e = (e + t1) | 0;
  a = (t1 + (((b >>> 2) | (b << 30)) ^ ((b >>> 13) | (b << 19)) ^ ((b >>> 22) | (b << 10))) + ((b & c) ^ (b & d) ^ (c & d))) | 0;
  w8 = (((w6 >>> 17) | (w6 << 15)) ^ ((w6 >>> 19) | (w6 << 13)) ^ (w6 >>> 10)) + w1 + (((w9 >>> 7) | (w9 << 25)) ^ ((w9 >>> 18) | (w9 << 14)) ^ (w9 >>> 3)) + w8 | 0;
  t1 = (h + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) + ((e & f) ^ (~e & g)) + 1955562222 + w8) | 0;
  d = (d + t1) | 0;
  h = (t1 + (((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
  w9 = (((w7 >>> 17) | (w7 << 15)) ^ ((w7 >>> 19) | (w7 << 13)) ^ (w7 >>> 10)) + w2 + (((w10 >>> 7) | (w10 << 25)) ^ ((w10 >>> 18) | (w10 << 14)) ^ (w10 >>> 3)) + w9 | 0;
  t1 = (g + (((d >>> 6) | (d << 26)) ^ ((d >>> 11) | (d << 21)) ^ ((d >>> 25) | (d << 7))) + ((d & e) ^ (~d & f)) + 2024104815 + w9) | 0;
  c = (c + t1) | 0;
  g = (t1 + (((h >>> 2) | (h << 30)) ^ ((h >>> 13) | (h << 19)) ^ ((h >>> 22) | (h << 10))) + ((h & a) ^ (h & b) ^ (a & b))) | 0;
  w10 = (((w8 >>> 17) | (w8 << 15)) ^ ((w8 >>> 19) | (w8 << 13)) ^ (w8 >>> 10)) + w3 + (((w11 >>> 7) | (w11 << 25)) ^ ((w11 >>> 18) | (w11 << 14)) ^ (w11 >>> 3)) + w10 | 0;
  t1 = (f + (((c >>> 6) | (c << 26)) ^ ((c >>> 11) | (c << 21)) ^ ((c >>> 25) | (c << 7))) + ((c & d) ^ (~c & e)) + -2067236844 + w10) | 0;
  b = (b + t1) | 0;
  f = (t1 + (((g >>> 2) | (g << 30)) ^ ((g >>> 13) | (g << 19)) ^ ((g >>> 22) | (g << 10))) + ((g & h) ^ (g & a) ^ (h & a))) | 0;
  w11 = (((w9 >>> 17) | (w9 << 15)) ^ ((w9 >>> 19) | (w9 << 13)) ^ (w9 >>> 10)) + w4 + (((w12 >>> 7) | (w12 << 25)) ^ ((w12 >>> 18) | (w12 << 14)) ^ (w12 >>> 3)) + w11 | 0;
  t1 = (e + (((b >>> 6) | (b << 26)) ^ ((b >>> 11) | (b << 21)) ^ ((b >>> 25) | (b << 7))) + ((b & c) ^ (~b & d)) + -1933114872 + w11) | 0;
  a = (a + t1) | 0;
  e = (t1 + (((f >>> 2) | (f << 30)) ^ ((f >>> 13) | (f << 19)) ^ ((f >>> 22) | (f << 10))) + ((f & g) ^ (f & h) ^ (g & h))) | 0;
  w12 = (((w10 >>> 17) | (w10 << 15)) ^ ((w10 >>> 19) | (w10 << 13)) ^ (w10 >>> 10)) + w5 + (((w13 >>> 7) | (w13 << 25)) ^ ((w13 >>> 18) | (w13 << 14)) ^ (w13 >>> 3)) + w12 | 0;
  t1 = (d + (((a >>> 6) | (a << 26)) ^ ((a >>> 11) | (a << 21)) ^ ((a >>> 25) | (a << 7))) + ((a & b) ^ (~a & c)) + -1866530822 + w12) | 0;
  h = (h + t1) | 0;
  d = (t1 + (((e >>> 2) | (e << 30)) ^ ((e >>> 13) | (e << 19)) ^ ((e >>> 22) | (e << 10))) + ((e & f) ^ (e & g) ^ (f & g))) | 0;
  w13 = (((w11 >>> 17) | (w11 << 15)) ^ ((w11 >>> 19) | (w11 << 13)) ^ (w11 >>> 10)) + w6 + (((w14 >>> 7) | (w14 << 25)) ^ ((w14 >>> 18) | (w14 << 14)) ^ (w14 >>> 3)) + w13 | 0;
  t1 = (c + (((h >>> 6) | (h << 26)) ^ ((h >>> 11) | (h << 21)) ^ ((h >>> 25) | (h << 7))) + ((h & a) ^ (~h & b)) + -1538233109 + w13) | 0;
  g = (g + t1) | 0;
  c = (t1 + (((d >>> 2) | (d << 30)) ^ ((d >>> 13) | (d << 19)) ^ ((d >>> 22) | (d << 10))) + ((d & e) ^ (d & f) ^ (e & f))) | 0;
  w14 = (((w12 >>> 17) | (w12 << 15)) ^ ((w12 >>> 19) | (w12 << 13)) ^ (w12 >>> 10)) + w7 + (((w15 >>> 7) | (w15 << 25)) ^ ((w15 >>> 18) | (w15 << 14)) ^ (w15 >>> 3)) + w14 | 0;
  t1 = (b + (((g >>> 6) | (g << 26)) ^ ((g >>> 11) | (g << 21)) ^ ((g >>> 25) | (g << 7))) + ((g & h) ^ (~g & a)) + -1090935817 + w14) | 0;
  f = (f + t1) | 0;
  b = (t1 + (((c >>> 2) | (c << 30)) ^ ((c >>> 13) | (c << 19)) ^ ((c >>> 22) | (c << 10))) + ((c & d) ^ (c & e) ^ (d & e))) | 0;
  w15 = (((w13 >>> 17) | (w13 << 15)) ^ ((w13 >>> 19) | (w13 << 13)) ^ (w13 >>> 10)) + w8 + (((w0 >>> 7) | (w0 << 25)) ^ ((w0 >>> 18) | (w0 << 14)) ^ (w0 >>> 3)) + w15 | 0;
  t1 = (a + (((f >>> 6) | (f << 26)) ^ ((f >>> 11) | (f << 21)) ^ ((f >>> 25) | (f << 7))) + ((f & g) ^ (~f & h)) + -965641998 + w15) | 0;
  e = (e + t1) | 0;
  a = (t1 + (((b >>> 2) | (b << 30)) ^ ((b >>> 13) | (b << 19)) ^ ((b >>> 22) | (b << 10))) + ((b & c) ^ (b & d) ^ (c & d))) | 0;
  var h0 = (st[0] + a) | 0;
  if (all) {
    H[0] = h0; H[1] = (st[1] + b) | 0; H[2] = (st[2] + c) | 0; H[3] = (st[3] + d) | 0;
    H[4] = (st[4] + e) | 0; H[5] = (st[5] + f) | 0; H[6] = (st[6] + g) | 0; H[7] = (st[7] + h) | 0;
  }
  return h0;
}

/* Scans n = start, start + step, ... for at most maxTries counters.
 * Returns the decimal string of the first solution, or null. */
function solvePuzzle(challenge, index, bits, start, step, maxTries) {
  var h = new PuzzleHasher(challenge, index);
  var n = start || 0, s = step || 1, left = maxTries === undefined ? Infinity : maxTries;
  while (left > 0 && n <= Number.MAX_SAFE_INTEGER) {
    var count = Math.min(left, CHUNK);
    var found = h.scan(n, count, s, bits);
    if (found >= 0) return String(found);
    n += count * s;
    left -= count;
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
      if (!(n + CHUNK * step <= Number.MAX_SAFE_INTEGER)) {
        job = null;
        scope.postMessage({ type: 'error', message: 'counter space exhausted' });
        return;
      }
      var found = h.scan(n, CHUNK, step, bits);
      if (found >= 0) {
        j.hashes += done + (found - n) / step + 1;
        job = null;
        scope.postMessage({ type: 'solution', index: j.index, nonce: String(found), hashes: j.hashes });
        return;
      }
      n += CHUNK * step;
      done += CHUNK;
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
