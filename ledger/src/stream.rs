//! The Redis side: the consumer group on each event's reservation stream,
//! reading, acknowledging, trimming below what every group acknowledged,
//! and the lag ([`stream_lag`], also for the gateway's readiness and
//! metrics).
//!
//! # Keys
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `sluice:{ev}:stream` | stream | the event's transitions (`reservation/STREAM.md`); group [`GROUP`] |
//! | `sluice:{ev}:ledgered` | string | `"1"`, no TTL: a ledger reads this stream, so the scripts add entries without `MAXLEN ~` and only the ledger trims ([`trim`]) |
//!
//! Consumers that stopped are forgotten after a while
//! ([`forget_idle_consumers`]).
//!
//! Every reply is taken apart by hand: an unexpected shape is
//! [`LedgerError::Protocol`], never a panic.

use redis::Value;
use redis::aio::ConnectionLike;
use serde::Serialize;
use sluice_reservation::EventId;

use crate::entry::{RawEntry, StreamId};
use crate::error::{LedgerError, Result};

/// The ledger's consumer group, on every event's stream.
pub const GROUP: &str = "sluice-ledger";

/// The stream of `event`.
pub fn stream_key(event: &EventId) -> String {
    format!("sluice:{{{event}}}:stream")
}

/// The marker saying a ledger reads `event`'s stream.
pub fn ledgered_key(event: &EventId) -> String {
    format!("sluice:{{{event}}}:ledgered")
}

fn classify(e: redis::RedisError, key: &str) -> LedgerError {
    if e.code() == Some("NOGROUP") {
        LedgerError::NoGroup(key.to_owned())
    } else {
        LedgerError::Redis(e)
    }
}

/// Marks the stream as ledgered and creates the group (from the first
/// entry, the stream too when missing); a group that exists already is
/// fine. Run at start and whenever the group turns out missing.
pub async fn ensure_group<C: ConnectionLike + Send>(conn: &mut C, event: &EventId) -> Result<()> {
    let key = stream_key(event);
    redis::cmd("SET")
        .arg(ledgered_key(event))
        .arg("1")
        .query_async::<Value>(conn)
        .await?;
    match redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&key)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async::<Value>(conn)
        .await
    {
        Ok(_) => {
            tracing::info!(stream = %key, group = GROUP, "ledger: consumer group created");
            Ok(())
        }
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

// === reply parsing ===

fn protocol(what: &str, v: &Value) -> LedgerError {
    LedgerError::Protocol(format!("{what}: {v:?}"))
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

/// Entries of a reply `[[id, [field, value, ...]], ...]`; an entry whose
/// fields are nil (deleted meanwhile) is left out.
fn entries(v: &Value) -> Result<Vec<RawEntry>> {
    let list = match v {
        Value::Array(a) => a,
        Value::Nil => return Ok(Vec::new()),
        other => return Err(protocol("entries", other)),
    };
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let Value::Array(parts) = item else {
            return Err(protocol("entry", item));
        };
        let id = parts
            .first()
            .and_then(text)
            .ok_or_else(|| protocol("entry id", item))?;
        let flat: Vec<&Value> = match parts.get(1) {
            Some(Value::Array(f)) => f.iter().collect(),
            Some(Value::Map(m)) => m.iter().flat_map(|(k, v)| [k, v]).collect(),
            Some(Value::Nil) | None => continue,
            Some(other) => return Err(protocol("entry fields", other)),
        };
        let mut fields = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            let k = pair.first().and_then(|v| bytes(v)).unwrap_or_default();
            let v = pair.get(1).and_then(|v| bytes(v)).unwrap_or_default();
            fields.push((k, v));
        }
        out.push(RawEntry { id, fields });
    }
    Ok(out)
}

// === reading ===

