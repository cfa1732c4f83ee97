//! Invite codes: an invite-only room admits to its queue only a join that
//! carries a valid code.
//!
//! # Vocabulary
//!
//! - **code**: 128 random bits written as 26 base32 letters (`a-z2-7`),
//!   shown once, when issued. Fans may type it in upper case, with dashes
//!   or spaces: [`normalize`] removes them.
//! - **hash**: SHA-256 of the normalized code, hex. The store keeps only
//!   hashes: a dump of Redis gives nobody a code. No salt is needed: a code
//!   has 128 bits of entropy, so the hash cannot be searched backwards.
//! - **id**: the first 12 hex digits of the hash, the public name of an
//!   invite in the admin API (listing, revoking) — it reveals nothing of
//!   the code.
//! - **uses**: how many joins a code admits (1: single use); each
//!   **redemption** is recorded with its time and a note (the place it
//!   bought, the network it came from), the last [`REDEMPTIONS_KEPT`].
//!
//! # Invariants (tested on both stores by `tests/invites.rs` of this crate
//! and through the gateway by `tests/tests/invites.rs`)
//!
//! 1. A code is redeemed at most `uses` times, however many gateways race
//!    for it: [`InviteStore::redeem`] is one atomic step (one Lua script).
//! 2. A revoked or expired code redeems nothing; revoking is final.
//! 3. A redemption given back ([`InviteStore::unredeem`], when the join
//!    it paid for failed) never lifts `used` below 0.
//!
//! Own code rather than a crate: the store is four atomic operations over
//! the same Redis connection the queue uses; no invite crate fits that.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::RngExt as _;
use redis::Script;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use sluice_redis::RedisConn;

use crate::error::AdmissionError;
use crate::store::Result;

/// Letters of a code (RFC 4648 base32, lower case).
const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
/// Letters in a code: 26 × 5 bits ≥ 128 bits.
pub const CODE_LEN: usize = 26;
/// Redemptions kept per invite (the count `used` is exact beyond that).
pub const REDEMPTIONS_KEPT: usize = 1000;
/// Most uses one code may have.
pub const MAX_USES: u32 = 1_000_000;

/// A fresh code: 128 random bits in [`CODE_LEN`] base32 letters.
pub fn new_code() -> String {
    let mut rng = rand::rng();
    (0..CODE_LEN)
        .map(|_| ALPHABET[rng.random_range(0..32usize)] as char)
        .collect()
}

/// The code as stored: lower case, dashes and white space removed; `None`
/// when what remains is not a code's shape (wrong length or letters).
pub fn normalize(typed: &str) -> Option<String> {
    if typed.len() > 128 {
        return None;
    }
    let code: String = typed
        .chars()
        .filter(|c| *c != '-' && !c.is_whitespace())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    (code.len() == CODE_LEN && code.bytes().all(|b| ALPHABET.contains(&b))).then_some(code)
}

/// SHA-256 of a normalized code, in hex.
pub fn code_hash(code: &str) -> String {
    let digest = Sha256::digest(code.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The public id of the invite whose hash is `hash`.
pub fn invite_id(hash: &str) -> &str {
    &hash[..12.min(hash.len())]
}

/// Whether `id` is an invite id's shape (12 lower-case hex digits).
pub fn valid_invite_id(id: &str) -> bool {
    id.len() == 12
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What an invite is issued with.
#[derive(Clone, Debug)]
pub struct InviteSpec {
    /// Joins it admits, 1..=[`MAX_USES`].
    pub uses: u32,
    /// When it stops working (unix ms), if ever.
    pub expires_at_ms: Option<u64>,
    /// The operator's note (who it was for), at most 200 characters.
    pub label: String,
}

/// The answer of a check or a redemption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InviteCheck {
    /// Valid: the redemption was made (or, for a check, would be), with
    /// the uses left after it.
    Valid { id: String, uses_left: u32 },
    /// No invite has this code.
    Unknown,
    /// Every use was redeemed.
    Exhausted,
    /// Revoked by the operator.
    Revoked,
    /// Past its expiry.
    Expired,
}

impl InviteCheck {
    /// The reason given to a refused visitor (`reason` of
    /// `invite_invalid`); `None` when valid.
    pub fn refusal(&self) -> Option<&'static str> {
        match self {
            InviteCheck::Valid { .. } => None,
            InviteCheck::Unknown => Some("unknown"),
            InviteCheck::Exhausted => Some("exhausted"),
            InviteCheck::Revoked => Some("revoked"),
            InviteCheck::Expired => Some("expired"),
        }
    }
}

/// One recorded redemption.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Redemption {
    /// When (unix ms).
    pub at_ms: u64,
    /// What the gateway noted (the place, the network, or `returned`).
    pub note: String,
}

