//! A plain model of the reservation semantics, and a driver that runs the
//! same operations against a store and the model and compares every answer.
//!
//! The model is deliberately naive (vectors and linear scans) so that it is
//! obviously right; the stores must agree with it on every outcome, on the
//! counters and on each hold's sequence of transitions.
//!
//! Time: the model keeps its own `now`. On the memory store it is the
//! store's [`crate::ManualClock`], advanced by any amount. On Redis time is
//! real, so the Redis strategy only advances by a whole TTL plus a margin
//! (every hold taken before lapses, none taken after does) and only reaps
//! with a `max` above the number of holds. Holds taken between two time
//! steps share the model's deadline; a partial reap (a hold or a feed
//! delta freeing just enough units) takes them in the store's order, by
//! the deadline each hold's answer gave (`expires_at_ms`), then member.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;

use super::Harness;
use crate::{
    ConfirmOutcome, EventId, FeedApplied, FeedOutcome, HoldId, HoldOutcome, HoldStatus, HoldView,
    Inventory, LAZY_REAP_MAX, ReleaseOutcome, SetStockOutcome, StockChange, StockRow,
    TransitionKind,
};

/// One step of a case.
#[derive(Clone, Debug)]
pub enum Op {
    /// `hold(visitor, qty, key)`.
    Hold {
        /// Visitor index.
        visitor: u8,
        /// Quantity (0 and above the limit included).
        qty: u32,
        /// Idempotency key index.
        key: Option<u8>,
    },
    /// `release(hold, visitor)`; `by_owner == false` uses another visitor.
    Release {
        /// Index into the holds taken so far (modulo); past them: a bogus id.
        hold: u8,
        /// Owner or someone else.
        by_owner: bool,
    },
    /// `confirm(hold, payment, succeeded)`.
    Confirm {
        /// As in `Release`.
        hold: u8,
        /// Payment event id index.
        payment: u8,
        /// Payment outcome.
        succeeded: bool,
    },
    /// `get_hold`.
    Get {
        /// As in `Release`.
        hold: u8,
        /// Owner or someone else.
        by_owner: bool,
    },
    /// Move time forward by this many milliseconds.
    Advance(u64),
    /// `reap(max)`.
    Reap(usize),
    /// `read`.
    Read,
    /// A stock feed delta (`apply_stock`), with key index `key` (a few
    /// keys, so replays and reuses happen).
    Delta {
        /// Units (not 0).
        delta: i64,
        /// Key index.
        key: u8,
    },
    /// A stock feed snapshot (versions often stale).
    Snapshot {
        /// The new total.
        total: u64,
        /// The source version.
        version: u64,
    },
}

/// Feed rows: deltas of ±1..4 over 3 keys, snapshots of 0..14 units with
/// versions 0..8 (the event starts at version 1).
fn feed_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1i64..5, any::<bool>(), 0u8..3).prop_map(|(n, neg, key)| Op::Delta {
            delta: if neg { -n } else { n },
            key,
        }),
        1 => (0u64..14, 0u64..8).prop_map(|(total, version)| Op::Snapshot { total, version }),
    ]
}

/// Settings of one case.
#[derive(Clone, Debug)]
pub struct CaseSpec {
    /// Stock.
    pub total: u64,
    /// Cart limit.
    pub cart_limit: u32,
    /// Hold TTL (ms).
    pub ttl_ms: u64,
}

/// Operations for the memory store: any time step, any reap size.
pub fn memory_case() -> impl Strategy<Value = (CaseSpec, Vec<Op>)> {
    let spec = (1u64..12, 1u32..5).prop_map(|(total, cart_limit)| CaseSpec {
        total,
        cart_limit,
        ttl_ms: 1_000,
    });
    let op = prop_oneof![
        6 => (0u8..4, 0u32..6, proptest::option::weighted(0.3, 0u8..2))
            .prop_map(|(visitor, qty, key)| Op::Hold { visitor, qty, key }),
        2 => (any::<u8>(), proptest::bool::weighted(0.85))
            .prop_map(|(hold, by_owner)| Op::Release { hold, by_owner }),
        3 => (any::<u8>(), 0u8..4, any::<bool>())
            .prop_map(|(hold, payment, succeeded)| Op::Confirm { hold, payment, succeeded }),
        1 => (any::<u8>(), proptest::bool::weighted(0.85))
            .prop_map(|(hold, by_owner)| Op::Get { hold, by_owner }),
        2 => prop_oneof![Just(1_000u64), 0u64..1_500].prop_map(Op::Advance),
        1 => (0usize..4).prop_map(Op::Reap),
        1 => Just(Op::Read),
        2 => feed_op(),
    ];
    (spec, proptest::collection::vec(op, 1..40))
}

