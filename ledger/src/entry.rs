//! One reservation stream entry, as Redis gives it ([`RawEntry`]) and as
//! the ledger stores it ([`Entry`]), or parked ([`DeadLetter`]) when it
//! cannot be understood.
//!
//! Parsing is total: any bytes give an [`Entry`] or a [`DeadLetter`], never
//! a panic (the property test below feeds it garbage). The rules are the
//! fields of `reservation/STREAM.md`, plus `restored` (a store rebuilt from
//! the ledger: `qty` = total, `version`, `available`). Categories ride
//! along: a hold's `items` (its breakdown, adding up to `qty`) and a
//! `stock`/`restored` entry's `categories` (their totals adding up to
//! `qty`); either malformed parks the entry. So does a malformed
//! `category_available` (each category's available units after the
//! change, what per-category reconciliation compares with).

use std::fmt;

use sluice_reservation::types::{
    categories_problem, duplicate_category, parse_categories, parse_items,
};
use sluice_reservation::{CategoryId, CategorySpec, EventId, HoldId, Item, MAX_TOTAL};

/// A stream entry id, `ms-seq`, ordered as Redis orders them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId {
    /// Milliseconds part (the store's clock when the entry was added).
    pub ms: u64,
    /// Sequence within that millisecond.
    pub seq: u64,
}

impl StreamId {
    /// Parses `ms-seq`; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let (ms, seq) = s.split_once('-')?;
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// The smallest id above this one (what `XTRIM MINID` takes to drop
    /// this entry and everything before it).
    pub fn next(self) -> Self {
        match self.seq.checked_add(1) {
            Some(seq) => Self { ms: self.ms, seq },
            None => Self {
                ms: self.ms.saturating_add(1),
                seq: 0,
            },
        }
    }

    /// `(ms, seq)` as PostgreSQL `bigint`s (ids above `i64::MAX` never
    /// come from a real clock; they are clamped).
    pub fn as_i64(self) -> (i64, i64) {
        (
            i64::try_from(self.ms).unwrap_or(i64::MAX),
            i64::try_from(self.seq).unwrap_or(i64::MAX),
        )
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// An entry as read from Redis: its id and its field/value pairs, bytes
/// as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEntry {
    /// The entry id as Redis wrote it.
    pub id: String,
    /// Field/value pairs in stream order.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What an entry records: the stream's own vocabulary, owned by the
/// reservation crate that writes it (`reservation/STREAM.md`).
pub use sluice_reservation::TransitionKind as Kind;

/// A well-formed entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its stream id.
    pub id: StreamId,
    /// What happened.
    pub kind: Kind,
    /// The hold (hold kinds only).
    pub hold_id: Option<String>,
    /// The hold's owner (hold kinds only).
    pub visitor: Option<String>,
    /// Units moved; for `stock` and `restored`, the total.
    pub qty: u64,
    /// Units available right after the change.
    pub available: u64,
    /// The store's clock, Unix milliseconds.
    pub ts_ms: u64,
    /// The hold's deadline (`held` only).
    pub expires_at_ms: Option<u64>,
    /// Why a hold was released or expired.
    pub reason: Option<String>,
    /// The webhook's id, for payment outcomes.
    pub payment_event_id: Option<String>,
    /// The stock version (`stock`, `restored`).
    pub version: Option<u64>,
    /// A hold's breakdown per category (empty: an event without
    /// categories).
    pub items: Vec<Item>,
    /// The categories a `stock`/`restored` entry loaded (empty: none).
    pub categories: Vec<CategorySpec>,
    /// Each category's available units right after the change, in load
    /// order (empty: an event without categories, or a writer older than
    /// the field).
    pub category_available: Vec<(CategoryId, u64)>,
}

/// An entry the ledger could not understand, parked with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The entry id as Redis wrote it.
    pub stream_id: String,
    /// Its fields as a JSON object (non-UTF-8 bytes replaced; a repeated
    /// field keeps its first value).
    pub fields: serde_json::Value,
    /// Why it was parked.
    pub error: String,
}

/// The outcome of parsing one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Understood.
    Entry(Entry),
    /// Parked.
    Dead(DeadLetter),
}

/// Largest number stored in a `bigint` column.
const MAX_BIGINT: u64 = i64::MAX as u64;

