//! [`Ledger`]: one PostgreSQL connection and the statements of the ledger.
//!
//! A batch of one event's entries is written in one transaction
//! ([`Ledger::apply_batch`]): the event's row is locked first (so batches
//! of one event, from any number of consumers, are applied one at a time),
//! the entries are inserted with `ON CONFLICT DO NOTHING` on their two
//! unique keys, and only the entries that were actually new move the
//! holds, the payments and the event's counters. A replayed batch
//! therefore changes nothing, whoever replays it and however often.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use sluice_reservation::types::{categories_text, items_text, parse_categories};
use sluice_reservation::{
    CategoryId, CategoryRecord, EventId, EventRecord, HoldId, Item, OpenHold, SoldHold,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

use crate::entry::{DeadLetter, Entry, Kind, Parsed, StreamId};
use crate::error::{LedgerError, Result};
use crate::schema;

/// One connection to the ledger's database.
pub struct Ledger {
    client: Client,
    /// [`BATCH_SQL`], prepared (on the first batch: the tables must exist).
    batch: Option<Vec<Statement>>,
}

/// What [`Ledger::apply_batch`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Entries recorded for the first time.
    pub new_entries: usize,
    /// Entries already recorded (a replay): nothing changed for them.
    pub duplicates: usize,
    /// Entries parked in `dead_letters` (new or not).
    pub dead_letters: usize,
    /// The reconciliation check, when this batch allowed an exact one.
    pub check: Option<Check>,
}

/// One exact comparison of the ledger's count with the store's, at one
/// stream entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The entry compared at.
    pub stream_id: String,
    /// `total − held − confirmed` by the ledger after that entry.
    pub ledger_available: i64,
    /// The entry's `available` (the store's, right after the change).
    pub store_available: i64,
    /// `ledger_available − store_available`; 0 when they agree.
    pub drift_units: i64,
    /// The same per category, when the entry gave each category's
    /// available units (an event with categories), in the store's order.
    pub categories: Vec<CategoryCheck>,
}

/// One category's part of a [`Check`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CategoryCheck {
    /// The category.
    pub category: String,
    /// The category's `total − held − confirmed` by the ledger.
    pub ledger_available: i64,
    /// The category's available units by the entry.
    pub store_available: i64,
    /// `ledger_available − store_available`; 0 when they agree.
    pub drift_units: i64,
}

/// The ledger's counters of one event (the `events` row).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EventSummary {
    /// Units on sale in all.
    pub total: i64,
    /// Stock version.
    pub version: i64,
    /// Units held by open holds.
    pub held_units: i64,
    /// Units sold.
    pub confirmed_units: i64,
    /// Entries recorded.
    pub entries: i64,
    /// Entries parked.
    pub dead_letters: i64,
    /// The last reconciliation's drift (0 when none or in agreement).
    pub drift_units: i64,
    /// The last reconciliation's drift per category, only the categories
    /// that disagreed (empty: all agreed, or none was checked).
    pub category_drift: BTreeMap<String, i64>,
}

/// A room's queue high-water mark as the ledger keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoomFloors {
    /// Highest seq ever issued.
    pub tail: u64,
    /// Highest seq ever admitted.
    pub frontier: u64,
    /// Highest epoch seen.
    pub epoch: u64,
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Index in [`BATCH_SQL`]: the event's row, made when missing.
const ENSURE_EVENT: usize = 0;
/// Index in [`BATCH_SQL`]: the event's row, locked for the batch.
const LOCK_EVENT: usize = 1;
/// Index in [`BATCH_SQL`]: dead letters.
const PARK: usize = 2;
/// Index in [`BATCH_SQL`]: the transitions (RETURNING the new ones).
const RECORD: usize = 3;
/// Index in [`BATCH_SQL`]: holds taken.
const TAKE: usize = 4;
/// Index in [`BATCH_SQL`]: holds ended (RETURNING those this batch ended).
const END: usize = 5;
/// Index in [`BATCH_SQL`]: payments.
const PAY: usize = 6;
/// Index in [`BATCH_SQL`]: a drift found.
const DRIFT: usize = 7;
/// Index in [`BATCH_SQL`]: the last check.
const CHECKED: usize = 8;
/// Index in [`BATCH_SQL`]: the event's counters.
const COUNTERS: usize = 9;
/// Index in [`BATCH_SQL`]: holds' units per category.
const ITEMS: usize = 10;
/// Index in [`BATCH_SQL`]: held and confirmed units per category.
const CATEGORY_UNITS: usize = 11;

