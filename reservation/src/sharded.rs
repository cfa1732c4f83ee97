//! Sharded events: one hot event's stock split across shards, each an
//! event of the store under its own hash tag, so a Redis Cluster spreads
//! one sale over its primaries (issue 20; seed 003's exercise 1).
//!
//! # Layout
//!
//! Shard 0 of event `hot` is the store's event `hot` itself; shard `k ≥ 1`
//! is the store's event `hot~k` ([`EventId::shard`]), with every key of
//! its own (`sluice:{hot~k}:…`), its own stream and its own record in the
//! ledger. Each shard's meta says how many shards the event has
//! (`shards`; absent: 1), and shard 0 keeps the event's total
//! (`shard_total`). [`Sharded`] wraps any [`Inventory`] and routes by it.
//!
//! # Holds: the home shard
//!
//! A visitor's **home** is `FNV-1a(visitor) mod shards` ([`home_shard`]).
//! Every hold of a visitor goes to its home and nowhere else, so the cart
//! limit is checked in the same atomic step as the stock, exactly as on a
//! plain event, and stays global: all of a visitor's units are on one
//! shard. A hold routed by a stale layout is refused by the shard
//! ([`Inventory::hold_in_layout`], [`HoldOutcome::Resharded`]) and routed
//! again, so no cache can split a cart.
//!
//! When the home is short, units come to it: [`Sharded`] pulls them from
//! the other shards in ring order (home+1, home+2, …), one **transfer** per
//! shard, then holds at home again. A transfer is three atomic steps:
//! `transfer_out` on the source (its total and available drop, a pending
//! record says where the units go), `transfer_in` on the home (its total
//! and available rise, once per transfer id) and `transfer_done` on the
//! source. Between the first and the second the units are **in transit**:
//! counted in the event's total, available to nobody, so a gateway dying
//! mid-transfer undersells for a moment and never oversells. Every reap
//! of a shard lands its transfers older than [`SWEEP_AFTER_MS`]
//! ([`Sharded::sweep`]).
//!
//! # Sold out
//!
//! Many buyers walking at once move units ahead of each other: a walk
//! can find every other shard empty while units are in transit or have
//! landed on a shard it already passed. So a walk that found nothing is
//! not the answer: [`Sharded`] then reads every shard (available units,
//! units in transit, and `moves`, the shard's count of transfers out and
//! in). One read after another is no snapshot, so a count short of the
//! cart is believed only when a second pass finds every shard's `moves`
//! unchanged: then no transfer touched shard k between its first read and
//! the end of the first pass, so every unsold unit was counted where it
//! last arrived or as in transit from where it last left. Then "sold out"
//! is answered with the units left (the buyer can ask for fewer).
//! Otherwise, or when units are left, it pulls from the richest shards
//! and holds at home again. After [`ROUTER_ROUNDS`] home attempts lost to
//! other buyers, a buyer keeps its turn over the pass, the pull and the
//! hold at home, so buyers who keep losing stop taking units from each
//! other's homes; after [`ROUTER_ROUNDS_MAX`] it answers
//! [`crate::ReservationError::Contended`] (503, try again), never an
//! unproved "sold out" (the CI run of a09a853 caught one: a cart of 2
//! told "sold out" after twelve rounds while 2 units were provably
//! unsold). So does a buyer who, after [`ROUTER_ROUNDS`], finds the
//! units it needs only in transit on every look until its rounds run out,
//! waiting [`TRANSIT_WAIT`] between looks (a transfer whose gateway died
//! waits for a sweep; a live one lands in a moment, though a loaded
//! machine may not run its task for milliseconds: the CI run of 9d91b21
//! caught a buyer answered "try again" on its 13th round while a live
//! transfer was in flight): they are not sold, so "sold out" would be
//! false. A
//! pass that found nothing left is remembered for [`SOLD_OUT_FRESH`]:
//! within it a walk that finds nothing answers at once, so the storm of
//! "sold out" after a sale costs a walk (one call per shard, which also
//! finds units a release or an expiry gave back) instead of three; a
//! stock change through this router forgets it. Passes over one event's
//! shards take turns (per router), so when a crowd meets the end of a
//! sale the first pass answers for everyone who waited on it.
//!
//! # Stock changes
//!
//! The event's total lives on shard 0: a `PUT` is a snapshot of shard 0
//! (`shard_total` set to the new total, shard 0's own total moved by the
//! difference, in one step) and a feed delta moves both by the delta;
//! units then spread to the other shards by transfers as visitors pull
//! them. A decrease larger than shard 0's available units first pulls
//! units to shard 0, then is refused if they are held or sold. Settings
//! (cart limit, hold TTL, room) are copied to every shard with the
//! version, a shard ignoring an older one.
//!
//! The shard count changes only while nothing is held or sold (the count
//! decides every visitor's home, so it would move carts): every shard is
//! frozen first (`shards = 0`, idle checked in the same step: holds and
//! transfers refused), then re-split and given the new layout, shard 0
//! last. Anything held or sold unfreezes them and answers
//! [`SetStockOutcome::ShardsBusy`].
//!
//! Sharded events have no categories and no waves (refused with
//! [`SetStockOutcome::Invalid`] and [`ScheduleOutcome::Invalid`]).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use parking_lot::RwLock;
use serde::Serialize;

use crate::error::Result;
use crate::feed::{FeedApplied, FeedOutcome, StockChange, StockRow};
use crate::record::{CategoryRecord, EventRecord, RestoreOutcome};
use crate::types::*;
use crate::{Inventory, spec_problem};