/// Parses one entry of `event`'s stream.
pub fn parse(event: &EventId, raw: &RawEntry) -> Parsed {
    match parse_entry(event, raw) {
        Ok(e) => Parsed::Entry(e),
        Err(error) => Parsed::Dead(DeadLetter {
            stream_id: raw.id.clone(),
            fields: fields_json(&raw.fields),
            error,
        }),
    }
}

fn fields_json(fields: &[(Vec<u8>, Vec<u8>)]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for (k, v) in fields {
        let k = String::from_utf8_lossy(k).into_owned();
        map.entry(k)
            .or_insert_with(|| serde_json::Value::String(String::from_utf8_lossy(v).into_owned()));
    }
    serde_json::Value::Object(map)
}

fn parse_entry(event: &EventId, raw: &RawEntry) -> Result<Entry, String> {
    let id = StreamId::parse(&raw.id).ok_or_else(|| format!("bad entry id {:?}", raw.id))?;
    let mut fields: Vec<(&str, &str)> = Vec::with_capacity(raw.fields.len());
    for (k, v) in &raw.fields {
        let k = std::str::from_utf8(k).map_err(|_| "a field name is not UTF-8".to_owned())?;
        let v = std::str::from_utf8(v).map_err(|_| format!("field {k} is not UTF-8"))?;
        if fields.iter().any(|(name, _)| *name == k) {
            return Err(format!("field {k} repeated"));
        }
        fields.push((k, v));
    }
    let get = |name: &str| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let need = |name: &str| get(name).ok_or_else(|| format!("field {name} missing"));
    let number = |name: &str| -> Result<u64, String> {
        let v = need(name)?;
        let n: u64 = v
            .parse()
            .map_err(|_| format!("field {name} is not a number: {v:?}"))?;
        if n > MAX_BIGINT {
            return Err(format!("field {name} too large: {n}"));
        }
        Ok(n)
    };
    let kind_text = need("type")?;
    let kind = Kind::parse(kind_text).ok_or_else(|| format!("unknown type {kind_text:?}"))?;
    let entry_event = need("event")?;
    if entry_event != event.as_str() {
        return Err(format!(
            "entry of event {entry_event:?} in the stream of {event}"
        ));
    }
    let qty = number("qty")?;
    let available = number("available")?;
    let ts_ms = number("ts_ms")?;
    let text = |name: &str| get(name).filter(|s| !s.is_empty()).map(str::to_owned);
    let mut e = Entry {
        id,
        kind,
        hold_id: None,
        visitor: None,
        qty,
        available,
        ts_ms,
        expires_at_ms: None,
        reason: text("reason"),
        payment_event_id: text("payment_event_id"),
        version: None,
        items: Vec::new(),
        categories: Vec::new(),
        category_available: category_available_of(get("category_available").unwrap_or(""))?,
    };
    if kind.is_hold() {
        let hold = need("hold_id")?;
        let parsed = HoldId::parse(hold).ok_or_else(|| format!("bad hold_id {hold:?}"))?;
        if parsed.event() != *event {
            return Err(format!("hold {hold} is not of event {event}"));
        }
        let visitor = need("visitor")?;
        if visitor.is_empty() {
            return Err("empty visitor".to_owned());
        }
        if qty == 0 || qty > u64::from(u32::MAX) {
            return Err(format!("bad hold qty {qty}"));
        }
        e.hold_id = Some(hold.to_owned());
        e.visitor = Some(visitor.to_owned());
        e.items = items_of(get("items").unwrap_or(""), qty)?;
        if kind == Kind::Held {
            e.expires_at_ms = Some(number("expires_at_ms")?);
        }
    } else {
        if get("hold_id").is_some_and(|h| !h.is_empty()) {
            return Err(format!("{} entry with a hold_id", kind.as_str()));
        }
        if qty > MAX_TOTAL {
            return Err(format!("total {qty} above 2^53"));
        }
        e.version = Some(number("version")?);
        e.payment_event_id = None;
        if get("items").is_some_and(|i| !i.is_empty()) {
            return Err(format!("{} entry with items", kind.as_str()));
        }
        e.categories = categories_of(get("categories").unwrap_or(""), qty)?;
    }
    Ok(e)
}