/// Operations for Redis: whole-TTL time steps (rare) and full reaps.
pub fn redis_case(ttl_ms: u64) -> impl Strategy<Value = (CaseSpec, Vec<Op>)> {
    let spec = (1u64..12, 1u32..5).prop_map(move |(total, cart_limit)| CaseSpec {
        total,
        cart_limit,
        ttl_ms,
    });
    let op = prop_oneof![
        6 => (0u8..4, 0u32..6, proptest::option::weighted(0.3, 0u8..2))
            .prop_map(|(visitor, qty, key)| Op::Hold { visitor, qty, key }),
        2 => (any::<u8>(), proptest::bool::weighted(0.85))
            .prop_map(|(hold, by_owner)| Op::Release { hold, by_owner }),
        3 => (any::<u8>(), 0u8..4, any::<bool>())
            .prop_map(|(hold, payment, succeeded)| Op::Confirm { hold, payment, succeeded }),
        1 => (any::<u8>(), proptest::bool::weighted(0.85))
            .prop_map(|(hold, by_owner)| Op::Get { hold, by_owner }),
        1 => Just(Op::Advance(0)), // 0 = one TTL plus the margin
        1 => Just(Op::Reap(LAZY_REAP_MAX)),
        1 => Just(Op::Read),
        2 => feed_op(),
    ];
    (spec, proptest::collection::vec(op, 1..25))
}

#[derive(Clone, Debug)]
struct MHold {
    id: HoldId,
    visitor: String,
    qty: u32,
    /// As stored; `Held` past its deadline reads as `Expired`.
    status: HoldStatus,
    deadline: u64,
    /// The deadline the store gave it (its own clock, ms): on Redis, holds
    /// taken between two of the model's time steps share a model deadline
    /// and lapse in the store's order, this one's (then the member's).
    stored_ms: u64,
    /// Units still out (the deadline-index entry).
    out: bool,
}

impl MHold {
    fn status_at(&self, now: u64) -> HoldStatus {
        if self.status == HoldStatus::Held && self.deadline <= now {
            HoldStatus::Expired
        } else {
            self.status
        }
    }
    fn member(&self) -> String {
        format!("{}:{}:{}", self.id.suffix(), self.qty, self.visitor)
    }
    /// The order holds lapse in when a reap takes some of them.
    fn lapse_order(&self) -> (u64, u64, String) {
        (self.deadline, self.stored_ms, self.member())
    }
}

/// The model's state for one event.
#[derive(Debug)]
pub struct Model {
    total: u64,
    limit: u32,
    ttl: u64,
    now: u64,
    available: u64,
    held: u64,
    confirmed: u64,
    holds: Vec<MHold>,
    visitors: HashMap<String, u32>,
    idem: HashMap<(String, u8), usize>,
    /// payment event id → (hold index, recorded answer)
    payments: HashMap<String, (usize, ConfirmOutcome)>,
    /// (hold index, kind)
    log: Vec<(usize, TransitionKind)>,
    /// The event's stock version.
    version: u64,
    /// Feed delta keys applied: key index → (delta, first answer).
    feed_keys: HashMap<u8, (i64, FeedApplied)>,
}

impl Model {
    fn new(spec: &CaseSpec, now: u64) -> Self {
        Self {
            total: spec.total,
            limit: spec.cart_limit,
            ttl: spec.ttl_ms,
            now,
            available: spec.total,
            held: 0,
            confirmed: 0,
            holds: Vec::new(),
            visitors: HashMap::new(),
            idem: HashMap::new(),
            payments: HashMap::new(),
            log: Vec::new(),
            version: 1,
            feed_keys: HashMap::new(),
        }
    }