/// How old a pending transfer must be before a sweep lands it: long
/// enough that the gateway that started it has finished with it.
pub const SWEEP_AFTER_MS: u64 = 2_000;

/// Home attempts of one routed hold before it keeps its event's turn over
/// the pass, the pull and the hold (module docs, "Sold out").
pub const ROUTER_ROUNDS: u32 = 12;

/// Home attempts of one routed hold before it answers
/// [`crate::ReservationError::Contended`]: it could neither hold nor
/// prove the event sold out (module docs, "Sold out").
pub const ROUTER_ROUNDS_MAX: u32 = 4 * ROUTER_ROUNDS;

/// How long a routed hold past [`ROUTER_ROUNDS`] waits before looking
/// again when the units it needs are only in transit (module docs, "Sold
/// out"): at most [`ROUTER_ROUNDS_MAX`] − [`ROUTER_ROUNDS`] waits, some
/// 40 ms, before [`crate::ReservationError::Contended`].
pub const TRANSIT_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// How long a pass over every shard that found nothing left spares the
/// next "sold out" answers of the event their reads (module docs).
pub const SOLD_OUT_FRESH: std::time::Duration = std::time::Duration::from_millis(200);

/// What one shard stores of the event's layout ([`Inventory::set_layout`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    /// Shards of the event: 1 for a plain event (the field removed), 0
    /// frozen (every hold and transfer refused).
    pub shards: u32,
    /// The event's total, kept by shard 0.
    pub shard_total: ShardTotal,
    /// The settings every shard shares.
    pub cart_limit: u32,
    /// Hold TTL, milliseconds.
    pub hold_ttl_ms: u64,
    /// The room selling the event.
    pub room: String,
    /// `Some(v)`: applied only when `v` is at least the shard's version,
    /// which becomes `v` ([`LayoutOutcome::Stale`] otherwise); `None`:
    /// no version check, the version unchanged (freezing).
    pub version: Option<u64>,
    /// Refuse ([`LayoutOutcome::Busy`]) when anything is held or sold on
    /// the shard: checked in the same step as the change.
    pub require_idle: bool,
}

/// What [`ShardLayout::shard_total`] does to the stored event total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardTotal {
    /// Left as it is.
    Keep,
    /// Set (shard 0 of a sharded event).
    Set(u64),
    /// Removed (the event is plain again).
    Clear,
}

/// Answer to [`Inventory::set_layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutOutcome {
    /// Written.
    Set,
    /// The shard has no stock counter or settings.
    NotReady,
    /// Its version is above the one given: nothing changed.
    Stale {
        /// The shard's version.
        current_version: u64,
    },
    /// Something is held or sold on it (with `require_idle`): nothing
    /// changed.
    Busy {
        /// Units held on the shard.
        held: u64,
        /// Units sold on it.
        confirmed: u64,
    },
}

/// Answer to [`Inventory::transfer_out`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferOut {
    /// `qty` units left the shard (0: it had none); `available` after.
    Moved {
        /// Units moved.
        qty: u64,
        /// The source's available units afterwards.
        available: u64,
    },
    /// The shard has no stock counter or settings.
    NotReady,
    /// The shard is frozen (its event's shard count is changing).
    Frozen,
}

/// Answer to [`Inventory::transfer_in`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferIn {
    /// The units landed; `available` after.
    Applied {
        /// The shard's available units afterwards.
        available: u64,
    },
    /// This transfer landed before: nothing changed.
    Replayed,
    /// The shard has no stock counter or settings: nothing changed.
    NotReady,
    /// The shard is frozen: nothing changed.
    Frozen,
}

/// A transfer that left a shard and was not marked done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PendingTransfer {
    /// The transfer id.
    pub id: String,
    /// Where its units go.
    pub to: EventId,
    /// How many.
    pub qty: u64,
    /// How long ago it left, by the store's clock.
    pub age_ms: u64,
}

/// A visitor's home shard among `shards`: FNV-1a (64-bit) of the visitor
/// id, modulo `shards`. Stable across gateways and versions (it decides
/// where a cart lives); visitor ids are random 128-bit values, so homes
/// spread evenly. Not a security boundary: a visitor choosing its home
/// gains nothing but a shard.
pub fn home_shard(visitor: &str, shards: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in visitor.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    u32::try_from(h % u64::from(shards.max(1))).unwrap_or(0)
}

/// `total` split over `shards`: equal parts, shard 0 taking the remainder.
pub fn split(total: u64, shards: u32) -> Vec<u64> {
    let n = u64::from(shards.max(1));
    let base = total / n;
    (0..n)
        .map(|k| if k == 0 { base + total % n } else { base })
        .collect()
}

/// What a read of every shard found ([`Sharded::survey`]).
#[derive(Debug, Default)]
struct Survey {
    /// Available units, by shard.
    available: Vec<u64>,
    /// Units in transit between shards, all together.
    in_transit: u64,
    /// Each shard's count of transfers out and in.
    moves: Vec<u64>,
}

impl Survey {
    /// Units that may still be sold: available anywhere or in transit.
    fn left(&self) -> u64 {
        self.available.iter().sum::<u64>() + self.in_transit
    }

    /// The shards other than `home` with units available, most first: where
    /// a pull should look after a walk in ring order found nothing.
    fn richest(&self, home: u32) -> Vec<u32> {
        let mut with: Vec<(u64, u32)> = (0..)
            .zip(&self.available)
            .filter(|&(k, &n)| k != home && n > 0)
            .map(|(k, &n)| (n, k))
            .collect();
        with.sort_unstable_by(|a, b| b.cmp(a));
        with.into_iter().map(|(_, k)| k).collect()
    }
}