/// Reads up to `count` entries never delivered to the group, waiting up
/// to `block_ms` for one (the connection must allow a reply that late).
pub async fn read_new<C: ConnectionLike + Send>(
    conn: &mut C,
    event: &EventId,
    consumer: &str,
    count: usize,
    block_ms: u64,
) -> Result<Vec<RawEntry>> {
    let key = stream_key(event);
    let v: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(block_ms)
        .arg("STREAMS")
        .arg(&key)
        .arg(">")
        .query_async(conn)
        .await
        .map_err(|e| classify(e, &key))?;
    let streams: Vec<&Value> = match &v {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(a) => a.iter().collect(),
        Value::Map(m) => return m.first().map(|(_, e)| entries(e)).unwrap_or(Ok(Vec::new())),
        other => return Err(protocol("XREADGROUP", other)),
    };
    match streams.first() {
        Some(Value::Array(s)) => s.get(1).map(entries).unwrap_or(Ok(Vec::new())),
        None => Ok(Vec::new()),
        Some(other) => Err(protocol("XREADGROUP stream", other)),
    }
}

/// Claims for `consumer` up to `count` entries pending longer than
/// `min_idle_ms` (left by a consumer that died or is stuck), scanning from
/// `cursor`; returns the next cursor (`0-0` when the scan is complete)
/// and the entries.
pub async fn autoclaim<C: ConnectionLike + Send>(
    conn: &mut C,
    event: &EventId,
    consumer: &str,
    min_idle_ms: u64,
    cursor: &str,
    count: usize,
) -> Result<(String, Vec<RawEntry>)> {
    let key = stream_key(event);
    let v: Value = redis::cmd("XAUTOCLAIM")
        .arg(&key)
        .arg(GROUP)
        .arg(consumer)
        .arg(min_idle_ms)
        .arg(cursor)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await
        .map_err(|e| classify(e, &key))?;
    let Value::Array(parts) = &v else {
        return Err(protocol("XAUTOCLAIM", &v));
    };
    let next = parts
        .first()
        .and_then(text)
        .ok_or_else(|| protocol("XAUTOCLAIM cursor", &v))?;
    let claimed = match parts.get(1) {
        Some(e) => entries(e)?,
        None => Vec::new(),
    };
    Ok((next, claimed))
}

/// Acknowledges `ids` (written and committed): they leave the pending list.
pub async fn ack<C: ConnectionLike + Send>(
    conn: &mut C,
    event: &EventId,
    ids: &[String],
) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let key = stream_key(event);
    let n: i64 = redis::cmd("XACK")
        .arg(&key)
        .arg(GROUP)
        .arg(ids)
        .query_async(conn)
        .await
        .map_err(|e| classify(e, &key))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// How many entries of the group are delivered and not acknowledged.
pub async fn pending_count<C: ConnectionLike + Send>(conn: &mut C, event: &EventId) -> Result<u64> {
    let key = stream_key(event);
    let v: Value = redis::cmd("XPENDING")
        .arg(&key)
        .arg(GROUP)
        .query_async(conn)
        .await
        .map_err(|e| classify(e, &key))?;
    match &v {
        Value::Array(p) => Ok(p
            .first()
            .and_then(int)
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0)),
        other => Err(protocol("XPENDING", other)),
    }
}

/// One group of a stream, from `XINFO GROUPS` and `XPENDING`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct GroupState {
    name: String,
    pending: u64,
    last_delivered: StreamId,
    /// `lag` (Redis 7): entries not yet delivered; `None` when Redis
    /// cannot tell.
    lag: Option<u64>,
    /// Smallest pending id.
    min_pending: Option<StreamId>,
}

fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match v {
        Value::Array(a) => a
            .chunks(2)
            .find(|p| p.first().and_then(text).as_deref() == Some(name))
            .and_then(|p| p.get(1)),
        Value::Map(m) => m
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// Removes the ledger group's consumers that have nothing pending and were
/// idle longer than `idle_ms` (processes that stopped or died: each run
/// has a name of its own, so they would pile up). One script, so no
/// consumer can take an entry between the check and the removal
/// (`DELCONSUMER` drops a consumer's pending entries with it). Returns how
/// many were removed.
pub async fn forget_idle_consumers<C: ConnectionLike + Send>(
    conn: &mut C,
    event: &EventId,
    idle_ms: u64,
) -> Result<u64> {
    let key = stream_key(event);
    let n: i64 = redis::Script::new(FORGET_IDLE)
        .key(&key)
        .arg(GROUP)
        .arg(idle_ms)
        .invoke_async(conn)
        .await
        .map_err(|e| classify(e, &key))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// KEYS[1] the stream; ARGV[1] the group, ARGV[2] the idle bound (ms).
const FORGET_IDLE: &str = r#"
local removed = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if f['name'] and f['pending'] == 0 and tonumber(f['idle']) > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    removed = removed + 1
  end
end
return removed
"#;

/// Every group of the stream with its floor, read in one `MULTI` so the
/// pending lists and the delivered ids belong to one moment.
async fn groups<C: ConnectionLike + Send>(conn: &mut C, key: &str) -> Result<Vec<GroupState>> {
    let info: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(conn)
        .await?;
    let Value::Array(list) = &info else {
        return Err(protocol("XINFO GROUPS", &info));
    };
    let names: Vec<String> = list
        .iter()
        .filter_map(|g| field(g, "name").and_then(text))
        .collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("XINFO").arg("GROUPS").arg(key);
    for n in &names {
        pipe.cmd("XPENDING").arg(key).arg(n);
    }
    let replies: Vec<Value> = pipe.query_async(conn).await?;
    let mut it = replies.into_iter();
    let Some(Value::Array(infos)) = it.next() else {
        return Err(LedgerError::Protocol("XINFO GROUPS in MULTI".into()));
    };
    let mut out = Vec::new();
    for (name, pend) in names.iter().zip(it) {
        let Some(g) = infos
            .iter()
            .find(|g| field(g, "name").and_then(text).as_deref() == Some(name.as_str()))
        else {
            continue; // destroyed in between
        };
        let last_delivered = field(g, "last-delivered-id")
            .and_then(text)
            .and_then(|s| StreamId::parse(&s))
            .unwrap_or_default();
        let lag = field(g, "lag")
            .and_then(int)
            .and_then(|n| u64::try_from(n).ok());
        let (pending, min_pending) = match &pend {
            Value::Array(p) => (
                p.first()
                    .and_then(int)
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(0),
                p.get(1).and_then(text).and_then(|s| StreamId::parse(&s)),
            ),
            _ => (0, None),
        };
        out.push(GroupState {
            name: name.clone(),
            pending,
            last_delivered,
            lag,
            min_pending,
        });
    }
    Ok(out)
}

/// The lowest id every group still needs: below it, each group has
/// acknowledged everything. A group's floor is its smallest pending id,
/// or the id after its last delivered one when nothing is pending
/// (everything delivered before a pending entry was delivered and is not
/// pending, so it was acknowledged).
fn floor(groups: &[GroupState]) -> Option<StreamId> {
    groups
        .iter()
        .map(|g| g.min_pending.unwrap_or_else(|| g.last_delivered.next()))
        .min()
}

/// Trims the stream below what every consumer group has acknowledged
/// (`XTRIM MINID`); never an entry unread or unacknowledged by any group,
/// and nothing at all when the stream has no group. Returns the entries
/// removed.
pub async fn trim<C: ConnectionLike + Send>(conn: &mut C, event: &EventId) -> Result<u64> {
    let key = stream_key(event);
    let gs = groups(conn, &key).await?;
    let Some(min) = floor(&gs) else {
        return Ok(0);
    };
    let n: i64 = redis::cmd("XTRIM")
        .arg(&key)
        .arg("MINID")
        .arg(min.to_string())
        .query_async(conn)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Most entries [`stream_lag`] counts one by one when Redis cannot give
/// the group's lag itself.
const LAG_COUNT_MAX: usize = 100_000;

/// How far the ledger is behind on one event's stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Lag {
    /// Entries not yet recorded: undelivered plus delivered and not
    /// acknowledged.
    pub entries: u64,
    /// Age of the oldest of them, seconds by the store's clock (0 when
    /// none).
    pub seconds: f64,
    /// Whether the stream has the ledger's group at all (no group: no
    /// ledger has read it; `entries` is then the stream's length).
    pub grouped: bool,
}

/// The ledger's lag on `event`'s stream (`XINFO GROUPS`: `lag`,
/// `pending`, `last-delivered-id`; the oldest unacknowledged entry's id
/// time against the store's `TIME`).
pub async fn stream_lag<C: ConnectionLike + Send>(conn: &mut C, event: &EventId) -> Result<Lag> {
    let key = stream_key(event);
    let exists: i64 = redis::cmd("EXISTS").arg(&key).query_async(conn).await?;
    if exists == 0 {
        return Ok(Lag::default());
    }
    let gs = groups(conn, &key).await?;
    let now_ms = store_now_ms(conn).await?;
    let Some(g) = gs.iter().find(|g| g.name == GROUP) else {
        let len: i64 = redis::cmd("XLEN").arg(&key).query_async(conn).await?;
        let first = first_id_after(conn, &key, None).await?;
        return Ok(Lag {
            entries: u64::try_from(len).unwrap_or(0),
            seconds: age(now_ms, first),
            grouped: false,
        });
    };
    let undelivered = match g.lag {
        Some(n) => n,
        None => {
            // Redis cannot say (entries deleted in between): count them,
            // up to a bound (a lag that long is reported as the bound).
            let v: Value = redis::cmd("XRANGE")
                .arg(&key)
                .arg(format!("({}", g.last_delivered))
                .arg("+")
                .arg("COUNT")
                .arg(LAG_COUNT_MAX)
                .query_async(conn)
                .await?;
            entries(&v)?.len() as u64
        }
    };
    let oldest = match g.min_pending {
        Some(id) => Some(id),
        None if undelivered > 0 => first_id_after(conn, &key, Some(g.last_delivered)).await?,
        None => None,
    };
    Ok(Lag {
        entries: undelivered + g.pending,
        seconds: age(now_ms, oldest),
        grouped: true,
    })
}

fn age(now_ms: u64, id: Option<StreamId>) -> f64 {
    id.map(|id| now_ms.saturating_sub(id.ms) as f64 / 1000.0)
        .unwrap_or(0.0)
}

async fn first_id_after<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    after: Option<StreamId>,
) -> Result<Option<StreamId>> {
    let start = after.map(|a| format!("({a}")).unwrap_or_else(|| "-".into());
    let v: Value = redis::cmd("XRANGE")
        .arg(key)
        .arg(start)
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await?;
    Ok(entries(&v)?.first().and_then(|e| StreamId::parse(&e.id)))
}

/// The store's clock (`TIME`), Unix milliseconds.
pub async fn store_now_ms<C: ConnectionLike + Send>(conn: &mut C) -> Result<u64> {
    let v: Value = redis::cmd("TIME").query_async(conn).await?;
    let Value::Array(t) = &v else {
        return Err(protocol("TIME", &v));
    };
    let secs = t.first().and_then(int).unwrap_or(0);
    let micros = t.get(1).and_then(int).unwrap_or(0);
    Ok(u64::try_from(secs * 1000 + micros / 1000).unwrap_or(0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn g(pending: Option<&str>, last: &str) -> GroupState {
        GroupState {
            name: "g".into(),
            pending: u64::from(pending.is_some()),
            last_delivered: StreamId::parse(last).unwrap(),
            lag: Some(0),
            min_pending: pending.and_then(StreamId::parse),
        }
    }

    #[test]
    fn the_floor_keeps_every_unacknowledged_entry() {
        // Nothing pending: everything delivered may go.
        assert_eq!(floor(&[g(None, "10-3")]).unwrap().to_string(), "10-4");
        // A pending entry stays, and everything after it.
        assert_eq!(floor(&[g(Some("7-0"), "10-3")]).unwrap().to_string(), "7-0");
        // The slowest group decides.
        assert_eq!(
            floor(&[g(None, "10-3"), g(None, "5-0")])
                .unwrap()
                .to_string(),
            "5-1"
        );
        // A group that read nothing keeps the whole stream.
        assert_eq!(floor(&[g(None, "0-0")]).unwrap().to_string(), "0-1");
        assert_eq!(floor(&[]), None);
    }

    #[test]
    fn odd_replies_are_protocol_errors() {
        assert!(entries(&Value::Int(3)).is_err());
        assert!(entries(&Value::Array(vec![Value::Int(1)])).is_err());
        assert_eq!(entries(&Value::Nil).unwrap(), vec![]);
    }
}