/// An invite as the operator sees it (never its code).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InviteView {
    pub id: String,
    pub label: String,
    pub uses: u32,
    pub used: u32,
    pub revoked: bool,
    pub created_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    /// The latest redemptions first (only in [`InviteStore::get`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub redemptions: Vec<Redemption>,
}

/// The invites of every room, in memory or in Redis.
#[derive(Clone)]
pub enum InviteStore {
    /// One gateway.
    Memory(Arc<Mutex<HashMap<String, MemoryRoom>>>),
    /// Gateways sharing Redis: per room, one hash per invite
    /// (`{p}:{room}:inv:{hash}`), its redemption log
    /// (`{p}:{room}:inv:{hash}:log`) and the index id → hash
    /// (`{p}:{room}:invites`), all under the room's hash tag.
    Redis(RedisInvites),
}

/// One room's invites in memory, by hash.
#[derive(Default)]
pub struct MemoryRoom {
    by_hash: HashMap<String, MemoryInvite>,
}

struct MemoryInvite {
    view: InviteView,
}

/// The Redis side of [`InviteStore`].
#[derive(Clone)]
pub struct RedisInvites {
    conn: RedisConn,
    prefix: String,
    redeem: Arc<Script>,
    unredeem: Arc<Script>,
}

const REDEEM_LUA: &str = r"
-- KEYS[1] the invite's hash, KEYS[2] its log; ARGV now_ms, note, '1' to
-- redeem ('0': only check), kept
local m = redis.call('HMGET', KEYS[1], 'uses', 'used', 'revoked', 'expires')
if not m[1] then return {0} end
if m[3] == '1' then return {2} end
local now = tonumber(ARGV[1])
if m[4] and m[4] ~= '' and tonumber(m[4]) <= now then return {4} end
local uses, used = tonumber(m[1]), tonumber(m[2] or '0')
if used >= uses then return {3} end
if ARGV[3] == '0' then return {1, uses - used} end
used = redis.call('HINCRBY', KEYS[1], 'used', 1)
redis.call('LPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
return {1, uses - used}
";

const UNREDEEM_LUA: &str = r"
-- KEYS[1] the invite's hash, KEYS[2] its log; ARGV now_ms, kept
if redis.call('HEXISTS', KEYS[1], 'uses') == 0 then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'used') or '0') <= 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'used', -1)
redis.call('LPUSH', KEYS[2], ARGV[1] .. ' returned')
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
return 1
";

fn protocol(e: impl std::fmt::Display) -> AdmissionError {
    AdmissionError::Protocol(e.to_string())
}

impl RedisInvites {
    fn key(&self, room: &str, hash: &str) -> String {
        format!("{}:{{{room}}}:inv:{hash}", self.prefix)
    }
    fn log_key(&self, room: &str, hash: &str) -> String {
        format!("{}:{{{room}}}:inv:{hash}:log", self.prefix)
    }
    fn index_key(&self, room: &str) -> String {
        format!("{}:{{{room}}}:invites", self.prefix)
    }
}

fn check_of(reply: &[i64], id: &str) -> Result<InviteCheck> {
    Ok(match reply.first() {
        Some(0) => InviteCheck::Unknown,
        Some(1) => InviteCheck::Valid {
            id: id.to_owned(),
            uses_left: reply
                .get(1)
                .and_then(|n| u32::try_from(*n).ok())
                .ok_or_else(|| protocol("invite reply without uses left"))?,
        },
        Some(2) => InviteCheck::Revoked,
        Some(3) => InviteCheck::Exhausted,
        Some(4) => InviteCheck::Expired,
        _ => return Err(protocol(format!("invite reply {reply:?}"))),
    })
}

impl InviteStore {
    /// A store in memory (one gateway).
    pub fn memory() -> InviteStore {
        InviteStore::Memory(Arc::default())
    }