fn transfer_id() -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<u128>().to_le_bytes())
}

/// Any [`Inventory`], with sharded events routed (module docs). Plain
/// events pass straight through; a cache of layouts (learned from reads,
/// stock changes and [`HoldOutcome::Resharded`] answers) keeps a hold on a
/// plain event at one store call. Cheap to clone (the cache is shared).
#[derive(Clone)]
pub struct Sharded<I> {
    inner: I,
    layouts: Arc<RwLock<HashMap<EventId, u32>>>,
    /// When each event was last read empty on every shard (nothing
    /// available, nothing in transit): a "sold out" within
    /// [`SOLD_OUT_FRESH`] of it costs the home's call and a walk.
    sold_out: Arc<RwLock<HashMap<EventId, std::time::Instant>>>,
    /// One pass over an event's shards at a time (module docs, "Sold out").
    survey_turns: Arc<RwLock<HashMap<EventId, Arc<tokio::sync::Mutex<()>>>>>,
    sweep_after_ms: u64,
}

impl<I> Sharded<I> {
    /// Wraps a store.
    pub fn new(inner: I) -> Self {
        Self {
            inner,
            layouts: Arc::default(),
            sold_out: Arc::default(),
            survey_turns: Arc::default(),
            sweep_after_ms: SWEEP_AFTER_MS,
        }
    }

    /// Sweeps land transfers older than `after` instead of
    /// [`SWEEP_AFTER_MS`] (tests).
    pub fn with_sweep_after(mut self, after: std::time::Duration) -> Self {
        self.sweep_after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// The store underneath.
    pub fn inner(&self) -> &I {
        &self.inner
    }

    /// The layout last learned for `event` (1 when none was).
    pub fn cached_shards(&self, event: &EventId) -> u32 {
        self.layouts.read().get(event).copied().unwrap_or(1)
    }

    /// Whether every shard of `event` was read empty less than
    /// [`SOLD_OUT_FRESH`] ago.
    fn known_sold_out(&self, event: &EventId) -> bool {
        self.sold_out
            .read()
            .get(event)
            .is_some_and(|at| at.elapsed() < SOLD_OUT_FRESH)
    }

    /// The lock a pass over `event`'s shards takes (one per event, kept
    /// for the router's life: events are few).
    fn survey_turn(&self, event: &EventId) -> Arc<tokio::sync::Mutex<()>> {
        if let Some(turn) = self.survey_turns.read().get(event) {
            return turn.clone();
        }
        self.survey_turns
            .write()
            .entry(event.clone())
            .or_default()
            .clone()
    }

    fn note_sold_out(&self, event: &EventId, empty: bool) {
        let mut map = self.sold_out.write();
        if empty {
            map.insert(event.clone(), std::time::Instant::now());
        } else {
            map.remove(event);
        }
    }

    fn learn(&self, event: &EventId, shards: u32) {
        if shards == 0 {
            return;
        }
        let mut map = self.layouts.write();
        if shards == 1 {
            map.remove(event);
        } else {
            map.insert(event.clone(), shards);
        }
    }
}

impl<I: Inventory> Sharded<I> {
    /// The event's layout as shard 0 stores it (`None`: no such event; 0:
    /// frozen), learned on the way.
    pub async fn layout_of(&self, event: &EventId) -> Result<Option<u32>> {
        let s = self.inner.read(&event.base()).await?;
        if let Some(s) = &s {
            self.learn(&event.base(), s.shards);
        }
        Ok(s.map(|s| s.shards))
    }

    /// Moves up to `need` units to shard `home` from the others, in ring
    /// order from `home + 1`; returns how many landed there.
    async fn pull(&self, event: &EventId, home: u32, shards: u32, need: u64) -> Result<u64> {
        let ring: Vec<u32> = (1..shards).map(|step| (home + step) % shards).collect();
        self.pull_from(event, home, &ring, need).await
    }

    /// Moves up to `need` units to shard `home` from the shards `from`, in
    /// that order; returns how many landed there.
    async fn pull_from(&self, event: &EventId, home: u32, from: &[u32], need: u64) -> Result<u64> {
        let to = event.shard(home);
        let mut got = 0;
        for &k in from {
            if got >= need {
                break;
            }
            let from = event.shard(k);
            let id = transfer_id();
            let TransferOut::Moved { qty, .. } =
                self.inner.transfer_out(&from, &to, &id, need - got).await?
            else {
                continue;
            };
            if qty == 0 {
                continue;
            }
            // A failure here leaves the transfer pending on `from`: its
            // units are in transit until a sweep lands them.
            if let Ok(TransferIn::Applied { .. } | TransferIn::Replayed) =
                self.inner.transfer_in(&to, &from, &id, qty).await
            {
                got += qty;
                self.inner.transfer_done(&from, &id).await?;
            }
        }
        Ok(got)
    }

    /// Every shard's available and in-transit units, read one by one.
    /// Every shard's available and in-transit units and its `moves`, read
    /// one by one: not a snapshot (module docs, "Sold out").
    async fn survey(&self, event: &EventId, shards: u32) -> Result<Survey> {
        let mut survey = Survey::default();
        for k in 0..shards {
            let s = self.inner.read(&event.shard(k)).await?;
            let s = s.as_ref();
            survey
                .available
                .push(s.and_then(|s| s.available).unwrap_or(0));
            survey.in_transit += s.map_or(0, |s| s.in_transit);
            survey.moves.push(s.map_or(0, |s| s.moves));
        }
        Ok(survey)
    }