/// A hold's `items` field: each `{category}={qty}` with qty ≥ 1, no
/// category twice, adding up to the hold's `qty`.
fn items_of(text: &str, qty: u64) -> Result<Vec<Item>, String> {
    let items = parse_items(text).ok_or_else(|| format!("bad items {text:?}"))?;
    if items.is_empty() {
        return Ok(items);
    }
    if items.iter().any(|i| i.qty == 0) {
        return Err(format!("items {text:?} with qty 0"));
    }
    if let Some(c) = duplicate_category(&items) {
        return Err(format!("items {text:?} list {c} twice"));
    }
    let sum: u64 = items.iter().map(|i| u64::from(i.qty)).sum();
    if sum != qty {
        return Err(format!("items {text:?} add up to {sum}, not qty {qty}"));
    }
    Ok(items)
}

/// The `category_available` field: `{category}={units}` joined by `,`,
/// each category once ('' or absent: none).
fn category_available_of(text: &str) -> Result<Vec<(CategoryId, u64)>, String> {
    let mut out: Vec<(CategoryId, u64)> = Vec::new();
    if text.is_empty() {
        return Ok(out);
    }
    for part in text.split(',') {
        let parsed = part.split_once('=').and_then(|(c, n)| {
            let n: u64 = n.parse().ok().filter(|n| *n <= MAX_TOTAL)?;
            Some((CategoryId::parse(c)?, n))
        });
        let Some((c, n)) = parsed else {
            return Err(format!("bad category_available {text:?}"));
        };
        if out.iter().any(|(seen, _)| *seen == c) {
            return Err(format!("category_available {text:?} lists {c} twice"));
        }
        out.push((c, n));
    }
    Ok(out)
}

