// The waiting page's pure logic: taking the invite code and the enqueue
// token out of the URL's fragment (what stays in the address bar, what is
// dropped, what is kept), and the words for each refusal of a code.
// Run: node --test static/test/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { takeFragment, inviteText, waitingText } = require('../waiting.js');

const JWT = 'eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl';

test('a fragment with nothing of ours is left alone', () => {
  for (const hash of ['', '#', '#top', '#a=1&b=2', '#sluice_invitex=1', '#SLUICE_INVITE=x']) {
    const f = takeFragment(hash);
    assert.equal(f.found, false, hash);
    assert.equal(f.invite, null);
    assert.equal(f.enqueue, null);
  }
  assert.equal(takeFragment('#a=1&b=2').rest, 'a=1&b=2');
});

test('the code and the token are taken, any other fragment kept as it was', () => {
  let f = takeFragment('#sluice_invite=abcdefghijklmnopqrstuvwxyz');
  assert.deepEqual(f, { invite: 'abcdefghijklmnopqrstuvwxyz', enqueue: null, rest: '', found: true });
  f = takeFragment(`#seats&sluice_enqueue=${JWT}&x=%20y&sluice_invite=ABCD-EFGH`);
  assert.equal(f.enqueue, JWT);
  assert.equal(f.invite, 'ABCD-EFGH');
  assert.equal(f.rest, 'seats&x=%20y');
  // Percent-encoded and plus-encoded spaces, as a mail client may write.
  assert.equal(takeFragment('#sluice_invite=abcd%20efgh').invite, 'abcd efgh');
  assert.equal(takeFragment('#sluice_invite=+abcd+').invite, 'abcd');
});

test('a bad value is dropped from the address bar and not kept', () => {
  for (const hash of [
    '#sluice_invite=', '#sluice_invite', '#sluice_invite=%E0%A4%A', `#sluice_invite=${'a'.repeat(129)}`,
    '#sluice_enqueue=', '#sluice_enqueue=not-a-jwt', '#sluice_enqueue=a.b', '#sluice_enqueue=a.b.c.d',
    '#sluice_enqueue=a.b.c%3Cscript%3E', `#sluice_enqueue=a.b.${'c'.repeat(4096)}`,
  ]) {
    const f = takeFragment(hash);
    assert.equal(f.found, true, hash);
    assert.equal(f.invite, null, hash);
    assert.equal(f.enqueue, null, hash);
    assert.equal(f.rest, '', hash);
  }
  assert.equal(takeFragment(`#sluice_invite=${'a'.repeat(128)}`).invite, 'a'.repeat(128));
});

test('the last of a repeated key wins', () => {
  assert.equal(takeFragment('#sluice_invite=first&sluice_invite=second').invite, 'second');
});

test('each refusal of a code has its plain words', () => {
  assert.equal(inviteText('required'), 'invite_required');
  for (const r of ['unknown', 'malformed']) assert.equal(inviteText(r), 'invite_unknown');
  for (const r of ['exhausted', 'revoked', 'expired']) assert.equal(inviteText(r), 'invite_used');
  assert.equal(inviteText(undefined), 'invite_unknown');
});

test('a visitor waiting for a random room\'s next draw is told so, not a place', () => {
  assert.deepEqual(waitingText({ state: 'waiting', position: 7, awaiting_draw: true }), ['draw_waiting', {}]);
  assert.deepEqual(waitingText({ state: 'waiting', position: 1, awaiting_draw: true }), ['draw_waiting', {}]);
  assert.deepEqual(waitingText({ state: 'waiting', position: 1 }), ['next', {}]);
  assert.deepEqual(waitingText({ state: 'waiting', position: 12 }), ['waiting', { position: (12).toLocaleString() }]);
});
