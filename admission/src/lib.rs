//! sluice-admission: the waiting room's fair queue.
//!
//! Visitors join a room and get a sequence number; an admission frontier,
//! metered by a token bucket, moves forward through the numbers at the rate
//! the origin can carry. This crate holds that logic (pure, in integer
//! units), the stores that keep it (in memory for one gateway, Redis + Lua
//! for many), calibration from origin capacity, the Ed25519 queue and
//! admission tokens, and the small estimators a status poll needs. It knows
//! nothing of HTTP: the gateway wires it in.
//!
//! # Vocabulary
//!
//! - **seq**: a visitor's place in line, handed out by `join` (1, 2, 3…),
//!   carried in its signed queue token. The store keeps no per-visitor
//!   state while it waits.
//! - **tail**: the last seq handed out. **frontier**: every seq ≤ frontier
//!   is admitted. `tail − frontier` are waiting; a visitor's position is
//!   `seq − frontier`.
//! - **credit**: admissions saved up, earned at **rate** per second and
//!   spent one per seq admitted. **burst**: the most credit saved while
//!   nobody waits, so the most let through at once after a quiet spell.
//! - **passthrough**: a join admitted on the spot, because nobody waits and
//!   credit (and the active cap) allow.
//! - **epoch**: a number that changes when a room's store state is created
//!   anew (first configure, or after the store lost it); tokens carry it.
//! - **claim window**: how long an admitted visitor has to claim its place
//!   (fetch its admission token) before the slot goes back as credit
//!   (a **no-show**). Claims are one bit per seq.
//! - **session**: an admitted visitor active on the site, with a sliding
//!   deadline; ended by expiry or at once by a revoke. Sessions and
//!   unclaimed admissions count against **max_active**.
//! - **pre-queue**: before a scheduled room's **opening** (`opens_at_ms`),
//!   joins get seqs as usual but nobody is admitted. The first operation at
//!   or after the opening records the **draw** once (`from`, `n`: the seqs
//!   joined before it are its **tickets**). The frontier counts **places**:
//!   a ticket's place comes from the draw's shuffle ([`PlaceMap`]), every
//!   other seq is its own place.
//!
//! # Layout
//!
//! - time is injected through `sluice-clock`'s [`Clock`] (re-exported here
//!   with [`SystemClock`] and [`ManualClock`]), the one the reservation
//!   inventory uses too.
//! - [`settings`]: [`RoomSettings`], the admin [`RoomPatch`], calibration
//!   ([`derive_rate`], [`little_max_active`]).
//! - [`bucket`]: the pure token bucket over seqs, in integer units.
//! - [`room`]: one room's whole state machine: bucket, claim bitmap,
//!   advance batches (no-show refunds), sessions.
//! - [`store`]: the [`QueueStore`] trait and its values ([`Snapshot`],
//!   [`JoinOutcome`], [`ClaimOutcome`], [`AdmitOutcome`]).
//! - [`backend`]: the [`QueueBackend`] enum a gateway runs on.
//! - [`memory`]: [`MemoryQueueStore`], the reference semantics, usable in
//!   virtual time.
//! - [`redis_store`]: [`RedisQueueStore`], the Lua port of [`room`] (the
//!   scripts are in `admission/lua/`), with the key schema in its docs; it
//!   opens its URL and runs on the connection every store shares
//!   (`sluice_redis::RedisUrl`, `sluice_redis::RedisConn`).
//! - [`tokens`]: [`Keyring`], [`QueueClaims`], [`AdmitClaims`], JWKS,
//!   [`VerifyCache`], [`keygen`].
//! - [`poll`]: poll intervals, ETA, [`RateMeter`].
//! - [`prequeue`]: the verifiable shuffle of a scheduled room's pre-queue.
//! - [`enqueue`]: enqueue tokens from the origin ([`enqueue::EnqueueVerifier`])
//!   and one place per account ([`enqueue::AccountPlaces`]).
//! - [`invites`]: invite codes of invite-only rooms ([`invites::InviteStore`],
//!   memory or Redis), stored hashed, redeemed at most `uses` times.
//! - [`rate`]: a rate limit every gateway on one store shares (GCRA).
//! - [`fairness`]: Kendall's tau-b between arrival and admission order,
//!   O(n log n) ([`fairness::kendall_tau_b`]).
//! - [`sim`]: the discrete-event simulator (`sluice simulate`): visitors
//!   against the real room state machine in virtual time.
//! - `conformance` (feature `test-util`): the store suite both stores pass.
//!
//! # Invariants
//!
//! - **FIFO**: the frontier only moves forward and admits places in order
//!   (seqs in order, but for a scheduled room's pre-queue tickets, which
//!   are ordered by the published draw).
//! - **The draw is made once**, atomically with the operation that closes
//!   the pre-queue: a join is either a ticket or after every ticket.
//! - **Seqs are never reissued**, even by a store that lost its state:
//!   [`QueueStore::recover`] raises tail and frontier to the highest values
//!   gateways have seen, and the new state gets a higher epoch.
//! - **The frontier is monotone** and never passes the tail.
//! - **Admissions are metered**: over any window of `t` seconds at most
//!   `rate × t + burst` seqs are admitted, plus the no-show slots given
//!   back in that window (each at most once).
//! - Many gateways calling `advance` at once split the elapsed time: the
//!   result is that of one caller.

pub mod backend;
pub mod batch;
pub mod bucket;
#[cfg(feature = "test-util")]
pub mod conformance;
pub mod enqueue;
pub mod error;
pub mod fairness;
pub mod invites;
pub mod lanes;
pub mod memory;
pub mod poll;
pub mod prequeue;
pub mod rate;
pub mod redis_store;
pub mod room;
pub mod settings;
pub mod sim;
pub mod store;
pub mod tokens;

pub use backend::QueueBackend;
pub use error::{AdmissionError, validate_room_id};
pub use memory::MemoryQueueStore;
pub use poll::{RateMeter, eta_seconds, poll_after_ms, poll_after_ms_eta};
pub use prequeue::{PlaceMap, PrequeueDraw, commitment, shuffle_order};
pub use redis_store::{RedisConfig, RedisQueueStore};
pub use settings::{
    AdaptiveState, InvalidSetting, QueueMethod, RoomPatch, RoomSettings, derive_rate,
    little_max_active,
};
pub use sluice_clock::{Clock, ManualClock, SystemClock};
pub use store::{
    AdmitOutcome, ClaimOutcome, Floors, JoinOnce, JoinOutcome, QueueStore, Snapshot, Solution,
    Spend,
};
pub use tokens::{
    AdmitClaims, Keyring, QueueClaims, TokenError, VerifyCache, keygen, new_visitor_id, session_of,
    unix_now_s,
};