    /// A store on Redis, on `conn` (the connection the other stores use),
    /// keys under `prefix` (`sluice`).
    pub fn redis(conn: RedisConn, prefix: &str) -> InviteStore {
        InviteStore::Redis(RedisInvites {
            conn,
            prefix: prefix.to_owned(),
            redeem: Arc::new(Script::new(REDEEM_LUA)),
            unredeem: Arc::new(Script::new(UNREDEEM_LUA)),
        })
    }

    /// Stores a new invite under `hash` (of a code from [`new_code`]);
    /// its view. A hash already present is left as it is (`None`): 128
    /// random bits do not collide, so this only guards against a bug.
    pub async fn issue(
        &self,
        room: &str,
        hash: &str,
        spec: &InviteSpec,
        now_ms: u64,
    ) -> Result<Option<InviteView>> {
        let view = InviteView {
            id: invite_id(hash).to_owned(),
            label: spec.label.clone(),
            uses: spec.uses,
            used: 0,
            revoked: false,
            created_at_ms: now_ms,
            expires_at_ms: spec.expires_at_ms,
            redemptions: Vec::new(),
        };
        match self {
            InviteStore::Memory(m) => {
                let mut rooms = m.lock();
                let r = rooms.entry(room.to_owned()).or_default();
                if r.by_hash.contains_key(hash) {
                    return Ok(None);
                }
                r.by_hash
                    .insert(hash.to_owned(), MemoryInvite { view: view.clone() });
                Ok(Some(view))
            }
            InviteStore::Redis(r) => {
                let mut conn = r.conn.clone();
                let created: bool = redis::cmd("HSETNX")
                    .arg(r.index_key(room))
                    .arg(&view.id)
                    .arg(hash)
                    .query_async(&mut conn)
                    .await?;
                if !created {
                    return Ok(None);
                }
                let expires = spec
                    .expires_at_ms
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                let _: () = redis::cmd("HSET")
                    .arg(r.key(room, hash))
                    .arg("uses")
                    .arg(spec.uses)
                    .arg("used")
                    .arg(0)
                    .arg("revoked")
                    .arg("0")
                    .arg("expires")
                    .arg(expires)
                    .arg("created")
                    .arg(now_ms)
                    .arg("label")
                    .arg(&spec.label)
                    .query_async(&mut conn)
                    .await?;
                Ok(Some(view))
            }
        }
    }

    /// Whether the code hashed as `hash` would redeem now (nothing
    /// changes): the check made before the visitor's work is verified.
    pub async fn check(&self, room: &str, hash: &str, now_ms: u64) -> Result<InviteCheck> {
        self.redeem_or_check(room, hash, now_ms, "", false).await
    }

    /// Redeems one use of the code hashed as `hash`, recording `note`; one
    /// atomic step.
    pub async fn redeem(
        &self,
        room: &str,
        hash: &str,
        now_ms: u64,
        note: &str,
    ) -> Result<InviteCheck> {
        self.redeem_or_check(room, hash, now_ms, note, true).await
    }

    async fn redeem_or_check(
        &self,
        room: &str,
        hash: &str,
        now_ms: u64,
        note: &str,
        redeem: bool,
    ) -> Result<InviteCheck> {
        let id = invite_id(hash);
        match self {
            InviteStore::Memory(m) => {
                let mut rooms = m.lock();
                let Some(inv) = rooms.get_mut(room).and_then(|r| r.by_hash.get_mut(hash)) else {
                    return Ok(InviteCheck::Unknown);
                };
                let v = &mut inv.view;
                if v.revoked {
                    return Ok(InviteCheck::Revoked);
                }
                if v.expires_at_ms.is_some_and(|e| e <= now_ms) {
                    return Ok(InviteCheck::Expired);
                }
                if v.used >= v.uses {
                    return Ok(InviteCheck::Exhausted);
                }
                if redeem {
                    v.used += 1;
                    v.redemptions.insert(
                        0,
                        Redemption {
                            at_ms: now_ms,
                            note: note.to_owned(),
                        },
                    );
                    v.redemptions.truncate(REDEMPTIONS_KEPT);
                }
                Ok(InviteCheck::Valid {
                    id: id.to_owned(),
                    uses_left: v.uses - v.used,
                })
            }
            InviteStore::Redis(r) => {
                let mut conn = r.conn.clone();
                let reply: Vec<i64> = r
                    .redeem
                    .key(r.key(room, hash))
                    .key(r.log_key(room, hash))
                    .arg(now_ms)
                    .arg(note)
                    .arg(if redeem { "1" } else { "0" })
                    .arg(REDEMPTIONS_KEPT)
                    .invoke_async(&mut conn)
                    .await?;
                check_of(&reply, id)
            }
        }
    }

