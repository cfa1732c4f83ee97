// The fast scan of the worker (odometer counters, precomputed rounds,
// unrolled compression) against a plain SHA-256: every counter it skips
// must fail and the one it returns must pass, across digit-count
// boundaries, with steps, and for tails that need two blocks.
// Run: node --test static/test/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { createHash } from 'node:crypto';

const require = createRequire(import.meta.url);
const pow = require('../pow-worker.js');

const lzb = (buf) => {
  let n = 0;
  for (const b of buf) { if (b === 0) { n += 8; continue; } return n + Math.clz32(b) - 24; }
  return n;
};
const bitsOf = (challenge, index, n) =>
  lzb(createHash('sha256').update(`${challenge}:${index}:${n}`).digest());
// The first counter in start, start+step, ... (count of them) with `bits`.
const reference = (challenge, index, bits, start, step, count) => {
  for (let i = 0, n = start; i < count; i++, n += step) if (bitsOf(challenge, index, n) >= bits) return n;
  return -1;
};

test('scan finds the first solution, across digit-count boundaries', () => {
  // Tails of every length mod 64, including ones whose counters spill
  // into a second block.
  for (let len = 90; len < 90 + 64; len += 3) {
    const challenge = 'q'.repeat(len);
    for (const [start, step] of [[0, 1], [95, 1], [990, 1], [99990, 1], [7, 3], [999999990, 1]]) {
      const h = new pow.PuzzleHasher(challenge, 5);
      const want = reference(challenge, 5, 4, start, step, 200);
      assert.equal(h.scan(start, 200, step, 4), want, `len ${len} start ${start} step ${step}`);
    }
  }
});

test('scan reports -1 when no counter qualifies, and hash() still agrees afterwards', () => {
  const challenge = 'z'.repeat(103);
  const h = new pow.PuzzleHasher(challenge, 3);
  assert.equal(h.scan(0, 5000, 1, 40), -1);
  for (const n of [0, 9, 10, 4999, 123456]) {
    const want = createHash('sha256').update(`${challenge}:3:${n}`).digest('hex');
    assert.equal(Buffer.from(pow.wordsToBytes(h.hash(n))).toString('hex'), want);
  }
});

test('difficulties above 32 bits check the second word', () => {
  const challenge = 'd'.repeat(100);
  const h = new pow.PuzzleHasher(challenge, 0);
  // No counter in a small range has 33 zero bits; the check must not pass
  // on the first word alone.
  assert.equal(h.scan(0, 3000, 1, 33), reference(challenge, 0, 33, 0, 1, 3000));
});