    fn expire_out(&mut self, i: usize) {
        let h = &mut self.holds[i];
        if !h.out {
            return;
        }
        h.out = false;
        let q = h.qty;
        let v = h.visitor.clone();
        self.available += u64::from(q);
        self.held -= u64::from(q);
        self.visitor_sub(&v, q);
        self.log.push((i, TransitionKind::Expired));
    }

    fn visitor_sub(&mut self, v: &str, q: u32) {
        let c = self.visitors.entry(v.to_owned()).or_default();
        *c -= q;
        if *c == 0 {
            self.visitors.remove(v);
        }
    }

    fn reap(&mut self, max: usize) -> usize {
        let mut due: Vec<usize> = (0..self.holds.len())
            .filter(|&i| self.holds[i].out && self.holds[i].deadline <= self.now)
            .collect();
        due.sort_by_key(|&i| self.holds[i].lapse_order());
        due.truncate(max);
        for &i in &due {
            self.expire_out(i);
        }
        due.len()
    }

    /// Expires every lapsed hold of `visitor` still out (a hold does this
    /// before its cart check).
    fn reap_visitor(&mut self, visitor: &str) {
        let mut due: Vec<usize> = (0..self.holds.len())
            .filter(|&i| {
                let h = &self.holds[i];
                h.out && h.deadline <= self.now && h.visitor == visitor
            })
            .collect();
        due.sort_by_key(|&i| self.holds[i].lapse_order());
        for i in due {
            self.expire_out(i);
        }
    }

    /// Expires lapsed holds oldest first until `need` units are available
    /// (a hold does this before answering sold out).
    fn reap_until_available(&mut self, need: u64) {
        while self.available < need {
            if self.reap(1) == 0 {
                break;
            }
        }
    }

    fn pick(&self, hold: u8) -> Option<usize> {
        let n = self.holds.len();
        let i = usize::from(hold);
        // One in eight picks lands past the holds: a bogus id.
        if n == 0 || i % 8 == 7 {
            None
        } else {
            Some(i % n)
        }
    }

    fn end(&mut self, i: usize, to: HoldStatus) {
        let h = &mut self.holds[i];
        h.out = false;
        h.status = to;
        let (q, v) = (h.qty, h.visitor.clone());
        self.held -= u64::from(q);
        if to == HoldStatus::Confirmed {
            self.confirmed += u64::from(q);
            self.log.push((i, TransitionKind::Confirmed));
        } else {
            self.available += u64::from(q);
            self.visitor_sub(&v, q);
            self.log.push((i, TransitionKind::Released));
        }
    }
}

fn visitor_name(v: u8) -> String {
    format!("visitor-{v}")
}