    /// Lands the transfers that left `shard` more than [`SWEEP_AFTER_MS`]
    /// (or [`Sharded::with_sweep_after`]) ago (a gateway stopped between their two halves); returns how many.
    /// Idempotent: a transfer lands once whoever sweeps.
    pub async fn sweep(&self, shard: &EventId) -> Result<usize> {
        let mut landed = 0;
        for p in self.inner.pending_transfers(shard).await? {
            if p.age_ms < self.sweep_after_ms {
                continue;
            }
            match self.inner.transfer_in(&p.to, shard, &p.id, p.qty).await? {
                TransferIn::Applied { .. } | TransferIn::Replayed => {
                    self.inner.transfer_done(shard, &p.id).await?;
                    landed += 1;
                }
                // The destination is lost or frozen: the units stay in
                // transit (never sold) until it is back or re-split.
                TransferIn::NotReady | TransferIn::Frozen => {}
            }
        }
        Ok(landed)
    }

    /// The hold of a sharded event (or a plain one): at the visitor's
    /// home, pulling units there when it is short.
    async fn hold_routed(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
    ) -> Result<HoldOutcome> {
        if event.is_shard() {
            // Never a route: the shard's layout refuses it.
            return self
                .inner
                .hold_in_layout(event, visitor, qty, idempotency_key, 1)
                .await;
        }
        let mut shards = self.cached_shards(event);
        for round in 0..ROUTER_ROUNDS_MAX {
            let home = home_shard(visitor, shards);
            let target = event.shard(home);
            let r = self
                .inner
                .hold_in_layout(&target, visitor, qty, idempotency_key, shards)
                .await?;
            match r {
                HoldOutcome::Resharded { shards: stored } => {
                    let actual = if home == 0 {
                        stored
                    } else {
                        self.layout_of(event).await?.unwrap_or(0)
                    };
                    self.learn(event, actual);
                    if actual == 0 || actual == shards {
                        // Frozen, or a shard whose layout is not set yet.
                        return Ok(HoldOutcome::NotReady);
                    }
                    shards = actual;
                }
                HoldOutcome::SoldOut { available } if shards > 1 => {
                    let need = u64::from(qty).saturating_sub(available);
                    let patient = round < ROUTER_ROUNDS;
                    if patient && self.pull(event, home, shards, need).await? > 0 {
                        continue;
                    }
                    if self.known_sold_out(event) {
                        return Ok(r);
                    }
                    // The walk found nothing, but units may be moving
                    // between other shards (out of one, not yet into the
                    // next) or have landed behind the walk: read every
                    // shard before saying "sold out", one buyer of the
                    // event at a time (when the crowd meets the end of a
                    // sale, the first pass answers for all who wait).
                    let turn = self.survey_turn(event);
                    let turn = turn.lock().await;
                    if self.known_sold_out(event) {
                        return Ok(r);
                    }
                    let mut survey = self.survey(event, shards).await?;
                    if survey.left() < u64::from(qty) {
                        // Believed only if no unit moved while it read:
                        // every shard's `moves` the same on a second read.
                        let check = self.survey(event, shards).await?;
                        if check.moves == survey.moves {
                            let left = survey.left();
                            self.note_sold_out(event, left == 0);
                            let all = survey.available.iter().sum();
                            return Ok(HoldOutcome::SoldOut { available: all });
                        }
                        survey = check;
                    }
                    let richest = survey.richest(home);
                    if richest.is_empty() {
                        // Only units in transit (or landed at home since):
                        // the pull that moves them ends in a moment, or
                        // its gateway died and they wait for a sweep.
                        // Past the patient rounds the puller may be a task
                        // the OS has not run for a while: wait a moment
                        // before looking again, until the rounds run out.
                        drop(turn);
                        if patient {
                            tokio::task::yield_now().await;
                        } else {
                            tokio::time::sleep(TRANSIT_WAIT).await;
                        }
                        continue;
                    }
                    if patient {
                        // As before the twelfth attempt: the pass's turn
                        // is not kept over the pull.
                        drop(turn);
                        self.pull_from(event, home, &richest, need).await?;
                        continue;
                    }
                    self.pull_from(event, home, &richest, need).await?;
                    // Lost too often: hold at home before another buyer
                    // that keeps losing takes the turn (and the units).
                    let r = self
                        .inner
                        .hold_in_layout(&target, visitor, qty, idempotency_key, shards)
                        .await?;
                    drop(turn);
                    if !matches!(
                        r,
                        HoldOutcome::SoldOut { .. } | HoldOutcome::Resharded { .. }
                    ) {
                        return Ok(r);
                    }
                }
                other => return Ok(other),
            }
        }
        // Neither held nor proved sold out: units are still moving (or
        // stuck in transit until a sweep lands them). Try again.
        Err(crate::ReservationError::Contended {
            rounds: ROUTER_ROUNDS_MAX,
        })
    }