/// A `stock`/`restored` entry's `categories` field: well formed, each
/// category once, totals adding up to the entry's `qty`.
fn categories_of(text: &str, qty: u64) -> Result<Vec<CategorySpec>, String> {
    let cats = parse_categories(text).ok_or_else(|| format!("bad categories {text:?}"))?;
    if cats.is_empty() {
        return Ok(cats);
    }
    if let Some(why) = categories_problem(&cats) {
        return Err(format!("categories {text:?}: {why}"));
    }
    let sum = cats.iter().fold(0u64, |a, c| a.saturating_add(c.total));
    if sum != qty {
        return Err(format!(
            "categories {text:?} add up to {sum}, not the total {qty}"
        ));
    }
    Ok(cats)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn raw(id: &str, fields: &[(&str, &str)]) -> RawEntry {
        RawEntry {
            id: id.to_owned(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    fn ev() -> EventId {
        EventId::parse("demo").unwrap()
    }

    const HOLD: &str = "demo.AAAAAAAAAAAAAAAAAAAAAA";

    #[test]
    fn a_held_entry_parses() {
        let r = raw(
            "1700000000000-3",
            &[
                ("type", "held"),
                ("event", "demo"),
                ("hold_id", HOLD),
                ("visitor", "v1"),
                ("qty", "2"),
                ("available", "8"),
                ("ts_ms", "1700000000000"),
                ("expires_at_ms", "1700000600000"),
            ],
        );
        let Parsed::Entry(e) = parse(&ev(), &r) else {
            panic!("dead letter");
        };
        assert_eq!(e.kind, Kind::Held);
        assert_eq!(
            e.id,
            StreamId {
                ms: 1_700_000_000_000,
                seq: 3
            }
        );
        assert_eq!(e.expires_at_ms, Some(1_700_000_600_000));
        assert_eq!(e.hold_id.as_deref(), Some(HOLD));
    }

    #[test]
    fn a_restored_entry_is_event_level() {
        let r = raw(
            "5-0",
            &[
                ("type", "restored"),
                ("event", "demo"),
                ("qty", "10"),
                ("version", "3"),
                ("available", "4"),
                ("ts_ms", "5"),
            ],
        );
        let Parsed::Entry(e) = parse(&ev(), &r) else {
            panic!("dead letter");
        };
        assert_eq!(
            (e.kind, e.qty, e.version, e.hold_id),
            (Kind::Restored, 10, Some(3), None)
        );
    }

    fn held_with_items(items: &str) -> RawEntry {
        raw(
            "9-0",
            &[
                ("type", "held"),
                ("event", "demo"),
                ("hold_id", HOLD),
                ("visitor", "v1"),
                ("qty", "3"),
                ("available", "8"),
                ("ts_ms", "9"),
                ("expires_at_ms", "99"),
                ("items", items),
            ],
        )
    }

    fn stock_with_categories(cats: &str) -> RawEntry {
        raw(
            "9-1",
            &[
                ("type", "stock"),
                ("event", "demo"),
                ("qty", "12"),
                ("version", "1"),
                ("available", "12"),
                ("ts_ms", "9"),
                ("categories", cats),
            ],
        )
    }

    #[test]
    fn items_and_categories_parse() {
        let Parsed::Entry(e) = parse(&ev(), &held_with_items("floor=2/vip=1")) else {
            panic!("dead letter");
        };
        assert_eq!(
            sluice_reservation::types::items_text(&e.items),
            "floor=2/vip=1"
        );
        let Parsed::Entry(e) = parse(&ev(), &stock_with_categories("floor:10:4,vip:2:0")) else {
            panic!("dead letter");
        };
        assert_eq!(e.categories.len(), 2);
        assert_eq!(e.categories[0].cart_limit, Some(4));
        assert_eq!(e.categories[1].cart_limit, None);
        // No field, or an empty one: an event without categories.
        let Parsed::Entry(e) = parse(&ev(), &held_with_items("")) else {
            panic!("dead letter");
        };
        assert!(e.items.is_empty());
    }

    #[test]
    fn malformed_items_and_categories_are_parked() {
        for items in [
            "floor=2/vip=2",
            "floor=3/floor=0",
            "floor=1/floor=2",
            "floor",
            "fl:or=3",
            "floor=x",
        ] {
            match parse(&ev(), &held_with_items(items)) {
                Parsed::Dead(d) => assert!(d.error.contains("items"), "{items}: {}", d.error),
                Parsed::Entry(e) => panic!("{items} parsed as {e:?}"),
            }
        }
        for cats in [
            "floor:10:4",
            "floor:6:0,floor:6:0",
            "floor:12:x",
            "floor:12",
            "a:12:0,",
        ] {
            match parse(&ev(), &stock_with_categories(cats)) {
                Parsed::Dead(d) => assert!(d.error.contains("categories"), "{cats}: {}", d.error),
                Parsed::Entry(e) => panic!("{cats} parsed as {e:?}"),
            }
        }
    }

    #[test]
    fn garbage_is_parked_with_a_reason() {
        for (fields, why) in [
            (vec![("type", "exploded")], "unknown type"),
            (vec![("foo", "bar")], "type missing"),
            (
                vec![("type", "held"), ("event", "other"), ("qty", "1")],
                "event",
            ),
            (
                vec![
                    ("type", "held"),
                    ("event", "demo"),
                    ("hold_id", HOLD),
                    ("visitor", "v"),
                    ("qty", "-1"),
                    ("available", "1"),
                    ("ts_ms", "1"),
                ],
                "qty",
            ),
        ] {
            match parse(&ev(), &raw("1-1", &fields)) {
                Parsed::Dead(d) => assert!(d.error.contains(why), "{} vs {why}", d.error),
                Parsed::Entry(e) => panic!("parsed {e:?}"),
            }
        }
    }

    #[test]
    fn stream_ids_order_and_step() {
        let a = StreamId::parse("10-5").unwrap();
        assert!(a < StreamId::parse("10-6").unwrap());
        assert!(a < StreamId::parse("11-0").unwrap());
        assert_eq!(a.next().to_string(), "10-6");
        assert_eq!(
            StreamId {
                ms: 3,
                seq: u64::MAX
            }
            .next()
            .to_string(),
            "4-0"
        );
        assert!(StreamId::parse("10").is_none());
        assert!(StreamId::parse("a-b").is_none());
    }

    proptest! {
        // Bad input never panics: any bytes are an entry or a dead letter.
        #[test]
        fn any_bytes_parse_or_park(
            id in ".{0,24}",
            fields in proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..12),
                 proptest::collection::vec(any::<u8>(), 0..24)),
                0..10),
        ) {
            let r = RawEntry { id, fields };
            let _ = parse(&ev(), &r);
        }
    }
}