/// The statements of [`Ledger::apply_batch`], prepared once per connection.
const BATCH_SQL: [&str; 12] = [
    "INSERT INTO events (event) VALUES ($1) ON CONFLICT DO NOTHING",
    "SELECT total, version, stock_ms, stock_seq, held_units, confirmed_units,
                        last_ms, last_seq, categories
                 FROM events WHERE event = $1 FOR UPDATE",
    "INSERT INTO dead_letters (event, stream_id, fields, error)
                     SELECT $1, t.id, t.f, t.e
                     FROM unnest($2::text[], $3::jsonb[], $4::text[]) AS t(id, f, e)
                     ON CONFLICT DO NOTHING",
    "INSERT INTO hold_transitions (event, stream_id, stream_ms, stream_seq, hold_id,
                         kind, visitor, qty, available_after, ts, expires_at, reason,
                         payment_event_id, version, items, categories)
                     SELECT $1, t.id, t.ms, t.seq, t.hold, t.kind, t.visitor, t.qty, t.avail,
                            to_timestamp(t.ts / 1000.0), to_timestamp(t.exp / 1000.0), t.reason,
                            t.pay, t.ver, t.items, t.cats
                     FROM unnest($2::text[], $3::int8[], $4::int8[], $5::text[], $6::text[],
                                 $7::text[], $8::int8[], $9::int8[], $10::int8[], $11::int8[],
                                 $12::text[], $13::text[], $14::int8[], $15::text[], $16::text[])
                          WITH ORDINALITY AS t(id, ms, seq, hold, kind, visitor, qty, avail, ts,
                                               exp, reason, pay, ver, items, cats, n)
                     ORDER BY t.n
                     ON CONFLICT DO NOTHING
                     RETURNING stream_id",
    "INSERT INTO holds (hold_id, event, visitor, qty, held_at, expires_at,
                                    expires_at_ms, status)
                 SELECT t.h, $1, t.v, t.q, to_timestamp(t.ts / 1000.0),
                        to_timestamp(t.e / 1000.0), t.e, 'held'
                 FROM unnest($2::text[], $3::text[], $4::int8[], $5::int8[], $6::int8[])
                      AS t(h, v, q, ts, e)
                 ON CONFLICT (hold_id) DO UPDATE
                 SET held_at = EXCLUDED.held_at, expires_at = EXCLUDED.expires_at,
                     expires_at_ms = EXCLUDED.expires_at_ms, updated_at = now()
                 WHERE holds.held_at IS NULL",
    "INSERT INTO holds (hold_id, event, visitor, qty, status, ended_at,
                                        end_reason, payment_event_id)
                     SELECT t.h, $1, t.v, t.q, t.k, to_timestamp(t.ts / 1000.0), t.r, t.p
                     FROM unnest($2::text[], $3::text[], $4::int8[], $5::text[], $6::int8[],
                                 $7::text[], $8::text[]) AS t(h, v, q, k, ts, r, p)
                     ON CONFLICT (hold_id) DO UPDATE
                     SET status = EXCLUDED.status, ended_at = EXCLUDED.ended_at,
                         end_reason = EXCLUDED.end_reason,
                         payment_event_id = EXCLUDED.payment_event_id, updated_at = now()
                     WHERE holds.status = 'held'
                     RETURNING hold_id",
    "INSERT INTO payments (event, payment_event_id, hold_id, outcome, ts, stream_id)
                 SELECT $1, t.p, t.h, t.o, to_timestamp(t.ts / 1000.0), t.s
                 FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[], $6::text[])
                      AS t(p, h, o, ts, s)
                 ON CONFLICT DO NOTHING",
    "INSERT INTO reconciliation (event, stream_id, ledger_available,
                                                 store_available, drift_units, category)
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
    "UPDATE events SET drift_units = $2, reconciled_stream_id = $3,
                                   category_drift = $4, reconciled_at = now()
                 WHERE event = $1",
    "UPDATE events SET total = $2, version = $3, stock_ms = $4, stock_seq = $5,
                               held_units = $6, confirmed_units = $7, last_ms = $8,
                               last_seq = $9, entries = entries + $10,
                               dead_letters = dead_letters + $11, categories = $12,
                               updated_at = now()
             WHERE event = $1",
    "INSERT INTO hold_items (hold_id, event, category, qty)
                 SELECT t.h, $1, t.c, t.q
                 FROM unnest($2::text[], $3::text[], $4::int8[]) AS t(h, c, q)
                 ON CONFLICT DO NOTHING",
    "SELECT i.category,
            COALESCE(sum(i.qty) FILTER (WHERE h.status = 'held'), 0)::int8,
            COALESCE(sum(i.qty) FILTER (WHERE h.status = 'confirmed'), 0)::int8
     FROM hold_items i JOIN holds h USING (hold_id)
     WHERE i.event = $1 AND h.status IN ('held', 'confirmed')
     GROUP BY i.category",
];