    /// Gives back one use of the code hashed as `hash` (the join it paid
    /// for failed); recorded as `returned`. Never below 0 uses.
    pub async fn unredeem(&self, room: &str, hash: &str, now_ms: u64) -> Result<()> {
        match self {
            InviteStore::Memory(m) => {
                if let Some(inv) = m.lock().get_mut(room).and_then(|r| r.by_hash.get_mut(hash))
                    && inv.view.used > 0
                {
                    inv.view.used -= 1;
                    inv.view.redemptions.insert(
                        0,
                        Redemption {
                            at_ms: now_ms,
                            note: "returned".into(),
                        },
                    );
                    inv.view.redemptions.truncate(REDEMPTIONS_KEPT);
                }
                Ok(())
            }
            InviteStore::Redis(r) => {
                let mut conn = r.conn.clone();
                let _: i64 = r
                    .unredeem
                    .key(r.key(room, hash))
                    .key(r.log_key(room, hash))
                    .arg(now_ms)
                    .arg(REDEMPTIONS_KEPT)
                    .invoke_async(&mut conn)
                    .await?;
                Ok(())
            }
        }
    }

    /// Revokes the invite `id`; `false` when the room has no such invite.
    /// Final: a revoked invite stays revoked.
    pub async fn revoke(&self, room: &str, id: &str) -> Result<bool> {
        match self {
            InviteStore::Memory(m) => {
                let mut rooms = m.lock();
                let Some(inv) = rooms
                    .get_mut(room)
                    .and_then(|r| r.by_hash.values_mut().find(|i| i.view.id == id))
                else {
                    return Ok(false);
                };
                inv.view.revoked = true;
                Ok(true)
            }
            InviteStore::Redis(r) => {
                let mut conn = r.conn.clone();
                let hash: Option<String> = redis::cmd("HGET")
                    .arg(r.index_key(room))
                    .arg(id)
                    .query_async(&mut conn)
                    .await?;
                let Some(hash) = hash else { return Ok(false) };
                // HSET of one field: atomic on its own, and only ever to '1'
                let _: () = redis::cmd("HSET")
                    .arg(r.key(room, &hash))
                    .arg("revoked")
                    .arg("1")
                    .query_async(&mut conn)
                    .await?;
                Ok(true)
            }
        }
    }

    /// Every invite of `room`, oldest first, without their redemptions.
    pub async fn list(&self, room: &str) -> Result<Vec<InviteView>> {
        let mut out = match self {
            InviteStore::Memory(m) => m
                .lock()
                .get(room)
                .map(|r| {
                    r.by_hash
                        .values()
                        .map(|i| InviteView {
                            redemptions: Vec::new(),
                            ..i.view.clone()
                        })
                        .collect()
                })
                .unwrap_or_default(),
            InviteStore::Redis(r) => {
                let mut conn = r.conn.clone();
                let index: HashMap<String, String> = redis::cmd("HGETALL")
                    .arg(r.index_key(room))
                    .query_async(&mut conn)
                    .await?;
                let mut out = Vec::with_capacity(index.len());
                for (id, hash) in index {
                    if let Some(v) = r.view(room, &id, &hash, false).await? {
                        out.push(v);
                    }
                }
                out
            }
        };
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(out)
    }

    /// The invite `id` of `room` with its redemptions, latest first.
    pub async fn get(&self, room: &str, id: &str) -> Result<Option<InviteView>> {
        match self {
            InviteStore::Memory(m) => Ok(m.lock().get(room).and_then(|r| {
                r.by_hash
                    .values()
                    .find(|i| i.view.id == id)
                    .map(|i| i.view.clone())
            })),
            InviteStore::Redis(r) => {
                let mut conn = r.conn.clone();
                let hash: Option<String> = redis::cmd("HGET")
                    .arg(r.index_key(room))
                    .arg(id)
                    .query_async(&mut conn)
                    .await?;
                match hash {
                    Some(h) => r.view(room, id, &h, true).await,
                    None => Ok(None),
                }
            }
        }
    }
}

