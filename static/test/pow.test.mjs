// Tests of the browser proof-of-work code against vectors written by the
// Rust verifier (static/test/vectors.json, from
// `cargo run -p sluice-pow --example js_vectors`).
// Run: node --test static/test/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import vm from 'node:vm';

const require = createRequire(import.meta.url);
const here = new URL('.', import.meta.url);
const pow = require('../pow-worker.js');
const solver = require('../pow-solver.js');
const vectors = JSON.parse(readFileSync(new URL('vectors.json', here), 'utf8'));
const workerSource = readFileSync(new URL('../pow-worker.js', here), 'utf8');

const toHex = (bytes) => Buffer.from(bytes).toString('hex');
const puzzleHashHex = (challenge, index, counter) =>
  toHex(pow.wordsToBytes(new pow.PuzzleHasher(challenge, index).hash(Number(counter))));

test('SHA-256 agrees with Rust on inputs of every block-boundary length', () => {
  assert.ok(vectors.sha256.length >= 10);
  for (const v of vectors.sha256) {
    const input = Uint8Array.from(Buffer.from(v.input_hex, 'hex'));
    assert.equal(input.length, v.length);
    assert.equal(toHex(pow.sha256(input)), v.sha256, `length ${v.length}`);
  }
  for (const len of [55, 56, 63, 64, 65]) assert.ok(vectors.sha256.some((v) => v.length === len));
});

test('puzzle hashes and leading zero bits agree with Rust', () => {
  for (const c of vectors.challenges) {
    for (const p of c.puzzle_hashes) {
      const words = new pow.PuzzleHasher(c.challenge, p.index).hash(Number(p.solution));
      assert.equal(toHex(pow.wordsToBytes(words)), p.hash);
      assert.equal(pow.leadingZeroBits(words), p.leading_zero_bits);
      assert.equal(pow.leadingZeroBits(pow.wordsToBytes(words)), p.leading_zero_bits);
      assert.ok(p.leading_zero_bits >= c.difficulty_bits);
      assert.ok(pow.meetsDifficulty(words, c.difficulty_bits));
    }
    for (const p of c.probes) {
      const words = new pow.PuzzleHasher(c.challenge, p.index).hash(Number(p.counter));
      assert.equal(toHex(pow.wordsToBytes(words)), p.hash, `probe ${p.counter}`);
      assert.equal(pow.leadingZeroBits(words), p.leading_zero_bits);
      assert.equal(pow.meetsDifficulty(words, c.difficulty_bits), p.leading_zero_bits >= c.difficulty_bits);
    }
  }
});

test('the JS solver finds exactly the counters the Rust solver found', () => {
  // Both scan from 0 with step 1, so they must stop at the same (smallest)
  // counter: every hash below it failed in both implementations too.
  for (const c of vectors.challenges) {
    for (let i = 0; i < c.puzzles; i++) {
      assert.equal(pow.solvePuzzle(c.challenge, i, c.difficulty_bits, 0, 1), c.solutions[i], `${c.room} #${i}`);
    }
  }
});

test('prefix-state hashing equals a plain SHA-256 of the whole input', () => {
  for (const len of [1, 40, 57, 60, 63, 64, 65, 100, 127, 128, 200]) {
    const challenge = 'c'.repeat(len);
    for (const index of [0, 9, 63]) {
      for (const n of [0, 5, 10, 123456789, 2 ** 53 - 1]) {
        const want = createHash('sha256').update(`${challenge}:${index}:${n}`).digest('hex');
        assert.equal(puzzleHashHex(challenge, index, n), want, `${len} ${index} ${n}`);
      }
    }
  }
});

test('meetsDifficulty matches leadingZeroBits at every threshold', () => {
  const samples = [
    [0, 0, 0, 0, 0, 0, 0, 0],
    [1, -1, 0, 0, 0, 0, 0, 0],
    [0, 0x00008000, 0, 0, 0, 0, 0, 0],
    [-1, 0, 0, 0, 0, 0, 0, 0],
    [0x0fffffff, 0, 0, 0, 0, 0, 0, 0],
  ].map((w) => Int32Array.from(w));
  for (const s of samples) {
    const lz = pow.leadingZeroBits(s);
    for (let b = 0; b <= 80; b++) assert.equal(pow.meetsDifficulty(s, b), lz >= b, `${s} ${b}`);
  }
});

// === the worker's message loop, run in a vm context shaped like a worker ===

function startWorker() {
  const ctx = {
    WorkerGlobalScope: function WorkerGlobalScope() {},
    // No MessageChannel: the worker falls back to setTimeout to yield, and an
    // open channel would keep Node's event loop (and the test run) alive.
    TextEncoder, setTimeout, performance, Math, String, Number, Int32Array, Uint8Array, Date,
  };
  const self = Object.create(ctx.WorkerGlobalScope.prototype);
  const outbox = [];
  let listener = null;
  self.postMessage = (m) => { outbox.push(m); if (listener) listener(m); };
  ctx.self = self;
  vm.createContext(ctx);
  vm.runInContext(workerSource, ctx, { filename: 'pow-worker.js' });
  return {
    send: (data) => self.onmessage({ data }),
    outbox,
    onMessage: (fn) => { listener = fn; },
    close: () => {
      self.onmessage({ data: { type: 'stop' } });
    },
  };
}