/// The per-category part of a record: the categories as the latest stock
/// entry gave them, the holds' breakdowns, and the units sold per visitor
/// and category (from the sold holds' breakdowns).
fn categories_record(
    field: Option<&str>,
    record: &EventRecord,
    hold_items: HashMap<String, Vec<Item>>,
) -> Result<CategoryRecord> {
    let text = field.unwrap_or("");
    let categories = parse_categories(text)
        .ok_or_else(|| LedgerError::Protocol(format!("events.categories unreadable: {text:?}")))?;
    let mut sold: BTreeMap<(String, CategoryId), u64> = BTreeMap::new();
    for h in &record.confirmed_holds {
        for i in hold_items.get(h.hold_id.as_str()).into_iter().flatten() {
            *sold
                .entry((h.visitor.clone(), i.category.clone()))
                .or_default() += u64::from(i.qty);
        }
    }
    Ok(CategoryRecord {
        categories,
        hold_items,
        confirmed: sold.into_iter().map(|((v, c), q)| (v, c, q)).collect(),
    })
}

/// Inserts the units per category of `fresh`'s hold entries (a hold's
/// second entry finds its rows there and adds nothing).
async fn record_items(
    tx: &tokio_postgres::Transaction<'_>,
    statement: &Statement,
    ev: &str,
    fresh: &[&Entry],
) -> Result<()> {
    let (mut hold, mut cat, mut qty) = (Vec::new(), Vec::new(), Vec::new());
    for e in fresh {
        let Some(h) = e.hold_id.as_deref() else {
            continue;
        };
        for i in &e.items {
            hold.push(h);
            cat.push(i.category.as_str());
            qty.push(i64::from(i.qty));
        }
    }
    if !hold.is_empty() {
        tx.execute(statement, &[&ev, &hold, &cat, &qty]).await?;
    }
    Ok(())
}

/// Each category's reconciliation at entry `at` (none when the entry
/// gives no per-category availability): the ledger's `total − held −
/// confirmed` per category, inside the batch's transaction, against the
/// entry's `category_available`. A category only one side knows counts
/// as 0 units on the other.
async fn category_checks(
    tx: &tokio_postgres::Transaction<'_>,
    units_statement: &Statement,
    ev: &str,
    at: &Entry,
    categories: Option<&str>,
) -> Result<Vec<CategoryCheck>> {
    if at.category_available.is_empty() {
        return Ok(Vec::new());
    }
    let specs = categories.and_then(parse_categories).unwrap_or_default();
    let units: HashMap<String, (i64, i64)> = tx
        .query(units_statement, &[&ev])
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let ledger_available = |c: &str| {
        let total = specs
            .iter()
            .find(|s| s.id.as_str() == c)
            .map_or(0, |s| to_i64(s.total));
        let (held, confirmed) = units.get(c).copied().unwrap_or((0, 0));
        total - held - confirmed
    };
    let mut out: Vec<CategoryCheck> = at
        .category_available
        .iter()
        .map(|(c, store)| {
            let ledger = ledger_available(c.as_str());
            CategoryCheck {
                category: c.to_string(),
                ledger_available: ledger,
                store_available: to_i64(*store),
                drift_units: ledger - to_i64(*store),
            }
        })
        .collect();
    for s in &specs {
        if !at.category_available.iter().any(|(c, _)| *c == s.id) {
            let ledger = ledger_available(s.id.as_str());
            out.push(CategoryCheck {
                category: s.id.to_string(),
                ledger_available: ledger,
                store_available: 0,
                drift_units: ledger,
            });
        }
    }
    Ok(out)
}