    /// Loads configured stock of an event split into `shards`, only into a
    /// store that never had it ([`Inventory::load_if_new`]'s rule, asked
    /// of shard 0). Two gateways starting at once create it once.
    pub async fn load_sharded_if_new(
        &self,
        event: &EventId,
        spec: &StockSpec,
        shards: u32,
    ) -> Result<LoadOutcome> {
        if let Some(s) = self.inner.read(event).await? {
            self.learn(event, s.shards);
            return Ok(LoadOutcome::Present);
        }
        if let Some(last_version) = self.inner.loaded_version(event).await? {
            return Ok(LoadOutcome::Lost { last_version });
        }
        Ok(match self.set_sharded_stock(event, spec, shards).await? {
            SetStockOutcome::Created { available } | SetStockOutcome::Updated { available } => {
                LoadOutcome::Loaded { available }
            }
            SetStockOutcome::Invalid { reason } => LoadOutcome::Invalid { reason },
            _ => LoadOutcome::Present,
        })
    }

    /// Loads or changes an event split into `shards` (1: plain): creates
    /// it, changes its total and settings, or changes its shard count
    /// while nothing is held or sold (module docs). The version rule of
    /// [`Inventory::set_stock`] applies to shard 0.
    pub async fn set_sharded_stock(
        &self,
        event: &EventId,
        spec: &StockSpec,
        shards: u32,
    ) -> Result<SetStockOutcome> {
        if event.is_shard() {
            return Ok(SetStockOutcome::Invalid {
                reason: "a shard is not an event",
            });
        }
        if shards == 0 || shards > MAX_SHARDS {
            return Ok(SetStockOutcome::Invalid {
                reason: "shards must be 1 to 64",
            });
        }
        // New stock may come: no "sold out" from memory.
        self.note_sold_out(event, false);
        if let Some(reason) = spec_problem(spec) {
            return Ok(SetStockOutcome::Invalid { reason });
        }
        let Some(s0) = self.inner.read(event).await? else {
            if shards == 1 {
                return self.inner.set_stock(event, spec).await;
            }
            return self.create_sharded(event, spec, shards).await;
        };
        if !s0.categories.is_empty() && shards > 1 {
            return Ok(SetStockOutcome::Invalid {
                reason: "an event with categories cannot be sharded",
            });
        }
        if spec.version <= s0.version {
            return Ok(SetStockOutcome::Stale {
                current_version: s0.version,
            });
        }
        let current = s0.shards;
        if current == shards && shards > 1 {
            return self.change_sharded(event, spec, shards).await;
        }
        if current == 1 && shards == 1 {
            return self.inner.set_stock(event, spec).await;
        }
        // A frozen event (a change stopped midway) is re-split from what
        // its shard 0 says it had.
        let old = if current == 0 { MAX_SHARDS } else { current };
        self.reshard(event, spec, old, shards).await
    }

    /// The layout every shard of `event` gets, with `spec`'s settings.
    fn layout(spec: &StockSpec, shards: u32, shard_total: ShardTotal) -> ShardLayout {
        ShardLayout {
            shards,
            shard_total,
            cart_limit: spec.cart_limit,
            hold_ttl_ms: spec.hold_ttl_ms(),
            room: spec.room.clone(),
            version: Some(spec.version),
            require_idle: false,
        }
    }

    async fn create_sharded(
        &self,
        event: &EventId,
        spec: &StockSpec,
        shards: u32,
    ) -> Result<SetStockOutcome> {
        let parts = split(spec.total, shards);
        // Shards 1.. first: nothing routes to them before shard 0 says
        // the layout, and they refuse holds until their own says it.
        for k in 1..shards {
            let shard = event.shard(k);
            let part = StockSpec {
                total: parts[k as usize],
                ..spec.clone()
            };
            match self.inner.set_stock(&shard, &part).await? {
                SetStockOutcome::Created { .. }
                | SetStockOutcome::Recreated { .. }
                | SetStockOutcome::Updated { .. }
                // Another gateway created it with this version.
                | SetStockOutcome::Stale { .. } => {}
                other => return Ok(other),
            }
            self.inner
                .set_layout(&shard, &Self::layout(spec, shards, ShardTotal::Keep))
                .await?;
        }
        // Shard 0 is created empty, given the layout, then its units: a
        // hold routed as if the event were plain meets 0 units, then the
        // layout, never units it could take off its home.
        let empty = StockSpec {
            total: 0,
            ..spec.clone()
        };
        let created = match self.inner.set_stock(event, &empty).await? {
            c @ (SetStockOutcome::Created { .. } | SetStockOutcome::Recreated { .. }) => c,
            // Another gateway is creating it.
            SetStockOutcome::Stale { .. } => {
                return Ok(SetStockOutcome::Stale {
                    current_version: spec.version,
                });
            }
            other => return Ok(other),
        };
        let own = parts[0];
        self.inner
            .set_layout(
                event,
                &Self::layout(spec, shards, ShardTotal::Set(spec.total - own)),
            )
            .await?;
        if own > 0 {
            let row = StockRow {
                category: None,
                change: StockChange::Delta {
                    delta: i64::try_from(own).unwrap_or(i64::MAX),
                    key: format!("sluice-shards-v{}", spec.version),
                },
            };
            self.inner.apply_stock(event, &row).await?;
        }
        self.learn(event, shards);
        Ok(match created {
            SetStockOutcome::Recreated { lost_version, .. } => SetStockOutcome::Recreated {
                available: spec.total,
                lost_version,
            },
            _ => SetStockOutcome::Created {
                available: spec.total,
            },
        })
    }

