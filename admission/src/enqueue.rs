//! Enqueue tokens: the origin's signed word for who its visitor is, so a
//! place in line can be bound to the origin's own account (API.md wave 2).
//!
//! # Vocabulary
//!
//! - **enqueue token**: a compact JWS the origin hands its logged-in
//!   visitor, signed with a key the room trusts: HS256 with a shared
//!   secret, or EdDSA (Ed25519) with a key of the origin's JWKS. Claims:
//!   `aud` = the room, `sub` = the origin's account id, `exp` (at most
//!   [`EnqueueVerifier`]'s `max_ttl` ahead: the token is short-lived),
//!   optional `lane`.
//! - **account key**: SHA-256 of `room` and `sub`, hex: what the stores
//!   keep (an account id never sits in Redis in clear).
//! - **binding**: account key → the place (seq, epoch, visitor) its first
//!   join got ([`AccountPlaces`]); a join of the same account, from any
//!   device or gateway, gets that place again, never a second one.
//!
//! # Invariants (tested by `tests/tests/enqueue.rs`)
//!
//! 1. A forged, expired, too long-lived, other-room or malformed token is
//!    refused before any work is looked at, and binds nothing.
//! 2. One place per account per room: of any number of joins of one
//!    account racing through any number of gateways, one takes a place;
//!    the others get that place ([`AccountPlaces::reserve`] is one atomic
//!    step, a `SET NX` on Redis).
//!
//! Own code for the binding (four small atomic steps over the connection
//! every store shares); the token itself is verified by `jsonwebtoken`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use redis::Script;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use sluice_redis::RedisConn;

use crate::error::AdmissionError;
use crate::store::Result;

/// Longest token accepted (bytes).
pub const MAX_ENQUEUE_TOKEN_LEN: usize = 4096;
/// Longest account id (`sub`) accepted.
pub const MAX_SUB_LEN: usize = 256;

/// Why an enqueue token was refused (`reason` of `enqueue_token_invalid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnqueueError {
    /// Not a compact JWS, too long, or claims of the wrong shape.
    Malformed,
    /// An algorithm the room does not trust for it.
    Algorithm,
    /// No trusted key has its `kid`.
    UnknownKey,
    /// The signature does not verify.
    BadSignature,
    /// Past its `exp`.
    Expired,
    /// `exp` further ahead than the room's `max_ttl`.
    TooLongLived,
    /// Its `aud` is another room.
    WrongRoom,
}

impl EnqueueError {
    /// The reason's word in the problem answer.
    pub fn reason(self) -> &'static str {
        match self {
            EnqueueError::Malformed => "malformed",
            EnqueueError::Algorithm => "algorithm",
            EnqueueError::UnknownKey => "unknown_key",
            EnqueueError::BadSignature => "bad_signature",
            EnqueueError::Expired => "expired",
            EnqueueError::TooLongLived => "too_long_lived",
            EnqueueError::WrongRoom => "wrong_room",
        }
    }
}

/// A verified token's claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnqueueClaims {
    /// The origin's account id.
    pub sub: String,
    /// The lane it names, if any.
    pub lane: Option<String>,
    /// Expiry (unix seconds).
    pub exp: u64,
}

#[derive(Deserialize)]
struct RawClaims {
    sub: String,
    exp: u64,
    #[serde(default)]
    lane: Option<String>,
}

/// Ed25519 keys of an origin's JWKS, by `kid`.
pub type JwksKeys = HashMap<String, DecodingKey>;

/// Most keys taken from one JWKS.
pub const MAX_JWKS_KEYS: usize = 64;