impl RedisInvites {
    async fn view(
        &self,
        room: &str,
        id: &str,
        hash: &str,
        with_log: bool,
    ) -> Result<Option<InviteView>> {
        let mut conn = self.conn.clone();
        let f: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.key(room, hash))
            .query_async(&mut conn)
            .await?;
        if f.is_empty() {
            return Ok(None);
        }
        let num = |k: &str| f.get(k).and_then(|v| v.parse::<u64>().ok());
        let redemptions = if with_log {
            let log: Vec<String> = redis::cmd("LRANGE")
                .arg(self.log_key(room, hash))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            log.iter()
                .filter_map(|l| {
                    let (at, note) = l.split_once(' ')?;
                    Some(Redemption {
                        at_ms: at.parse().ok()?,
                        note: note.to_owned(),
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Some(InviteView {
            id: id.to_owned(),
            label: f.get("label").cloned().unwrap_or_default(),
            uses: num("uses").and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
            used: num("used").and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
            revoked: f.get("revoked").is_some_and(|v| v == "1"),
            created_at_ms: num("created").unwrap_or(0),
            expires_at_ms: num("expires"),
            redemptions,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn codes_have_128_bits_and_normalize() {
        let c = new_code();
        assert_eq!(c.len(), CODE_LEN);
        assert_eq!(normalize(&c).as_deref(), Some(c.as_str()));
        let typed = format!(
            " {}-{} ",
            c[..13].to_ascii_uppercase(),
            &c[13..].to_ascii_uppercase()
        );
        assert_eq!(normalize(&typed).as_deref(), Some(c.as_str()));
        assert_eq!(normalize(&c[1..]), None, "too short");
        assert_eq!(normalize(&format!("{}1", &c[1..])), None, "1 is not base32");
        assert_eq!(normalize(&"a".repeat(500)), None);
        assert_ne!(new_code(), new_code());
        let h = code_hash(&c);
        assert_eq!(h.len(), 64);
        assert!(valid_invite_id(invite_id(&h)));
        assert!(!valid_invite_id("ABCDEF012345"));
    }

    #[tokio::test]
    async fn memory_store_redeems_at_most_uses_times() {
        let s = InviteStore::memory();
        let h = code_hash(&new_code());
        let spec = InviteSpec {
            uses: 2,
            expires_at_ms: Some(10_000),
            label: "press".into(),
        };
        assert!(s.issue("r", &h, &spec, 1).await.unwrap().is_some());
        assert!(s.issue("r", &h, &spec, 1).await.unwrap().is_none());
        assert_eq!(s.check("other", &h, 2).await.unwrap(), InviteCheck::Unknown);
        assert!(matches!(
            s.check("r", &h, 2).await.unwrap(),
            InviteCheck::Valid { uses_left: 2, .. }
        ));
        assert!(matches!(
            s.redeem("r", &h, 3, "seq 1").await.unwrap(),
            InviteCheck::Valid { uses_left: 1, .. }
        ));
        s.unredeem("r", &h, 4).await.unwrap();
        for left in [1, 0] {
            assert!(matches!(
                s.redeem("r", &h, 5, "seq").await.unwrap(),
                InviteCheck::Valid { uses_left, .. } if uses_left == left
            ));
        }
        assert_eq!(
            s.redeem("r", &h, 6, "x").await.unwrap(),
            InviteCheck::Exhausted
        );
        let v = s.get("r", invite_id(&h)).await.unwrap().unwrap();
        assert_eq!((v.uses, v.used, v.redemptions.len()), (2, 2, 4));
        assert_eq!(v.redemptions[3].note, "seq 1");
        assert_eq!(v.redemptions[2].note, "returned");
        // expiry, then revocation
        let h2 = code_hash(&new_code());
        s.issue("r", &h2, &spec, 1).await.unwrap();
        assert_eq!(
            s.check("r", &h2, 10_000).await.unwrap(),
            InviteCheck::Expired
        );
        assert!(s.revoke("r", invite_id(&h2)).await.unwrap());
        assert!(!s.revoke("r", "000000000000").await.unwrap());
        assert_eq!(s.check("r", &h2, 2).await.unwrap(), InviteCheck::Revoked);
        assert_eq!(s.list("r").await.unwrap().len(), 2);
    }
}