    /// A new total and settings for an event keeping its `shards`.
    async fn change_sharded(
        &self,
        event: &EventId,
        spec: &StockSpec,
        shards: u32,
    ) -> Result<SetStockOutcome> {
        let row = StockRow {
            category: None,
            change: StockChange::Snapshot {
                total: spec.total,
                version: spec.version,
            },
        };
        match self.apply_sharded(event, &row, shards).await? {
            FeedOutcome::Applied(_) | FeedOutcome::Replayed(_) => {}
            FeedOutcome::Stale { current_version } => {
                return Ok(SetStockOutcome::Stale { current_version });
            }
            FeedOutcome::BelowCommitted { held, confirmed }
            | FeedOutcome::CategoryBelowCommitted {
                held, confirmed, ..
            } => return Ok(SetStockOutcome::BelowCommitted { held, confirmed }),
            FeedOutcome::Invalid { reason } => return Ok(SetStockOutcome::Invalid { reason }),
            _ => {
                return Ok(SetStockOutcome::Invalid {
                    reason: "the event is not ready",
                });
            }
        }
        for k in (1..shards).chain([0]) {
            self.inner
                .set_layout(
                    &event.shard(k),
                    &Self::layout(spec, shards, ShardTotal::Keep),
                )
                .await?;
        }
        let available = self
            .read(event)
            .await?
            .and_then(|s| s.available)
            .unwrap_or(0);
        Ok(SetStockOutcome::Updated { available })
    }

    /// Changes the shard count from `old` to `new` while nothing is held
    /// or sold (module docs).
    async fn reshard(
        &self,
        event: &EventId,
        spec: &StockSpec,
        old: u32,
        new: u32,
    ) -> Result<SetStockOutcome> {
        let freeze = |shards| ShardLayout {
            shards,
            shard_total: ShardTotal::Keep,
            cart_limit: spec.cart_limit,
            hold_ttl_ms: spec.hold_ttl_ms(),
            room: spec.room.clone(),
            version: None,
            require_idle: shards == 0,
        };
        let mut frozen = Vec::new();
        let mut busy = None;
        let mut total_held = 0;
        let mut total_confirmed = 0;
        for k in 0..old {
            let shard = event.shard(k);
            match self.inner.set_layout(&shard, &freeze(0)).await? {
                LayoutOutcome::Set => frozen.push(shard),
                LayoutOutcome::Busy { held, confirmed } => {
                    total_held += held;
                    total_confirmed += confirmed;
                    busy = Some(());
                }
                // A shard that does not exist (a frozen event's guess).
                LayoutOutcome::NotReady | LayoutOutcome::Stale { .. } => {}
            }
        }
        if busy.is_some() {
            // Back as they were (shard 0 last: it is what routers read).
            for shard in frozen.iter().rev() {
                self.inner.set_layout(shard, &freeze(old)).await?;
            }
            return Ok(SetStockOutcome::ShardsBusy {
                held: total_held,
                confirmed: total_confirmed,
            });
        }
        // Every shard idle and frozen: transfers in flight are void (the
        // totals are set afresh), then the new split.
        for shard in &frozen {
            for p in self.inner.pending_transfers(shard).await? {
                self.inner.transfer_done(shard, &p.id).await?;
            }
        }
        let parts = split(spec.total, new);
        for k in 0..old.max(new) {
            let shard = event.shard(k);
            let part = StockSpec {
                total: parts.get(k as usize).copied().unwrap_or(0),
                ..spec.clone()
            };
            if k >= new && !frozen.contains(&shard) {
                continue;
            }
            match self.inner.set_stock(&shard, &part).await? {
                SetStockOutcome::Created { .. }
                | SetStockOutcome::Recreated { .. }
                | SetStockOutcome::Updated { .. }
                | SetStockOutcome::Stale { .. } => {}
                other => return Ok(other),
            }
        }
        for k in (1..new).chain([0]) {
            let total = match (k, new) {
                (0, 1) => ShardTotal::Clear,
                (0, _) => ShardTotal::Set(spec.total),
                _ => ShardTotal::Keep,
            };
            self.inner
                .set_layout(&event.shard(k), &Self::layout(spec, new, total))
                .await?;
        }
        self.learn(event, new);
        Ok(SetStockOutcome::Updated {
            available: spec.total,
        })
    }

    /// A feed row (or a PUT's snapshot) of a sharded event, on shard 0,
    /// pulling units there when a decrease needs more than it has.
    async fn apply_sharded(
        &self,
        event: &EventId,
        row: &StockRow,
        shards: u32,
    ) -> Result<FeedOutcome> {
        self.note_sold_out(event, false);
        let mut r = self.inner.apply_stock(event, row).await?;
        for _ in 0..3 {
            let FeedOutcome::StockNegative { available } = r else {
                break;
            };
            let need = match &row.change {
                StockChange::Delta { delta, .. } => delta.unsigned_abs().saturating_sub(available),
                StockChange::Snapshot { total, .. } => {
                    let Some(s0) = self.inner.read(event).await? else {
                        break;
                    };
                    let drop = s0.shard_total_or_total().saturating_sub(*total);
                    drop.saturating_sub(available)
                }
            };
            if need == 0 || self.pull(event, 0, shards, need).await? == 0 {
                break;
            }
            r = self.inner.apply_stock(event, row).await?;
        }
        Ok(match r {
            FeedOutcome::StockNegative { .. } => {
                let s = self.read(event).await?;
                match (&row.change, s) {
                    (StockChange::Snapshot { .. }, Some(s)) => FeedOutcome::BelowCommitted {
                        held: s.held,
                        confirmed: s.confirmed,
                    },
                    (_, s) => FeedOutcome::StockNegative {
                        available: s.and_then(|s| s.available).unwrap_or(0),
                    },
                }
            }
            FeedOutcome::Applied(a) => FeedOutcome::Applied(self.event_applied(event, a).await?),
            FeedOutcome::Replayed(a) => FeedOutcome::Replayed(self.event_applied(event, a).await?),
            other => other,
        })
    }