test('worker: solves a puzzle, reports progress, and stops when told', async () => {
  const c = vectors.challenges.find((x) => x.difficulty_bits >= 9);
  const w = startWorker();
  const solution = await new Promise((resolve) => {
    w.onMessage((m) => { if (m.type === 'solution') resolve(m); });
    w.send({ type: 'solve', challenge: c.challenge, index: 1, bits: c.difficulty_bits, start: 0, step: 1 });
  });
  assert.equal(solution.index, 1);
  assert.equal(solution.nonce, c.solutions[1]);
  assert.equal(solution.hashes, Number(c.solutions[1]) + 1);

  // A puzzle too hard to finish: progress arrives, then stop silences it.
  const progress = await new Promise((resolve) => {
    w.onMessage((m) => { if (m.type === 'progress') resolve(m); });
    w.send({ type: 'solve', challenge: c.challenge, index: 0, bits: 60 });
  });
  assert.ok(progress.hashes > 0 && progress.next === progress.hashes);
  w.send({ type: 'stop' });
  await new Promise((r) => setTimeout(r, 20));
  const count = w.outbox.length;
  await new Promise((r) => setTimeout(r, 120));
  assert.equal(w.outbox.length, count, 'no messages after stop');
  w.close();
});

// === the page coordinator, with a fake Worker running the real worker code ===

function fakeEnv({ cores = 4, hidden = false } = {}) {
  const listeners = { doc: {}, win: {} };
  const on = (bag) => (type, fn) => { (bag[type] ||= new Set()).add(fn); };
  const off = (bag) => (type, fn) => { bag[type]?.delete(fn); };
  const created = [];
  class FakeWorker {
    constructor(url) {
      this.url = url;
      this.terminated = false;
      this.inner = startWorker();
      this.inner.onMessage((m) => { if (!this.terminated) queueMicrotask(() => this.onmessage?.({ data: m })); });
      created.push(this);
    }
    postMessage(data) { if (!this.terminated) this.inner.send(data); }
    terminate() { this.terminated = true; this.inner.close(); }
  }
  const doc = { hidden, addEventListener: on(listeners.doc), removeEventListener: off(listeners.doc) };
  const win = { addEventListener: on(listeners.win), removeEventListener: off(listeners.win) };
  const fire = (bag, type) => { for (const fn of bag[type] || []) fn(); };
  return {
    env: { Worker: FakeWorker, document: doc, window: win, navigator: { hardwareConcurrency: cores } },
    created,
    setHidden: (h) => { doc.hidden = h; fire(listeners.doc, 'visibilitychange'); },
    pagehide: () => fire(listeners.win, 'pagehide'),
    listenerCount: () => Object.values(listeners).flatMap((b) => Object.values(b)).reduce((n, s) => n + s.size, 0),
  };
}

test('workerCount is clamp(hardwareConcurrency - 1, 1, 8)', () => {
  const n = (hc) => solver.workerCount({ navigator: { hardwareConcurrency: hc } });
  assert.equal(n(1), 1);
  assert.equal(n(2), 1);
  assert.equal(n(4), 3);
  assert.equal(n(64), 8);
  assert.equal(n(undefined), 1);
});

test('solveChallenge: every puzzle solved, progress honest, workers terminated', async () => {
  const c = vectors.challenges.find((x) => x.puzzles === 4 && x.difficulty_bits === 8);
  const f = fakeEnv({ cores: 4 });
  const seen = [];
  const sols = await solver.solveChallenge(c, { workerUrl: '/w.js', onProgress: (p) => seen.push(p) }, f.env);
  // Each worker scans its puzzle from 0: the same smallest counters as Rust.
  assert.deepEqual(sols, c.solutions);
  assert.equal(f.created.length, 3);
  assert.ok(f.created.every((w) => w.terminated && w.url === '/w.js'));
  // Progress is solved puzzles / k: never backwards, ends at 1.
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].solved >= seen[i - 1].solved);
  for (const p of seen) assert.equal(p.fraction, p.solved / 4);
  assert.deepEqual([...new Set(seen.map((p) => p.solved))].filter((s) => s > 0), [1, 2, 3, 4]);
  assert.equal(seen.at(-1).fraction, 1);
  assert.equal(f.listenerCount(), 0, 'listeners removed');
});

test('solveChallenge: one worker while the tab is hidden', async () => {
  const c = vectors.challenges.find((x) => x.puzzles === 4 && x.difficulty_bits === 6);
  const f = fakeEnv({ cores: 8, hidden: true });
  const sols = await solver.solveChallenge(c, {}, f.env);
  assert.deepEqual(sols, c.solutions);
  assert.equal(f.created.length, 1);
});

test('solveChallenge: hiding mid-solve drops to one worker and still finishes', async () => {
  const c = vectors.challenges.find((x) => x.puzzles === 4 && x.difficulty_bits === 8);
  const f = fakeEnv({ cores: 4 });
  const p = solver.solveChallenge(c, {}, f.env);
  f.setHidden(true);
  const live = f.created.filter((w) => !w.terminated).length;
  assert.equal(live, 1);
  f.setHidden(false);
  const sols = await p;
  assert.deepEqual(sols, c.solutions);
  assert.ok(f.created.every((w) => w.terminated));
});

test('solveChallenge: abort and pagehide stop every worker', async () => {
  const hard = { challenge: vectors.challenges[0].challenge, puzzles: 4, difficulty_bits: 40 };
  const f = fakeEnv({ cores: 4 });
  const ac = new AbortController();
  const p = solver.solveChallenge(hard, { signal: ac.signal }, f.env);
  setTimeout(() => ac.abort(), 30);
  await assert.rejects(p, (e) => e.name === 'AbortError');
  assert.ok(f.created.length === 3 && f.created.every((w) => w.terminated));

  const g = fakeEnv({ cores: 3 });
  const q = solver.solveChallenge(hard, {}, g.env);
  setTimeout(() => g.pagehide(), 30);
  await assert.rejects(q, (e) => e.name === 'AbortError');
  assert.ok(g.created.every((w) => w.terminated));
  assert.equal(g.listenerCount(), 0);
});
