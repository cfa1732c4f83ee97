//! The ledger: every event's reservation stream written durably into
//! PostgreSQL, the record a lost store is rebuilt from.
//!
//! Redis is the hot path: each change of stock is one Lua script that also
//! appends an entry to the event's stream (`reservation/STREAM.md`). The
//! ledger (`sluice ledger`, any number of processes, one consumer group)
//! reads those streams and writes holds, confirmations, releases, expiries,
//! payments and stock changes to PostgreSQL, in batches, idempotently, in
//! stream order per event, and acknowledges an entry only once it is
//! committed. It then trims the stream below what the group acknowledged,
//! compares its own count with the store's (drift is reported, never
//! corrected upward), and can hand back an [`EventRecord`] of an event for
//! a store that lost it.
//!
//! # Vocabulary
//!
//! - **entry**: one stream entry; its id (`ms-seq`, [`StreamId`]) orders
//!   the entries of one event. Parsed into an [`Entry`] or parked as a
//!   [`DeadLetter`].
//! - **transition**: a recorded entry (table `hold_transitions`); unique
//!   per `(event, stream_id)` and per `(hold_id, kind)`.
//! - **batch**: up to `--batch` entries of one event, written in one
//!   transaction and acknowledged together after its commit.
//! - **group**: the consumer group [`stream::GROUP`] on each stream; its
//!   consumers are ledger processes, each named host-pid-random.
//! - **pending**: delivered to a consumer and not acknowledged; a consumer
//!   that dies leaves its batch pending, and another claims it after
//!   `--claim-idle` (`XAUTOCLAIM`).
//! - **lag**: entries not yet recorded and the age of the oldest
//!   ([`Lag`], [`stream_lag`]).
//! - **drift**: the ledger's `total − held − confirmed` minus the store's
//!   `available` at the same entry ([`Check`]), for the event and for each
//!   of its categories ([`CategoryCheck`], from the entry's
//!   `category_available`).
//! - **floors**: a room's queue high-water mark (tail, frontier, epoch),
//!   kept so a rebuilt room never reissues a seq.
//!
//! # Layout
//!
//! - [`entry`]: stream entries, parsed (total: garbage becomes a dead
//!   letter, never a panic).
//! - [`schema`]: the migrations (`ledger/migrations/*.sql`, embedded) and
//!   the version table; tables in `ledger/SCHEMA.md`.
//! - [`store`]: [`Ledger`], one PostgreSQL connection: writing a batch,
//!   reading an [`EventRecord`], room floors.
//! - [`stream`]: the Redis side: group, read, claim, ack, trim, lag.
//! - [`consumer`]: the loop of `sluice ledger` (one task per event) and
//!   its [`ConsumerConfig`].
//! - [`metrics`]: the process's counters per event ([`Metrics`]) and its
//!   `/metrics` endpoint.
//! - [`payments`]: the payment provider's list of payment events against
//!   the recorded holds (refunds to make, webhooks lost).
//!
//! # Why tokio-postgres without a pool
//!
//! Each event's task owns one connection for its whole life and runs one
//! transaction at a time on it, so there is nothing to share and nothing
//! for a pool (deadpool-postgres) to do; what a pool would add, reconnecting,
//! is four lines here, and it must be explicit anyway: after a failed or
//! timed-out batch the connection is dropped (its transaction is rolled
//! back by the server) and a fresh one is opened with backoff.
//!
//! # Invariants
//!
//! 1. An entry is acknowledged only after the transaction that recorded it
//!    (or parked it) committed: nothing acknowledged is missing from
//!    PostgreSQL.
//! 2. Recording is idempotent: a batch applied again, by the same consumer
//!    or another, concurrently or later, changes no row and no counter
//!    (the unique keys decide what is new; only new entries move holds,
//!    payments and counters).
//! 3. A hold's status only moves forward: `held` → `confirmed` |
//!    `released` | `expired`, the first terminal entry wins, and a `held`
//!    applied after its end never reopens it.
//! 4. The stream is trimmed only below the lowest entry some group has not
//!    acknowledged: nothing unread or unacknowledged is ever trimmed.
//! 5. A malformed entry is parked in `dead_letters` in the batch's
//!    transaction and acknowledged with it: never dropped, never a crash
//!    loop.
//! 6. The ledger never raises what is on sale: drift is reported (log,
//!    metric, `reconciliation` table), never corrected.

#![forbid(unsafe_code)]

pub mod consumer;
pub mod entry;
pub mod error;
pub mod metrics;
pub mod payments;
pub mod schema;
pub mod store;
pub mod stream;

pub use consumer::{ConsumerConfig, run};
pub use entry::{DeadLetter, Entry, Kind, Parsed, RawEntry, StreamId};
pub use error::{LedgerError, Result};
pub use metrics::{EventStats, Metrics, serve_metrics};
pub use payments::{Finding, ProviderPayment};
pub use sluice_reservation::{CategoryRecord, EventRecord, OpenHold};
pub use store::{Applied, CategoryCheck, Check, EventSummary, Ledger, RoomFloors};
pub use stream::{Lag, stream_lag};