/// The Ed25519 keys of a JWKS document. `strict` (a file the operator
/// wrote): any key without a `kid` or not Ed25519 is an error, naming it.
/// Not strict (a JWKS fetched from the origin, which may publish other
/// keys for other uses): such keys are skipped. No usable key is an error
/// either way.
pub fn jwks_keys(text: &str, strict: bool) -> std::result::Result<JwksKeys, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("JWKS: {e}"))?;
    let mut keys = JwksKeys::new();
    for jwk in set.keys.iter().take(MAX_JWKS_KEYS) {
        let Some(kid) = jwk.common.key_id.clone() else {
            if strict {
                return Err("JWKS: every key needs a kid".into());
            }
            continue;
        };
        let okp = matches!(
            &jwk.algorithm,
            jsonwebtoken::jwk::AlgorithmParameters::OctetKeyPair(p)
                if p.curve == jsonwebtoken::jwk::EllipticCurve::Ed25519
        );
        if !okp {
            if strict {
                return Err(format!("JWKS: key {kid} is not an Ed25519 (OKP) key"));
            }
            continue;
        }
        match DecodingKey::from_jwk(jwk) {
            Ok(key) => {
                keys.insert(kid, key);
            }
            Err(e) if strict => return Err(format!("JWKS key {kid}: {e}")),
            Err(_) => {}
        }
    }
    if keys.is_empty() {
        return Err("JWKS: no Ed25519 key with a kid".into());
    }
    Ok(keys)
}

/// The keys a room trusts for enqueue tokens.
#[derive(Clone)]
pub struct EnqueueVerifier {
    hmac: Option<DecodingKey>,
    eddsa: JwksKeys,
    /// EdDSA keys also come from a JWKS fetched elsewhere (the caller
    /// passes them to [`EnqueueVerifier::verify_with`]).
    remote: bool,
    max_ttl: Duration,
}

impl std::fmt::Debug for EnqueueVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnqueueVerifier")
            .field("hmac", &self.hmac.is_some())
            .field("eddsa_kids", &self.eddsa.keys().collect::<Vec<_>>())
            .field("remote", &self.remote)
            .field("max_ttl", &self.max_ttl)
            .finish()
    }
}

impl EnqueueVerifier {
    /// Trusts an HS256 secret (at least 32 bytes), the Ed25519 keys of a
    /// JWKS document (each with a `kid`), and/or (`remote_jwks`) the keys
    /// of a JWKS fetched from the origin and passed at each verification;
    /// at least one of them.
    pub fn new(
        hmac_secret: Option<&[u8]>,
        jwks_json: Option<&str>,
        remote_jwks: bool,
        max_ttl: Duration,
    ) -> std::result::Result<Self, String> {
        let hmac = match hmac_secret {
            Some(s) if s.len() < 32 => return Err("the HMAC secret needs at least 32 bytes".into()),
            Some(s) => Some(DecodingKey::from_secret(s).map_err(|e| format!("HMAC secret: {e}"))?),
            None => None,
        };
        let eddsa = match jwks_json {
            Some(text) => jwks_keys(text, true)?,
            None => JwksKeys::new(),
        };
        if hmac.is_none() && eddsa.is_empty() && !remote_jwks {
            return Err("an HMAC secret or a JWKS is needed".into());
        }
        if max_ttl.is_zero() {
            return Err("max_ttl must be positive".into());
        }
        Ok(Self {
            hmac,
            eddsa,
            remote: remote_jwks,
            max_ttl,
        })
    }

    /// Verifies `token` for `room` at `now_s` with the keys configured.
    pub fn verify(
        &self,
        token: &str,
        room: &str,
        now_s: u64,
    ) -> std::result::Result<EnqueueClaims, EnqueueError> {
        self.verify_with(token, room, now_s, None)
    }