/// Runs one case against `h` and the model; `Err` describes the first
/// disagreement.
pub async fn run_case(h: &Harness, spec: &CaseSpec, ops: &[Op]) -> Result<(), String> {
    let exact_time = h.virtual_time();
    let margin = 400;
    let ev: EventId = h.event("model");
    let out = h
        .inv
        .set_stock(
            &ev,
            &super::spec(
                spec.total,
                spec.cart_limit,
                Duration::from_millis(spec.ttl_ms),
                1,
            ),
        )
        .await
        .map_err(|e| e.to_string())?;
    if out
        != (SetStockOutcome::Created {
            available: spec.total,
        })
    {
        return Err(format!("set_stock: {out:?}"));
    }
    let start = match &h.time {
        super::TimeControl::Manual(c) => crate::Clock::now_ms(&**c),
        super::TimeControl::Real => 0,
    };
    let mut m = Model::new(spec, start);
    let bogus = HoldId::generate(&ev);
    let err = |step: usize, op: &Op, msg: String| format!("step {step} {op:?}: {msg}");

    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Hold { visitor, qty, key } => {
                let vname = visitor_name(*visitor);
                let key_s = key.map(|k| format!("key-{k}"));
                let got = h
                    .inv
                    .hold(&ev, &vname, *qty, key_s.as_deref())
                    .await
                    .map_err(|e| e.to_string())?;
                m.reap(LAZY_REAP_MAX);
                m.reap_visitor(&vname);
                let replay = key
                    .and_then(|k| m.idem.get(&(vname.clone(), k)).copied())
                    .filter(|&i| m.holds[i].visitor == vname);
                let expect_view = |m: &Model, i: usize, v: &HoldView| -> Result<(), String> {
                    let mh = &m.holds[i];
                    let ok = v.hold_id == mh.id
                        && v.qty == mh.qty
                        && v.status == mh.status_at(m.now)
                        && v.available == m.available
                        && v.visitor == mh.visitor
                        && (!exact_time || v.expires_at_ms == mh.deadline);
                    if ok {
                        Ok(())
                    } else {
                        Err(format!(
                            "view {v:?} vs model {mh:?} available {}",
                            m.available
                        ))
                    }
                };
                if let Some(i) = replay {
                    match &got {
                        HoldOutcome::Replayed(v) => {
                            expect_view(&m, i, v).map_err(|e| err(step, op, e))?
                        }
                        other => {
                            return Err(err(step, op, format!("expected replay, got {other:?}")));
                        }
                    }
                    continue;
                }
                let have = m.visitors.get(&vname).copied().unwrap_or(0);
                let expected = if *qty == 0 || *qty > m.limit {
                    Some(HoldOutcome::InvalidQuantity { limit: m.limit })
                } else if have + qty > m.limit {
                    Some(HoldOutcome::CartLimitExceeded {
                        limit: m.limit,
                        held: have,
                    })
                } else {
                    m.reap_until_available(u64::from(*qty));
                    (m.available < u64::from(*qty)).then_some(HoldOutcome::SoldOut {
                        available: m.available,
                    })
                };
                match (expected, got) {
                    (Some(e), g) if e == g => {}
                    (None, HoldOutcome::Held(v)) => {
                        m.available -= u64::from(*qty);
                        m.held += u64::from(*qty);
                        *m.visitors.entry(vname.clone()).or_default() += qty;
                        m.holds.push(MHold {
                            id: v.hold_id.clone(),
                            visitor: vname.clone(),
                            qty: *qty,
                            status: HoldStatus::Held,
                            deadline: m.now + m.ttl,
                            stored_ms: v.expires_at_ms,
                            out: true,
                        });
                        let i = m.holds.len() - 1;
                        if let Some(k) = key {
                            m.idem.insert((vname.clone(), *k), i);
                        }
                        m.log.push((i, TransitionKind::Held));
                        expect_view(&m, i, &v).map_err(|e| err(step, op, e))?;
                    }
                    (e, g) => return Err(err(step, op, format!("expected {e:?}, got {g:?}"))),
                }
            }
            Op::Release { hold, by_owner } => {
                let pick = m.pick(*hold);
                let (id, who) = match pick {
                    Some(i) if *by_owner => (m.holds[i].id.clone(), m.holds[i].visitor.clone()),
                    Some(i) => (m.holds[i].id.clone(), "intruder".to_owned()),
                    None => (bogus.clone(), visitor_name(0)),
                };
                let got = h.inv.release(&id, &who).await.map_err(|e| e.to_string())?;
                let expected = match pick {
                    Some(i) if *by_owner => match m.holds[i].status {
                        HoldStatus::Confirmed => ReleaseOutcome::Confirmed,
                        HoldStatus::Released => ReleaseOutcome::AlreadyReleased,
                        HoldStatus::Expired => ReleaseOutcome::Expired,
                        HoldStatus::Held if m.holds[i].deadline <= m.now => {
                            m.expire_out(i);
                            m.holds[i].status = HoldStatus::Expired;
                            ReleaseOutcome::Expired
                        }
                        HoldStatus::Held => {
                            m.end(i, HoldStatus::Released);
                            ReleaseOutcome::Released
                        }
                    },
                    _ => ReleaseOutcome::NotFound,
                };
                if got != expected {
                    return Err(err(step, op, format!("expected {expected:?}, got {got:?}")));
                }
            }
            Op::Confirm {
                hold,
                payment,
                succeeded,
            } => {
                let pick = m.pick(*hold);
                let id = pick
                    .map(|i| m.holds[i].id.clone())
                    .unwrap_or_else(|| bogus.clone());
                // Mostly ids of this hold; payment 3 is one id shared by
                // every hold (a reuse the store must refuse).
                let pay_id = match (payment, pick) {
                    (3, _) => "pay-shared".to_owned(),
                    (p, Some(i)) => format!("pay-{i}-{p}"),
                    (p, None) => format!("pay-bogus-{p}"),
                };
                let got = h
                    .inv
                    .confirm(&id, &pay_id, *succeeded)
                    .await
                    .map_err(|e| e.to_string())?;
                let prior = m.payments.get(&pay_id).copied();
                let expected = match (pick, prior) {
                    (None, Some(_)) => ConfirmOutcome::PaymentReused,
                    (None, None) => ConfirmOutcome::NotFound,
                    (Some(i), Some((j, _))) if i != j => ConfirmOutcome::PaymentReused,
                    (Some(i), _) => {
                        if let Some((_, prior)) = prior {
                            prior
                        } else {
                            let answer = match m.holds[i].status {
                                HoldStatus::Confirmed => ConfirmOutcome::Confirmed,
                                HoldStatus::Released => ConfirmOutcome::Released,
                                HoldStatus::Expired => ConfirmOutcome::Expired,
                                HoldStatus::Held if m.holds[i].deadline <= m.now => {
                                    m.expire_out(i);
                                    m.holds[i].status = HoldStatus::Expired;
                                    ConfirmOutcome::Expired
                                }
                                HoldStatus::Held if *succeeded => {
                                    m.end(i, HoldStatus::Confirmed);
                                    ConfirmOutcome::Confirmed
                                }
                                HoldStatus::Held => {
                                    m.end(i, HoldStatus::Released);
                                    ConfirmOutcome::Released
                                }
                            };
                            m.payments.insert(pay_id.clone(), (i, answer));
                            answer
                        }
                    }
                };
                if got != expected {
                    return Err(err(step, op, format!("expected {expected:?}, got {got:?}")));
                }
            }
            Op::Get { hold, by_owner } => {
                let pick = m.pick(*hold);
                let (id, who) = match pick {
                    Some(i) if *by_owner => (m.holds[i].id.clone(), m.holds[i].visitor.clone()),
                    Some(i) => (m.holds[i].id.clone(), "intruder".to_owned()),
                    None => (bogus.clone(), visitor_name(0)),
                };
                let got = h.inv.get_hold(&id, &who).await.map_err(|e| e.to_string())?;
                match (pick.filter(|_| *by_owner), got) {
                    (None, None) => {}
                    (Some(i), Some(v)) => {
                        let mh = &m.holds[i];
                        if v.status != mh.status_at(m.now)
                            || v.qty != mh.qty
                            || v.available != m.available
                        {
                            return Err(err(
                                step,
                                op,
                                format!("got {v:?}, model {mh:?}, available {}", m.available),
                            ));
                        }
                    }
                    (e, g) => return Err(err(step, op, format!("expected {e:?}, got {g:?}"))),
                }
            }
            Op::Advance(by) => {
                if exact_time {
                    h.advance(Duration::from_millis(*by)).await;
                    m.now += by;
                } else {
                    let by = m.ttl + margin;
                    h.advance(Duration::from_millis(by)).await;
                    m.now += by;
                }
            }
            Op::Reap(max) => {
                let got = h.inv.reap(&ev, *max).await.map_err(|e| e.to_string())?;
                let expected = m.reap(*max);
                if got != expected {
                    return Err(err(step, op, format!("expected {expected}, got {got}")));
                }
            }
            Op::Delta { delta, key } => {
                let row = StockRow {
                    category: None,
                    change: StockChange::Delta {
                        delta: *delta,
                        key: format!("erp-{key}"),
                    },
                };
                let got = h
                    .inv
                    .apply_stock(&ev, &row)
                    .await
                    .map_err(|e| e.to_string())?;
                let n = delta.unsigned_abs();
                let expected = match m.feed_keys.get(key) {
                    Some((d, first)) if d == delta => FeedOutcome::Replayed(first.clone()),
                    Some(_) => FeedOutcome::KeyReused,
                    None => {
                        if *delta < 0 {
                            m.reap_until_available(n);
                        }
                        if *delta < 0 && m.available < n {
                            FeedOutcome::StockNegative {
                                available: m.available,
                            }
                        } else {
                            if *delta < 0 {
                                m.total -= n;
                                m.available -= n;
                            } else {
                                m.total += n;
                                m.available += n;
                            }
                            let a = FeedApplied {
                                total: m.total,
                                available: m.available,
                                category_total: None,
                                category_available: None,
                                version: Some(m.version),
                            };
                            m.feed_keys.insert(*key, (*delta, a.clone()));
                            FeedOutcome::Applied(a)
                        }
                    }
                };
                if got != expected {
                    return Err(err(step, op, format!("expected {expected:?}, got {got:?}")));
                }
            }
            Op::Snapshot { total, version } => {
                let row = StockRow {
                    category: None,
                    change: StockChange::Snapshot {
                        total: *total,
                        version: *version,
                    },
                };
                let got = h
                    .inv
                    .apply_stock(&ev, &row)
                    .await
                    .map_err(|e| e.to_string())?;
                let expected = if *version <= m.version {
                    FeedOutcome::Stale {
                        current_version: m.version,
                    }
                } else if *total < m.held + m.confirmed {
                    FeedOutcome::BelowCommitted {
                        held: m.held,
                        confirmed: m.confirmed,
                    }
                } else {
                    m.total = *total;
                    m.available = total - m.held - m.confirmed;
                    m.version = *version;
                    FeedOutcome::Applied(FeedApplied {
                        total: m.total,
                        available: m.available,
                        category_total: None,
                        category_available: None,
                        version: Some(m.version),
                    })
                };
                if got != expected {
                    return Err(err(step, op, format!("expected {expected:?}, got {got:?}")));
                }
            }
            Op::Read => {
                let got = h
                    .inv
                    .read(&ev)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("read: none")?;
                // A read counts every lapsed hold as expired.
                m.reap(usize::MAX);
                if (
                    got.available,
                    got.held,
                    got.confirmed,
                    got.total,
                    got.invariant_holds,
                ) != (Some(m.available), m.held, m.confirmed, m.total, true)
                {
                    return Err(err(step, op, format!("got {got:?}, model {m:?}")));
                }
            }
        }
        if m.available + m.held + m.confirmed != m.total {
            return Err(format!("model invariant broken at step {step}"));
        }
        // After every step, the store's counters as stored (nothing
        // reaped by looking) equal the model's.
        let stored = h.stored_counts(&ev).await;
        if stored != Some((m.available, m.held, m.confirmed)) {
            return Err(err(
                step,
                op,
                format!(
                    "stored counters {stored:?}, model {:?}",
                    (m.available, m.held, m.confirmed)
                ),
            ));
        }
        h.step_check(&ev).await.map_err(|e| err(step, op, e))?;
    }
    // Final: counters (after the same lazy reap) and the transitions of
    // every hold, in order.
    let got = h
        .inv
        .read(&ev)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("read: none")?;
    m.reap(usize::MAX);
    if (got.available, got.held, got.confirmed, got.invariant_holds)
        != (Some(m.available), m.held, m.confirmed, true)
    {
        return Err(format!("final: got {got:?}, model {m:?}"));
    }
    let log = h.history(&ev, 10_000).await?;
    for (i, mh) in m.holds.iter().enumerate() {
        let store: Vec<TransitionKind> = log
            .iter()
            .filter(|t| t.hold_id == mh.id.as_str())
            .map(|t| t.kind)
            .collect();
        let model: Vec<TransitionKind> = m
            .log
            .iter()
            .filter(|(j, _)| *j == i)
            .map(|(_, k)| *k)
            .collect();
        if store != model {
            return Err(format!(
                "hold {i} transitions: store {store:?}, model {model:?}"
            ));
        }
        let terminal = model.iter().filter(|k| **k != TransitionKind::Held).count();
        if terminal > 1 {
            return Err(format!("hold {i} ended twice"));
        }
    }
    Ok(())
}