    /// A feed answer of shard 0 told as the event's counters.
    async fn event_applied(&self, event: &EventId, a: FeedApplied) -> Result<FeedApplied> {
        Ok(match self.read(event).await? {
            Some(s) => FeedApplied {
                total: s.total,
                available: s.available.unwrap_or(0),
                ..a
            },
            None => a,
        })
    }
}

impl EventState {
    /// The event's total as shard 0 keeps it, else its own total.
    pub(crate) fn shard_total_or_total(&self) -> u64 {
        self.shard_total.unwrap_or(self.total)
    }
}

impl Sharded<crate::InventoryBackend> {
    /// Applies feed rows of one event in order, as
    /// [`Inventory::apply_stock`] would one by one: a plain event's rows in
    /// one pipeline ([`crate::InventoryBackend::apply_stock_batch`]); a
    /// sharded event's one at a time (a row may move units between
    /// shards). A plain-looking event whose decrease was refused is asked
    /// for its layout, as `apply_stock` does, and that row applied again
    /// across its shards. On an error some rows may have been applied:
    /// retry the batch whole (rows are idempotent).
    pub async fn apply_stock_batch(
        &self,
        event: &EventId,
        rows: &[StockRow],
    ) -> Result<Vec<FeedOutcome>> {
        if self.cached_shards(event) > 1 {
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                out.push(self.apply_stock(event, row).await?);
            }
            return Ok(out);
        }
        let mut out = self.inner.apply_stock_batch(event, rows).await?;
        for (row, r) in rows.iter().zip(out.iter_mut()) {
            if matches!(r, FeedOutcome::StockNegative { .. })
                && row.category.is_none()
                && let Some(n) = self.layout_of(event).await?
                && n > 1
            {
                *r = self.apply_sharded(event, row, n).await?;
            }
        }
        Ok(out)
    }
}