    /// Verifies `token` for `room` at `now_s`, an EdDSA token's key also
    /// looked up in `fetched` (the origin's JWKS as last fetched, in a
    /// verifier made with `remote_jwks`).
    pub fn verify_with(
        &self,
        token: &str,
        room: &str,
        now_s: u64,
        fetched: Option<&JwksKeys>,
    ) -> std::result::Result<EnqueueClaims, EnqueueError> {
        if token.len() > MAX_ENQUEUE_TOKEN_LEN
            || !token.is_ascii()
            || token.bytes().filter(|b| *b == b'.').count() != 2
        {
            return Err(EnqueueError::Malformed);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| EnqueueError::Malformed)?;
        let key = match header.alg {
            Algorithm::HS256 => self.hmac.as_ref().ok_or(EnqueueError::Algorithm)?,
            Algorithm::EdDSA if self.eddsa.is_empty() && !self.remote => {
                return Err(EnqueueError::Algorithm);
            }
            Algorithm::EdDSA => {
                let kid = header.kid.as_deref().ok_or(EnqueueError::UnknownKey)?;
                match self.eddsa.get(kid) {
                    Some(key) => key,
                    None if self.remote => fetched
                        .and_then(|keys| keys.get(kid))
                        .ok_or(EnqueueError::UnknownKey)?,
                    None => return Err(EnqueueError::UnknownKey),
                }
            }
            _ => return Err(EnqueueError::Algorithm),
        };
        let mut v = Validation::new(header.alg);
        v.set_audience(&[room]);
        v.set_required_spec_claims(&["exp", "sub", "aud"]);
        v.leeway = 5;
        // expiry is checked below against `now_s`, the caller's clock
        v.validate_exp = false;
        let data = jsonwebtoken::decode::<RawClaims>(token, key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::InvalidSignature => EnqueueError::BadSignature,
                K::InvalidAudience => EnqueueError::WrongRoom,
                K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => {
                    EnqueueError::Algorithm
                }
                _ => EnqueueError::Malformed,
            }
        })?;
        let c = data.claims;
        if c.exp <= now_s {
            return Err(EnqueueError::Expired);
        }
        if c.exp - now_s > self.max_ttl.as_secs() + 5 {
            return Err(EnqueueError::TooLongLived);
        }
        if c.sub.is_empty() || c.sub.len() > MAX_SUB_LEN || c.sub.chars().any(char::is_control) {
            return Err(EnqueueError::Malformed);
        }
        Ok(EnqueueClaims {
            sub: c.sub,
            lane: c.lane,
            exp: c.exp,
        })
    }
}