// === impl Ledger ===

impl Ledger {
    /// Connects (within `timeout`) with a `postgres://` URL or a
    /// `key=value` connection string. TLS is not spoken: run the ledger
    /// beside its database or through a local proxy.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| LedgerError::Config(e.to_string()))?;
        config
            .connect_timeout(timeout)
            .application_name("sluice-ledger");
        let (client, connection) = tokio::time::timeout(timeout, config.connect(NoTls))
            .await
            .map_err(|_| LedgerError::Timeout(timeout))??;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "ledger: postgres connection ended");
            }
        });
        Ok(Self {
            client,
            batch: None,
        })
    }

    /// Applies the migrations this database lacks (see [`schema`]).
    pub async fn migrate(&mut self) -> Result<Vec<i32>> {
        schema::migrate(&mut self.client).await
    }

    /// Whether the connection is gone (then connect again).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The connection, for queries of the tests and tools.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The batch statements, prepared once per connection: a batch then
    /// costs one round trip per statement and no planning of the SQL text.
    async fn batch_statements(&mut self) -> Result<Vec<Statement>> {
        if let Some(st) = &self.batch {
            return Ok(st.clone());
        }
        let mut st = Vec::with_capacity(BATCH_SQL.len());
        for sql in BATCH_SQL {
            st.push(self.client.prepare(sql).await?);
        }
        self.batch = Some(st.clone());
        Ok(st)
    }

    /// Writes one batch of `event`'s entries (in stream order) in one
    /// transaction. `exact` is asked, while the event's row is locked,
    /// whether every entry of the stream before this batch is already
    /// recorded (no other entry of the group is pending); when it says yes
    /// and the batch is new and follows the last recorded entry, the
    /// ledger's count is compared with the store's at the batch's last
    /// entry (an exact check: same point of the history on both sides).
    pub async fn apply_batch<F, Fut>(
        &mut self,
        event: &EventId,
        batch: &[Parsed],
        exact: F,
    ) -> Result<Applied>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = bool>,
    {
        let ev = event.as_str();
        let entries: Vec<&Entry> = batch
            .iter()
            .filter_map(|p| match p {
                Parsed::Entry(e) => Some(e),
                Parsed::Dead(_) => None,
            })
            .collect();
        let dead: Vec<&DeadLetter> = batch
            .iter()
            .filter_map(|p| match p {
                Parsed::Dead(d) => Some(d),
                Parsed::Entry(_) => None,
            })
            .collect();

        let st = self.batch_statements().await?;
        let tx = self.client.transaction().await?;
        tx.execute(&st[ENSURE_EVENT], &[&ev]).await?;
        let row = tx.query_one(&st[LOCK_EVENT], &[&ev]).await?;
        let mut total: i64 = row.get(0);
        let mut version: i64 = row.get(1);
        let mut stock_pos: (i64, i64) = (row.get(2), row.get(3));
        let mut held: i64 = row.get(4);
        let mut confirmed: i64 = row.get(5);
        let prev_last: (i64, i64) = (row.get(6), row.get(7));
        let mut categories: Option<String> = row.get(8);

        // Dead letters: parked in the same transaction, acknowledged with
        // the batch.
        let mut new_dead = 0i64;
        if !dead.is_empty() {
            let ids: Vec<&str> = dead.iter().map(|d| d.stream_id.as_str()).collect();
            let fields: Vec<&serde_json::Value> = dead.iter().map(|d| &d.fields).collect();
            let errors: Vec<&str> = dead.iter().map(|d| d.error.as_str()).collect();
            new_dead = i64::try_from(
                tx.execute(&st[PARK], &[&ev, &ids, &fields, &errors])
                    .await?,
            )
            .unwrap_or(0);
            for d in &dead {
                tracing::warn!(event = ev, stream_id = %d.stream_id, error = %d.error,
                    "ledger: entry parked in dead_letters");
            }
        }

        // The transitions, in stream order; RETURNING names the new ones.
        let mut new_ids: HashSet<String> = HashSet::new();
        if !entries.is_empty() {
            let ids: Vec<String> = entries.iter().map(|e| e.id.to_string()).collect();
            let ms: Vec<i64> = entries.iter().map(|e| e.id.as_i64().0).collect();
            let seq: Vec<i64> = entries.iter().map(|e| e.id.as_i64().1).collect();
            let hold: Vec<Option<&str>> = entries.iter().map(|e| e.hold_id.as_deref()).collect();
            let kind: Vec<&str> = entries.iter().map(|e| e.kind.as_str()).collect();
            let visitor: Vec<Option<&str>> = entries.iter().map(|e| e.visitor.as_deref()).collect();
            let qty: Vec<i64> = entries.iter().map(|e| to_i64(e.qty)).collect();
            let avail: Vec<i64> = entries.iter().map(|e| to_i64(e.available)).collect();
            let ts: Vec<i64> = entries.iter().map(|e| to_i64(e.ts_ms)).collect();
            let exp: Vec<Option<i64>> = entries
                .iter()
                .map(|e| e.expires_at_ms.map(to_i64))
                .collect();
            let reason: Vec<Option<&str>> = entries.iter().map(|e| e.reason.as_deref()).collect();
            let pay: Vec<Option<&str>> = entries
                .iter()
                .map(|e| e.payment_event_id.as_deref())
                .collect();
            let ver: Vec<Option<i64>> = entries.iter().map(|e| e.version.map(to_i64)).collect();
            let items: Vec<Option<String>> = entries
                .iter()
                .map(|e| (!e.items.is_empty()).then(|| items_text(&e.items)))
                .collect();
            let cats: Vec<Option<String>> = entries
                .iter()
                .map(|e| (!e.categories.is_empty()).then(|| categories_text(&e.categories)))
                .collect();
            let params: [&(dyn ToSql + Sync); 16] = [
                &ev, &ids, &ms, &seq, &hold, &kind, &visitor, &qty, &avail, &ts, &exp, &reason,
                &pay, &ver, &items, &cats,
            ];
            let rows = tx.query(&st[RECORD], &params).await?;
            new_ids = rows.iter().map(|r| r.get::<_, String>(0)).collect();
        }
        // An id counts once, even were it twice in the batch.
        let fresh: Vec<&Entry> = entries
            .iter()
            .copied()
            .filter(|e| new_ids.remove(&e.id.to_string()))
            .collect();

        // Units per category: from a hold's first entry recorded, whichever
        // kind it is (both carry the same breakdown).
        record_items(&tx, &st[ITEMS], ev, &fresh).await?;

        // Holds taken: a row, or the held half of a row a terminal entry
        // made first (two consumers may commit out of order). The status
        // is never touched here: a hold never goes back to held.
        let takes: Vec<&Entry> = fresh
            .iter()
            .copied()
            .filter(|e| e.kind == Kind::Held)
            .collect();
        if !takes.is_empty() {
            let hold: Vec<Option<&str>> = takes.iter().map(|e| e.hold_id.as_deref()).collect();
            let visitor: Vec<Option<&str>> = takes.iter().map(|e| e.visitor.as_deref()).collect();
            let qty: Vec<i64> = takes.iter().map(|e| to_i64(e.qty)).collect();
            let ts: Vec<i64> = takes.iter().map(|e| to_i64(e.ts_ms)).collect();
            let exp: Vec<Option<i64>> = takes.iter().map(|e| e.expires_at_ms.map(to_i64)).collect();
            tx.execute(&st[TAKE], &[&ev, &hold, &visitor, &qty, &ts, &exp])
                .await?;
            held += takes.iter().map(|e| to_i64(e.qty)).sum::<i64>();
        }

        // Holds ended: the first terminal entry of a hold wins, once (a
        // second one, from a broken store, is recorded and changes nothing).
        let mut seen = HashSet::new();
        let ends: Vec<&Entry> = fresh
            .iter()
            .copied()
            .filter(|e| e.kind.is_terminal() && seen.insert(e.hold_id.clone()))
            .collect();
        if !ends.is_empty() {
            let hold: Vec<Option<&str>> = ends.iter().map(|e| e.hold_id.as_deref()).collect();
            let visitor: Vec<Option<&str>> = ends.iter().map(|e| e.visitor.as_deref()).collect();
            let qty: Vec<i64> = ends.iter().map(|e| to_i64(e.qty)).collect();
            let kind: Vec<&str> = ends.iter().map(|e| e.kind.as_str()).collect();
            let ts: Vec<i64> = ends.iter().map(|e| to_i64(e.ts_ms)).collect();
            let reason: Vec<Option<&str>> = ends.iter().map(|e| e.reason.as_deref()).collect();
            let pay: Vec<Option<&str>> =
                ends.iter().map(|e| e.payment_event_id.as_deref()).collect();
            let params: [&(dyn ToSql + Sync); 8] =
                [&ev, &hold, &visitor, &qty, &kind, &ts, &reason, &pay];
            let rows = tx.query(&st[END], &params).await?;
            let ended: HashSet<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
            for e in &ends {
                if e.hold_id.as_ref().is_some_and(|h| ended.contains(h)) {
                    held -= to_i64(e.qty);
                    if e.kind == Kind::Confirmed {
                        confirmed += to_i64(e.qty);
                    }
                }
            }
        }

        // Payments: every payment outcome the store applied.
        let paid: Vec<&Entry> = fresh
            .iter()
            .copied()
            .filter(|e| e.payment_event_id.is_some() && e.kind.is_terminal())
            .collect();
        if !paid.is_empty() {
            let pid: Vec<Option<&str>> =
                paid.iter().map(|e| e.payment_event_id.as_deref()).collect();
            let hold: Vec<Option<&str>> = paid.iter().map(|e| e.hold_id.as_deref()).collect();
            let outcome: Vec<&str> = paid
                .iter()
                .map(|e| {
                    if e.kind == Kind::Confirmed {
                        "succeeded"
                    } else {
                        "failed"
                    }
                })
                .collect();
            let ts: Vec<i64> = paid.iter().map(|e| to_i64(e.ts_ms)).collect();
            let ids: Vec<String> = paid.iter().map(|e| e.id.to_string()).collect();
            tx.execute(&st[PAY], &[&ev, &pid, &hold, &outcome, &ts, &ids])
                .await?;
        }

        // Stock: the latest stock or restored entry sets total and version.
        for e in fresh
            .iter()
            .filter(|e| matches!(e.kind, Kind::Stock | Kind::Restored))
        {
            if e.id.as_i64() > stock_pos {
                stock_pos = e.id.as_i64();
                total = to_i64(e.qty);
                version = e.version.map(to_i64).unwrap_or(version);
                categories = (!e.categories.is_empty()).then(|| categories_text(&e.categories));
            }
        }

        let max_id: Option<StreamId> = batch
            .iter()
            .filter_map(|p| match p {
                Parsed::Entry(e) => Some(e.id),
                Parsed::Dead(d) => StreamId::parse(&d.stream_id),
            })
            .max();
        let last = max_id
            .map(StreamId::as_i64)
            .unwrap_or((0, 0))
            .max(prev_last);
        let first = batch
            .iter()
            .filter_map(|p| match p {
                Parsed::Entry(e) => Some(e.id),
                Parsed::Dead(d) => StreamId::parse(&d.stream_id),
            })
            .min();

        // Reconciliation: exact only when this batch is the next part of
        // the history and nothing before it is still on its way.
        let mut check = None;
        let in_order = first.is_some_and(|f| f.as_i64() > prev_last);
        if let Some(at) = entries.last()
            && in_order
            && fresh.len() == entries.len()
            && exact().await
        {
            let ledger_available = total - held - confirmed;
            let store_available = to_i64(at.available);
            let drift = ledger_available - store_available;
            let stream_id = at.id.to_string();
            if drift != 0 {
                tracing::warn!(event = ev, stream_id = %stream_id, ledger_available,
                    store_available, drift_units = drift,
                    "ledger: drift between the ledger and the store");
                tx.execute(
                    &st[DRIFT],
                    &[
                        &ev,
                        &stream_id,
                        &ledger_available,
                        &store_available,
                        &drift,
                        &"",
                    ],
                )
                .await?;
            }
            let per_category =
                category_checks(&tx, &st[CATEGORY_UNITS], ev, at, categories.as_deref()).await?;
            let mut drifted = Vec::new();
            for c in per_category.iter().filter(|c| c.drift_units != 0) {
                tracing::warn!(event = ev, category = %c.category, stream_id = %stream_id,
                    ledger_available = c.ledger_available, store_available = c.store_available,
                    drift_units = c.drift_units,
                    "ledger: drift between the ledger and the store in a category");
                tx.execute(
                    &st[DRIFT],
                    &[
                        &ev,
                        &stream_id,
                        &c.ledger_available,
                        &c.store_available,
                        &c.drift_units,
                        &c.category,
                    ],
                )
                .await?;
                drifted.push(format!("{}={}", c.category, c.drift_units));
            }
            let category_drift = (!drifted.is_empty()).then(|| drifted.join(","));
            tx.execute(&st[CHECKED], &[&ev, &drift, &stream_id, &category_drift])
                .await?;
            check = Some(Check {
                stream_id,
                ledger_available,
                store_available,
                drift_units: drift,
                categories: per_category,
            });
        }

        let n_new = i64::try_from(fresh.len()).unwrap_or(i64::MAX);
        tx.execute(
            &st[COUNTERS],
            &[
                &ev,
                &total,
                &version,
                &stock_pos.0,
                &stock_pos.1,
                &held,
                &confirmed,
                &last.0,
                &last.1,
                &n_new,
                &new_dead,
                &categories,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(Applied {
            new_entries: fresh.len(),
            duplicates: entries.len() - fresh.len(),
            dead_letters: dead.len(),
            check,
        })
    }

    /// What the ledger knows of `event`, to rebuild a store that lost it:
    /// `None` when it has no stock entry of it. An event with categories
    /// is refused ([`LedgerError::Categorized`]): restoring it without them
    /// would sell each tier's units as the event's; use
    /// [`Ledger::event_record_with_categories`].
    pub async fn event_record(&mut self, event: &EventId) -> Result<Option<EventRecord>> {
        match self.event_record_with_categories(event).await? {
            Some((_, cats)) if !cats.categories.is_empty() || !cats.hold_items.is_empty() => {
                Err(LedgerError::Categorized(event.to_string()))
            }
            other => Ok(other.map(|(record, _)| record)),
        }
    }

    /// [`Ledger::event_record`] with its per-category part: the
    /// categories of the latest stock entry, each open or sold hold's
    /// units per category, and the units sold per visitor and category
    /// (all empty for an event without categories). Read in one snapshot.
    pub async fn event_record_with_categories(
        &mut self,
        event: &EventId,
    ) -> Result<Option<(EventRecord, CategoryRecord)>> {
        let ev = event.as_str();
        let tx = self
            .client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let Some(row) = tx
            .query_opt(
                "SELECT total, version, categories FROM events
                 WHERE event = $1 AND stock_ms > 0",
                &[&ev],
            )
            .await?
        else {
            return Ok(None);
        };
        let total: i64 = row.get(0);
        let version: i64 = row.get(1);
        let categories_field: Option<String> = row.get(2);
        let confirmed = tx
            .query(
                "SELECT visitor, sum(qty)::int8 FROM holds
                 WHERE event = $1 AND status = 'confirmed'
                 GROUP BY visitor ORDER BY visitor",
                &[&ev],
            )
            .await?
            .iter()
            .map(|r| (r.get::<_, String>(0), to_u64(r.get(1))))
            .filter(|(_, q)| *q > 0)
            .collect();
        let mut open_holds = Vec::new();
        for r in tx
            .query(
                "SELECT hold_id, visitor, qty, expires_at_ms FROM holds
                 WHERE event = $1 AND status = 'held' AND expires_at_ms IS NOT NULL
                 ORDER BY expires_at_ms, hold_id",
                &[&ev],
            )
            .await?
        {
            let id: String = r.get(0);
            let Some(hold_id) = HoldId::parse(&id) else {
                tracing::warn!(hold_id = %id, "ledger: unusable hold id left out of a record");
                continue;
            };
            open_holds.push(OpenHold {
                hold_id,
                visitor: r.get(1),
                qty: u32::try_from(r.get::<_, i64>(2)).unwrap_or(0),
                expires_at_ms: to_u64(r.get::<_, Option<i64>>(3).unwrap_or(0)),
            });
        }
        let mut confirmed_holds = Vec::new();
        for r in tx
            .query(
                "SELECT hold_id, visitor, qty FROM holds
                 WHERE event = $1 AND status = 'confirmed'
                 ORDER BY hold_id",
                &[&ev],
            )
            .await?
        {
            let id: String = r.get(0);
            let Some(hold_id) = HoldId::parse(&id) else {
                tracing::warn!(hold_id = %id, "ledger: unusable hold id left out of a record");
                continue;
            };
            confirmed_holds.push(SoldHold {
                hold_id,
                visitor: r.get(1),
                qty: u32::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            });
        }
        let mut hold_items: HashMap<String, Vec<Item>> = HashMap::new();
        for r in tx
            .query(
                "SELECT i.hold_id, i.category, i.qty FROM hold_items i JOIN holds h USING (hold_id)
                 WHERE i.event = $1 AND h.status IN ('held', 'confirmed')
                 ORDER BY i.hold_id, i.category",
                &[&ev],
            )
            .await?
        {
            let (id, cat): (String, String) = (r.get(0), r.get(1));
            // Written from parsed entries: a row that does not parse back
            // is left out, and the store then refuses the hold's missing
            // breakdown rather than guess it.
            let (Some(category), Ok(qty)) =
                (CategoryId::parse(&cat), u32::try_from(r.get::<_, i64>(2)))
            else {
                tracing::warn!(hold_id = %id, category = %cat, "ledger: unusable hold item left out of a record");
                continue;
            };
            hold_items
                .entry(id)
                .or_default()
                .push(Item { category, qty });
        }
        tx.commit().await?;
        let record = EventRecord {
            total: to_u64(total),
            version: to_u64(version),
            confirmed,
            open_holds,
            confirmed_holds,
        };
        let categories = categories_record(categories_field.as_deref(), &record, hold_items)?;
        Ok(Some((record, categories)))
    }

    /// The `events` row of `event`.
    pub async fn event_summary(&self, event: &EventId) -> Result<Option<EventSummary>> {
        let row = self
            .client
            .query_opt(
                "SELECT total, version, held_units, confirmed_units, entries, dead_letters,
                        drift_units, category_drift
                 FROM events WHERE event = $1",
                &[&event.as_str()],
            )
            .await?;
        Ok(row.map(|r| EventSummary {
            total: r.get(0),
            version: r.get(1),
            held_units: r.get(2),
            confirmed_units: r.get(3),
            entries: r.get(4),
            dead_letters: r.get(5),
            drift_units: r.get(6),
            category_drift: r
                .get::<_, Option<String>>(7)
                .unwrap_or_default()
                .split(',')
                .filter_map(|p| {
                    let (c, d) = p.split_once('=')?;
                    Some((c.to_owned(), d.parse().ok()?))
                })
                .collect(),
        }))
    }

    /// The last reconciliation's drift of `event` (`ledger − store`
    /// available units; 0 when they agreed), `None` for an unknown event.
    pub async fn drift_units(&self, event: &EventId) -> Result<Option<i64>> {
        Ok(self.event_summary(event).await?.map(|s| s.drift_units))
    }

    /// Raises `room`'s recorded high-water mark to at least these values
    /// (each only ever rises, whatever order the calls come in).
    pub async fn record_room_floors(
        &self,
        room: &str,
        tail: u64,
        frontier: u64,
        epoch: u64,
    ) -> Result<()> {
        self.client
            .execute(
                "INSERT INTO rooms (room, tail, frontier, epoch) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (room) DO UPDATE
                 SET tail = GREATEST(rooms.tail, EXCLUDED.tail),
                     frontier = GREATEST(rooms.frontier, EXCLUDED.frontier),
                     epoch = GREATEST(rooms.epoch, EXCLUDED.epoch),
                     updated_at = now()",
                &[&room, &to_i64(tail), &to_i64(frontier), &to_i64(epoch)],
            )
            .await?;
        Ok(())
    }

    /// `room`'s recorded high-water mark, `None` when never recorded.
    pub async fn room_floors(&self, room: &str) -> Result<Option<RoomFloors>> {
        let row = self
            .client
            .query_opt(
                "SELECT tail, frontier, epoch FROM rooms WHERE room = $1",
                &[&room],
            )
            .await?;
        Ok(row.map(|r| RoomFloors {
            tail: to_u64(r.get(0)),
            frontier: to_u64(r.get(1)),
            epoch: to_u64(r.get(2)),
        }))
    }
}