impl<I: Inventory> Inventory for Sharded<I> {
    async fn set_stock_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        categories: &[CategorySpec],
    ) -> Result<SetStockOutcome> {
        if event.is_shard() {
            return Ok(SetStockOutcome::Invalid {
                reason: "a shard is not an event",
            });
        }
        match self.layout_of(event).await? {
            Some(n) if n != 1 => {
                if !categories.is_empty() {
                    return Ok(SetStockOutcome::Invalid {
                        reason: "a sharded event has no categories",
                    });
                }
                if n == 0 {
                    return Ok(SetStockOutcome::Invalid {
                        reason: "the event's shards are changing: load it again naming its shards",
                    });
                }
                self.set_sharded_stock(event, spec, n).await
            }
            _ => {
                self.inner
                    .set_stock_with_categories(event, spec, categories)
                    .await
            }
        }
    }

    async fn load_if_new_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        categories: &[CategorySpec],
    ) -> Result<LoadOutcome> {
        self.inner
            .load_if_new_with_categories(event, spec, categories)
            .await
    }

    async fn loaded_version(&self, event: &EventId) -> Result<Option<u64>> {
        self.inner.loaded_version(event).await
    }

    async fn remember_loaded(&self, event: &EventId, version: u64) -> Result<()> {
        self.inner.remember_loaded(event, version).await
    }

    async fn restore_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        record: &EventRecord,
        categories: &CategoryRecord,
    ) -> Result<RestoreOutcome> {
        self.inner
            .restore_with_categories(event, spec, record, categories)
            .await
    }

    async fn apply_stock(&self, event: &EventId, row: &StockRow) -> Result<FeedOutcome> {
        let shards = self.cached_shards(event);
        if shards > 1 && row.category.is_none() {
            return self.apply_sharded(event, row, shards).await;
        }
        let r = self.inner.apply_stock(event, row).await?;
        // Shard 0 of an event this gateway took for plain: learn, and
        // pull what a decrease needs.
        if matches!(r, FeedOutcome::StockNegative { .. })
            && row.category.is_none()
            && let Some(n) = self.layout_of(event).await?
            && n > 1
        {
            return self.apply_sharded(event, row, n).await;
        }
        Ok(r)
    }

    async fn hold_items(
        &self,
        event: &EventId,
        visitor: &str,
        items: &[Item],
        idempotency_key: Option<&str>,
    ) -> Result<HoldOutcome> {
        let not_here = || HoldOutcome::CategoryNotFound {
            category: items
                .first()
                .map(|i| i.category.to_string())
                .unwrap_or_default(),
        };
        if self.cached_shards(event) > 1 {
            return Ok(not_here());
        }
        Ok(
            match self
                .inner
                .hold_items(event, visitor, items, idempotency_key)
                .await?
            {
                HoldOutcome::Resharded { shards } => {
                    self.learn(event, shards);
                    not_here()
                }
                other => other,
            },
        )
    }

    async fn hold_in_layout(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
        shards: u32,
    ) -> Result<HoldOutcome> {
        self.inner
            .hold_in_layout(event, visitor, qty, idempotency_key, shards)
            .await
    }

    async fn hold(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
    ) -> Result<HoldOutcome> {
        self.hold_routed(event, visitor, qty, idempotency_key).await
    }

    async fn set_layout(&self, event: &EventId, layout: &ShardLayout) -> Result<LayoutOutcome> {
        self.inner.set_layout(event, layout).await
    }

    async fn transfer_out(
        &self,
        from: &EventId,
        to: &EventId,
        id: &str,
        max: u64,
    ) -> Result<TransferOut> {
        self.inner.transfer_out(from, to, id, max).await
    }

    async fn transfer_in(
        &self,
        to: &EventId,
        from: &EventId,
        id: &str,
        qty: u64,
    ) -> Result<TransferIn> {
        self.inner.transfer_in(to, from, id, qty).await
    }

    async fn transfer_done(&self, from: &EventId, id: &str) -> Result<()> {
        self.inner.transfer_done(from, id).await
    }

    async fn pending_transfers(&self, from: &EventId) -> Result<Vec<PendingTransfer>> {
        self.inner.pending_transfers(from).await
    }

    async fn get_hold(&self, hold_id: &HoldId, visitor: &str) -> Result<Option<HoldView>> {
        self.inner.get_hold(hold_id, visitor).await
    }

    async fn release(&self, hold_id: &HoldId, visitor: &str) -> Result<ReleaseOutcome> {
        self.inner.release(hold_id, visitor).await
    }

    async fn confirm(
        &self,
        hold_id: &HoldId,
        payment_event_id: &str,
        succeeded: bool,
    ) -> Result<ConfirmOutcome> {
        self.inner
            .confirm(hold_id, payment_event_id, succeeded)
            .await
    }

    async fn reap(&self, event: &EventId, max: usize) -> Result<usize> {
        let n = self.inner.reap(event, max).await?;
        if event.is_shard() || self.cached_shards(event) > 1 {
            self.sweep(event).await?;
        }
        Ok(n)
    }

    async fn read(&self, event: &EventId) -> Result<Option<EventState>> {
        let Some(mut s0) = self.inner.read(event).await? else {
            return Ok(None);
        };
        if event.is_shard() {
            return Ok(Some(s0));
        }
        self.learn(event, s0.shards);
        if s0.shards == 0 {
            s0.available = None;
            s0.invariant_holds = false;
            return Ok(Some(s0));
        }
        if s0.shards == 1 {
            return Ok(Some(s0));
        }
        let mut states = vec![shard_state(event.clone(), Some(&s0))];
        let mut each_holds = s0.invariant_holds;
        for k in 1..s0.shards {
            let shard = event.shard(k);
            let s = self.inner.read(&shard).await?;
            each_holds &= s.as_ref().is_some_and(|s| s.invariant_holds);
            states.push(shard_state(shard, s.as_ref()));
        }
        let total = s0.shard_total_or_total();
        let sum = |f: fn(&ShardState) -> u64| states.iter().map(f).sum::<u64>();
        let held = sum(|s| s.held);
        let confirmed = sum(|s| s.confirmed);
        let in_transit = sum(|s| s.sending);
        let available = states.iter().map(|s| s.available).sum::<Option<u64>>();
        let counted = available.map(|a| a + held + confirmed + in_transit);
        Ok(Some(EventState {
            total,
            available,
            held,
            confirmed,
            invariant_holds: each_holds && counted == Some(total),
            in_transit,
            shard_states: states,
            ..s0
        }))
    }

    async fn schedule_waves(&self, event: &EventId, waves: &[Wave]) -> Result<ScheduleOutcome> {
        if event.is_shard() || self.layout_of(event).await?.is_some_and(|n| n != 1) {
            return Ok(ScheduleOutcome::Invalid {
                reason: "a sharded event takes no waves",
            });
        }
        self.inner.schedule_waves(event, waves).await
    }

    async fn events(&self) -> Result<Vec<EventId>> {
        self.inner.events().await
    }

    async fn recent_transitions(&self, event: &EventId, n: usize) -> Result<Vec<Transition>> {
        let shards = self.cached_shards(event);
        if shards <= 1 || event.is_shard() {
            return self.inner.recent_transitions(event, n).await;
        }
        let mut all = Vec::new();
        for k in 0..shards {
            all.extend(self.inner.recent_transitions(&event.shard(k), n).await?);
        }
        all.sort_by_key(|t| t.ts_ms);
        let skip = all.len().saturating_sub(n);
        Ok(all.split_off(skip))
    }
}

fn shard_state(id: EventId, s: Option<&EventState>) -> ShardState {
    match s {
        Some(s) => ShardState {
            id,
            total: s.total,
            available: s.available,
            held: s.held,
            confirmed: s.confirmed,
            sending: s.in_transit,
        },
        None => ShardState {
            id,
            total: 0,
            available: None,
            held: 0,
            confirmed: 0,
            sending: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{home_shard, split};

    #[test]
    fn split_adds_up_and_shard_0_takes_the_rest() {
        for total in [0u64, 1, 7, 8, 50_000, 50_003] {
            for n in 1..=9 {
                let parts = split(total, n);
                assert_eq!(parts.len(), n as usize);
                assert_eq!(parts.iter().sum::<u64>(), total);
                assert!(parts.iter().skip(1).all(|p| *p == total / u64::from(n)));
            }
        }
    }

    #[test]
    fn homes_are_stable_and_spread() {
        // Fixed values: a change would move every live cart.
        assert_eq!(home_shard("", 8), 0xcbf2_9ce4_8422_2325_u64 as u32 % 8);
        assert_eq!(home_shard("visitor-1", 1), 0);
        let mut counts = [0u32; 8];
        for i in 0..8_000 {
            counts[home_shard(&format!("v{i}"), 8) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }
}