/// The account key of `sub` in `room`.
pub fn account_key(room: &str, sub: &str) -> String {
    let mut h = Sha256::new();
    h.update(room.as_bytes());
    h.update([0u8]);
    h.update(sub.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What [`AccountPlaces::reserve`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// Nothing was bound: the caller holds the account until it binds or
    /// releases (or the reservation lapses).
    Reserved,
    /// The account's place (the note the gateway bound).
    Bound(String),
    /// Another join of the account holds it right now.
    Busy,
}

/// (room, account key) → (value, until ms): the memory store's map.
type MemoryBindings = Arc<Mutex<HashMap<(String, String), (String, u64)>>>;

/// Account key → place, in memory or in Redis (`{p}:{room}:acct:{key}`,
/// under the room's hash tag).
#[derive(Clone)]
pub enum AccountPlaces {
    /// One gateway.
    Memory(MemoryBindings),
    /// Gateways sharing Redis.
    Redis {
        conn: RedisConn,
        prefix: String,
        reserve: Arc<Script>,
        settle: Arc<Script>,
    },
}

const PENDING: &str = "pending:";

const RESERVE_LUA: &str = r"
-- KEYS[1] the account's key; ARGV nonce, pending ms, expected ('' or a
-- bound note the caller found spent and may replace)
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[3] then
  if string.sub(v, 1, 8) == 'pending:' then return {2} end
  return {1, v}
end
redis.call('SET', KEYS[1], 'pending:' .. ARGV[1], 'PX', ARGV[2])
return {0}
";

const SETTLE_LUA: &str = r"
-- KEYS[1] the account's key; ARGV nonce, note ('' to release), ttl ms
if redis.call('GET', KEYS[1]) ~= 'pending:' .. ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
";

fn protocol(e: impl std::fmt::Display) -> AdmissionError {
    AdmissionError::Protocol(e.to_string())
}

impl AccountPlaces {
    /// In memory.
    pub fn memory() -> Self {
        AccountPlaces::Memory(Arc::default())
    }

    /// On Redis, on `conn`, keys under `prefix`.
    pub fn redis(conn: RedisConn, prefix: &str) -> Self {
        AccountPlaces::Redis {
            conn,
            prefix: prefix.to_owned(),
            reserve: Arc::new(Script::new(RESERVE_LUA)),
            settle: Arc::new(Script::new(SETTLE_LUA)),
        }
    }

    fn key(prefix: &str, room: &str, account: &str) -> String {
        format!("{prefix}:{{{room}}}:acct:{account}")
    }

    /// The place bound to `account`, if any (a reservation in flight is
    /// none).
    pub async fn lookup(&self, room: &str, account: &str, now_ms: u64) -> Result<Option<String>> {
        let v = match self {
            AccountPlaces::Memory(m) => m
                .lock()
                .get(&(room.to_owned(), account.to_owned()))
                .filter(|(_, until)| *until > now_ms)
                .map(|(v, _)| v.clone()),
            AccountPlaces::Redis { conn, prefix, .. } => {
                let mut c = conn.clone();
                redis::cmd("GET")
                    .arg(Self::key(prefix, room, account))
                    .query_async::<Option<String>>(&mut c)
                    .await?
            }
        };
        Ok(v.filter(|v| !v.starts_with(PENDING)))
    }

    /// Takes `account` for one join (`nonce`), unless a place is bound to
    /// it (other than `replacing`, a bound place the caller found spent)
    /// or another join holds it. The reservation lapses after `pending`.
    pub async fn reserve(
        &self,
        room: &str,
        account: &str,
        nonce: &str,
        pending: Duration,
        replacing: Option<&str>,
        now_ms: u64,
    ) -> Result<Reserve> {
        match self {
            AccountPlaces::Memory(m) => {
                let mut m = m.lock();
                let k = (room.to_owned(), account.to_owned());
                if let Some((v, until)) = m.get(&k)
                    && *until > now_ms
                    && Some(v.as_str()) != replacing
                {
                    return Ok(if v.starts_with(PENDING) {
                        Reserve::Busy
                    } else {
                        Reserve::Bound(v.clone())
                    });
                }
                m.insert(
                    k,
                    (
                        format!("{PENDING}{nonce}"),
                        now_ms + pending.as_millis() as u64,
                    ),
                );
                Ok(Reserve::Reserved)
            }
            AccountPlaces::Redis {
                conn,
                prefix,
                reserve,
                ..
            } => {
                let mut c = conn.clone();
                let reply: (i64, Option<String>) = {
                    let v: redis::Value = reserve
                        .key(Self::key(prefix, room, account))
                        .arg(nonce)
                        .arg(pending.as_millis() as u64)
                        .arg(replacing.unwrap_or(""))
                        .invoke_async(&mut c)
                        .await?;
                    let items: Vec<redis::Value> = redis::from_redis_value(v).map_err(protocol)?;
                    let code: i64 = items
                        .first()
                        .cloned()
                        .map(redis::from_redis_value)
                        .transpose()
                        .map_err(protocol)?
                        .ok_or_else(|| protocol("empty reply"))?;
                    let note: Option<String> = items
                        .get(1)
                        .cloned()
                        .map(redis::from_redis_value)
                        .transpose()
                        .map_err(protocol)?;
                    (code, note)
                };
                match reply {
                    (0, _) => Ok(Reserve::Reserved),
                    (1, Some(note)) => Ok(Reserve::Bound(note)),
                    (2, _) => Ok(Reserve::Busy),
                    other => Err(protocol(format!("account reply {other:?}"))),
                }
            }
        }
    }

    /// Ends the reservation `nonce`: binds `note` for `ttl`, or releases
    /// the account (`note` = None). Nothing when the reservation lapsed or
    /// was replaced.
    pub async fn settle(
        &self,
        room: &str,
        account: &str,
        nonce: &str,
        note: Option<&str>,
        ttl: Duration,
        now_ms: u64,
    ) -> Result<()> {
        match self {
            AccountPlaces::Memory(m) => {
                let mut m = m.lock();
                let k = (room.to_owned(), account.to_owned());
                if m.get(&k)
                    .is_some_and(|(v, _)| *v == format!("{PENDING}{nonce}"))
                {
                    match note {
                        Some(n) => {
                            m.insert(k, (n.to_owned(), now_ms + ttl.as_millis() as u64));
                        }
                        None => {
                            m.remove(&k);
                        }
                    }
                }
                Ok(())
            }
            AccountPlaces::Redis {
                conn,
                prefix,
                settle,
                ..
            } => {
                let mut c = conn.clone();
                let _: i64 = settle
                    .key(Self::key(prefix, room, account))
                    .arg(nonce)
                    .arg(note.unwrap_or(""))
                    .arg(ttl.as_millis().max(1) as u64)
                    .invoke_async(&mut c)
                    .await?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    const SECRET: &[u8] = b"an-origin-secret-of-at-least-32-bytes!!";

    fn hs(claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn hmac_tokens_are_checked_claim_by_claim() {
        let v = EnqueueVerifier::new(Some(SECRET), None, false, Duration::from_secs(600)).unwrap();
        let now = 1_800_000_000;
        let ok = hs(json!({"sub": "acct-1", "aud": "vip", "exp": now + 60, "lane": "presale"}));
        let c = v.verify(&ok, "vip", now).unwrap();
        assert_eq!(
            (c.sub.as_str(), c.lane.as_deref()),
            ("acct-1", Some("presale"))
        );
        let cases = [
            (
                hs(json!({"sub": "a", "aud": "vip", "exp": now - 1})),
                EnqueueError::Expired,
            ),
            (
                hs(json!({"sub": "a", "aud": "vip", "exp": now + 3600})),
                EnqueueError::TooLongLived,
            ),
            (
                hs(json!({"sub": "a", "aud": "other", "exp": now + 60})),
                EnqueueError::WrongRoom,
            ),
            (
                hs(json!({"sub": "", "aud": "vip", "exp": now + 60})),
                EnqueueError::Malformed,
            ),
            (
                hs(json!({"aud": "vip", "exp": now + 60})),
                EnqueueError::Malformed,
            ),
            ("a.b".into(), EnqueueError::Malformed),
            ("x".repeat(5000), EnqueueError::Malformed),
        ];
        for (t, want) in cases {
            assert_eq!(v.verify(&t, "vip", now), Err(want), "{t}");
        }
        let forged = encode(
            &Header::new(Algorithm::HS256),
            &json!({"sub": "a", "aud": "vip", "exp": now + 60}),
            &EncodingKey::from_secret(b"another-secret-of-at-least-32-bytes-long").unwrap(),
        )
        .unwrap();
        assert_eq!(
            v.verify(&forged, "vip", now),
            Err(EnqueueError::BadSignature)
        );
        // a room trusting only a JWKS refuses HS256
        assert!(
            EnqueueVerifier::new(Some(b"short"), None, false, Duration::from_secs(60)).is_err()
        );
        assert!(EnqueueVerifier::new(None, None, false, Duration::from_secs(60)).is_err());
    }

    #[test]
    fn account_keys_differ_by_room_and_hide_the_id() {
        let a = account_key("vip", "alice@example.com");
        assert_eq!(a.len(), 64);
        assert!(!a.contains("alice"));
        assert_ne!(a, account_key("other", "alice@example.com"));
    }

    #[tokio::test]
    async fn one_reservation_per_account_in_memory() {
        let s = AccountPlaces::memory();
        let p = Duration::from_secs(10);
        assert_eq!(
            s.reserve("r", "a", "n1", p, None, 0).await.unwrap(),
            Reserve::Reserved
        );
        assert_eq!(
            s.reserve("r", "a", "n2", p, None, 1).await.unwrap(),
            Reserve::Busy
        );
        assert_eq!(s.lookup("r", "a", 1).await.unwrap(), None);
        // a stranger's nonce settles nothing
        s.settle("r", "a", "n2", Some("x"), p, 2).await.unwrap();
        s.settle("r", "a", "n1", Some("7:1:v"), p, 2).await.unwrap();
        assert_eq!(
            s.lookup("r", "a", 3).await.unwrap().as_deref(),
            Some("7:1:v")
        );
        assert_eq!(
            s.reserve("r", "a", "n3", p, None, 3).await.unwrap(),
            Reserve::Bound("7:1:v".into())
        );
        // a spent place may be replaced by the one who found it spent
        assert_eq!(
            s.reserve("r", "a", "n4", p, Some("7:1:v"), 4)
                .await
                .unwrap(),
            Reserve::Reserved
        );
        s.settle("r", "a", "n4", None, p, 5).await.unwrap();
        assert_eq!(s.lookup("r", "a", 5).await.unwrap(), None);
        // a reservation lapses
        assert_eq!(
            s.reserve("r", "b", "n5", p, None, 0).await.unwrap(),
            Reserve::Reserved
        );
        assert_eq!(
            s.reserve("r", "b", "n6", p, None, 10_001).await.unwrap(),
            Reserve::Reserved
        );
    }
}

#[cfg(test)]
mod eddsa_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    fn pkcs8(seed: &[u8; 32]) -> Vec<u8> {
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend_from_slice(seed);
        der
    }

    #[test]
    fn eddsa_needs_a_trusted_jwks() {
        let now = 1_800_000_000;
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some("k".into());
        let t = encode(
            &h,
            &json!({"sub": "a", "aud": "vip", "exp": now + 60}),
            &EncodingKey::from_ed_der(&pkcs8(&[7; 32])),
        )
        .unwrap();
        let hs_only =
            EnqueueVerifier::new(Some(&[1u8; 40]), None, false, Duration::from_secs(600)).unwrap();
        assert_eq!(hs_only.verify(&t, "vip", now), Err(EnqueueError::Algorithm));
    }
}

#[cfg(test)]
mod remote_jwks_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use base64::Engine as _;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    fn token(seed: u8, kid: &str, now: u64) -> String {
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend_from_slice(&[seed; 32]);
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some(kid.into());
        encode(
            &h,
            &json!({"sub": "a", "aud": "vip", "exp": now + 60}),
            &EncodingKey::from_ed_der(&der),
        )
        .unwrap()
    }

    fn jwk(seed: u8, kid: &str) -> serde_json::Value {
        let public = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]).verifying_key();
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public.as_bytes());
        json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": x})
    }

    #[test]
    fn fetched_keys_verify_only_in_a_verifier_that_trusts_them() {
        let now = 1_800_000_000;
        let remote = EnqueueVerifier::new(None, None, true, Duration::from_secs(600)).unwrap();
        let t = token(7, "k1", now);
        // nothing fetched yet: the key is unknown (the caller may fetch)
        assert_eq!(remote.verify(&t, "vip", now), Err(EnqueueError::UnknownKey));
        let origin = json!({"keys": [
            {"kty": "RSA", "kid": "rsa-for-something-else", "n": "AQAB", "e": "AQAB"},
            {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            jwk(7, "k1"),
        ]})
        .to_string();
        // an origin's JWKS may carry keys for other uses: skipped, not fatal
        assert!(jwks_keys(&origin, true).is_err());
        let keys = jwks_keys(&origin, false).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(
            remote.verify_with(&t, "vip", now, Some(&keys)).unwrap().sub,
            "a"
        );
        // a key of the same kid but another secret does not verify
        let forged = token(8, "k1", now);
        assert_eq!(
            remote.verify_with(&forged, "vip", now, Some(&keys)),
            Err(EnqueueError::BadSignature)
        );
        // a verifier that does not trust fetched keys ignores them
        let hs =
            EnqueueVerifier::new(Some(&[1u8; 40]), None, false, Duration::from_secs(600)).unwrap();
        assert_eq!(
            hs.verify_with(&t, "vip", now, Some(&keys)),
            Err(EnqueueError::Algorithm)
        );
        assert!(jwks_keys(r#"{"keys": []}"#, false).is_err());
        assert!(jwks_keys("<html>", false).is_err());
    }
}
