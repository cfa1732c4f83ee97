//! `sluice admin`: a thin command-line client of the admin API. Human
//! tables by default, the API's JSON with `--json`.
//!
//! ```text
//! sluice admin --url http://127.0.0.1:8080 --token T rooms
//! sluice admin --url … --token T room default
//! sluice admin --url … --token T room default set rate=300 paused=false
//! sluice admin --url … --token T room default set adaptive=true override=0
//! sluice admin --url … --token T events
//! sluice admin --url … --token T event demo set total=500 version=2
//! sluice admin --url … --token T event demo rebuild
//! sluice admin --url … --token T event demo waves 2026-12-01T10:15:00Z,10000
//! sluice admin --url … --token T events --json
//! sluice admin --url … --token T invites vip issue count=10 uses=1 label=press
//! sluice admin --url … --token T invites vip            # list (never the codes)
//! sluice admin --url … --token T invites vip ID         # one, with its redemptions
//! sluice admin --url … --token T invites vip revoke ID
//! ```
//!
//! `--json` may come before or after the subcommand and its arguments
//! (`global`); `set`'s `key=value` pairs are plain positionals, so a flag
//! among or after them is read as a flag, never as a pair.

use std::process::ExitCode;

use bytes::Bytes;
use clap::{Args, Subcommand};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value, json};

/// Flags of `sluice admin`.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// The gateway's base URL.
    #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The admin token.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Print the API's JSON instead of a table (before or after the
    /// subcommand).
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub what: AdminCommand,
}

/// Admin subcommands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Every room, one line each.
    Rooms,
    /// One room's full state, or `set key=value …` to change it.
    Room {
        /// Room id.
        name: String,
        /// `set` followed by `key=value` pairs.
        rest: Vec<String>,
    },
    /// Every event's stock, one line each.
    Events,
    /// One event's stock, `set total=… cart_limit=… hold_ttl_seconds=… version=…`,
    /// `rebuild` (a lost event, from the ledger), or `waves` (the pending
    /// schedule; `waves AT,QTY[,CATEGORY] …` replaces it, `waves clear`
    /// empties it).
    Event {
        /// Event id.
        name: String,
        /// `set` followed by `key=value` pairs.
        rest: Vec<String>,
    },
    /// A room's invite codes: list, `issue count=… uses=… label=…
    /// expires_in_seconds=…` (each code shown once), `ID` (its
    /// redemptions) or `revoke ID`.
    Invites {
        /// Room id.
        room: String,
        /// `issue` with `key=value` pairs, `revoke ID`, or `ID`.
        rest: Vec<String>,
    },
}

/// Short names accepted by `room … set`.
fn room_key(k: &str) -> &str {
    match k {
        "rate" => "rate_per_sec",
        "capacity" => "capacity_rps",
        "margin" => "safety_margin",
        "floor" => "difficulty_floor_bits",
        "ceiling" => "difficulty_ceiling_bits",
        "join_limit" => "join_limit_per_prefix_per_min",
        "adaptive" => "adaptive_enabled",
        "override" => "adaptive_override_secs",
        other => other,
    }
}

/// Parses `key=value` pairs: numbers, booleans and `null` as JSON, anything
/// else as a string.
pub fn parse_pairs(
    pairs: &[String],
    rename: fn(&str) -> &str,
) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| format!("`{p}` is not key=value"))?;
        let value = serde_json::from_str::<Value>(v).unwrap_or_else(|_| json!(v));
        out.insert(rename(k).to_owned(), value);
    }
    Ok(out)
}

/// Runs `sluice admin`.
/// `waves` arguments: `AT,QTY[,CATEGORY]` each (AT as RFC 3339 text or
/// Unix ms), or `clear` alone; the body of `PUT .../waves`, which
/// replaces the whole schedule.
pub fn parse_waves(list: &[String]) -> Result<Value, String> {
    if list.len() == 1 && list[0] == "clear" {
        return Ok(json!({ "waves": [] }));
    }
    let mut waves = Vec::new();
    for arg in list {
        let mut f = arg.split(',');
        let (Some(at), Some(qty)) = (f.next(), f.next()) else {
            return Err(format!("{arg}: expected AT,QTY[,CATEGORY]"));
        };
        let qty: u64 = qty
            .parse()
            .map_err(|_| format!("{arg}: QTY must be a whole number"))?;
        let at = match at.parse::<u64>() {
            Ok(ms) => json!(ms),
            Err(_) => json!(at),
        };
        let mut w = json!({ "at": at, "qty": qty });
        if let Some(c) = f.next() {
            w["category"] = json!(c);
        }
        if f.next().is_some() {
            return Err(format!("{arg}: expected AT,QTY[,CATEGORY]"));
        }
        waves.push(w);
    }
    Ok(json!({ "waves": waves }))
}

pub fn run(args: AdminArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice admin: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run_async(&args)) {
        Ok(v) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                print!("{}", render(&args.what, &v));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice admin: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run_async(args: &AdminArgs) -> Result<Value, String> {
    let base = args.url.trim_end_matches('/');
    match &args.what {
        AdminCommand::Rooms => {
            call(
                args,
                Method::GET,
                &format!("{base}/_sluice/admin/rooms"),
                None,
            )
            .await
        }
        AdminCommand::Events => {
            call(
                args,
                Method::GET,
                &format!("{base}/_sluice/admin/events"),
                None,
            )
            .await
        }
        AdminCommand::Room { name, rest } => {
            let url = format!("{base}/_sluice/admin/rooms/{name}");
            match rest.split_first() {
                None => call(args, Method::GET, &url, None).await,
                Some((set, pairs)) if set == "set" && !pairs.is_empty() => {
                    let body = parse_pairs(pairs, room_key)?;
                    call(args, Method::PATCH, &url, Some(Value::Object(body))).await
                }
                _ => Err("usage: room NAME [set key=value …]".into()),
            }
        }
        AdminCommand::Event { name, rest } => {
            let url = format!("{base}/_sluice/admin/events/{name}");
            match rest.split_first() {
                None => call(args, Method::GET, &url, None).await,
                Some((set, pairs)) if set == "set" && !pairs.is_empty() => {
                    let mut body = parse_pairs(pairs, |k| k)?;
                    // PUT replaces the whole spec: fill what was not given
                    // from the current state.
                    if let Ok(cur) = call(args, Method::GET, &url, None).await {
                        for k in ["total", "cart_limit", "hold_ttl_seconds", "room"] {
                            if !body.contains_key(k)
                                && let Some(v) = cur.get(k).filter(|v| !v.is_null())
                            {
                                body.insert(k.to_owned(), v.clone());
                            }
                        }
                        if !body.contains_key("version")
                            && let Some(v) = cur.get("version").and_then(Value::as_u64)
                        {
                            body.insert("version".into(), json!(v + 1));
                        }
                    }
                    call(args, Method::PUT, &url, Some(Value::Object(body))).await
                }
                Some((rebuild, [])) if rebuild == "rebuild" => {
                    call(args, Method::POST, &format!("{url}/rebuild"), None).await
                }
                Some((waves, [])) if waves == "waves" => {
                    call(args, Method::GET, &format!("{url}/waves"), None).await
                }
                Some((waves, list)) if waves == "waves" => {
                    let body = parse_waves(list)?;
                    call(args, Method::PUT, &format!("{url}/waves"), Some(body)).await
                }
                _ => Err(
                    "usage: event NAME [set key=value … | rebuild | waves [AT,QTY[,CATEGORY] … | clear]]"
                        .into(),
                ),
            }
        }
        AdminCommand::Invites { room, rest } => {
            let url = format!("{base}/_sluice/admin/rooms/{room}/invites");
            match rest.split_first() {
                None => call(args, Method::GET, &url, None).await,
                Some((issue, pairs)) if issue == "issue" => {
                    let body = parse_pairs(pairs, |k| k)?;
                    call(args, Method::POST, &url, Some(Value::Object(body))).await
                }
                Some((revoke, [id])) if revoke == "revoke" => {
                    call(args, Method::DELETE, &format!("{url}/{id}"), None).await
                }
                Some((id, [])) => call(args, Method::GET, &format!("{url}/{id}"), None).await,
                _ => Err("usage: invites ROOM [issue key=value … | revoke ID | ID]".into()),
            }
        }
    }
}

async fn call(
    args: &AdminArgs,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("authorization", format!("Bearer {}", args.token))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| format!("bad URL {url}: {e}"))?;
    let res = tokio::time::timeout(std::time::Duration::from_secs(10), client.request(req))
        .await
        .map_err(|_| format!("{url}: no answer within 10 s"))?
        .map_err(|e| format!("{url}: {e}"))?;
    let status = res.status();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .to_bytes();
    let v: Value =
        serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)));
    if status.is_success() {
        Ok(v)
    } else {
        let code = v.get("code").and_then(Value::as_str).unwrap_or("error");
        let detail = v
            .get("detail")
            .or_else(|| v.get("title"))
            .and_then(Value::as_str)
            .unwrap_or("");
        Err(format!("{status} {code}: {detail}"))
    }
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.as_u64().is_none() && n.as_i64().is_none() => format!("{f:.2}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn table(rows: &[&Value], cols: &[&str]) -> String {
    let mut widths: Vec<usize> = cols.iter().map(|c| c.len()).collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| cols.iter().map(|c| cell(&r[*c])).collect())
        .collect();
    for row in &cells {
        for (i, c) in row.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |vals: Vec<String>| {
        vals.iter()
            .enumerate()
            .map(|(i, v)| format!("{v:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
            + "\n"
    };
    out.push_str(&line(cols.iter().map(|c| c.to_string()).collect()));
    for row in cells {
        out.push_str(&line(row));
    }
    out
}

fn key_values(v: &Value) -> String {
    let Some(obj) = v.as_object() else {
        return format!("{v}\n");
    };
    let w = obj.keys().map(|k| k.len()).max().unwrap_or(0);
    obj.iter()
        .map(|(k, v)| format!("{k:<w$}  {}\n", cell(v)))
        .collect()
}

const ROOM_COLS: &[&str] = &[
    "room",
    "state",
    "rate_per_sec",
    "queue_length",
    "tail",
    "frontier",
    "active_sessions",
    "admits_per_sec",
    "difficulty_bits",
];
const EVENT_COLS: &[&str] = &[
    "event",
    "room",
    "total",
    "available",
    "held",
    "confirmed",
    "version",
    "invariant_holds",
];

fn render(what: &AdminCommand, v: &Value) -> String {
    match what {
        AdminCommand::Rooms => {
            let rows: Vec<&Value> = v["rooms"]
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            table(&rows, ROOM_COLS)
        }
        AdminCommand::Events => {
            let rows: Vec<&Value> = v["events"]
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            table(&rows, EVENT_COLS)
        }
        AdminCommand::Room { .. } | AdminCommand::Event { .. } => key_values(v),
        AdminCommand::Invites { .. } => match v["invites"].as_array() {
            // a list, or what `issue` gave (with each code, shown once)
            Some(list) => {
                let rows: Vec<&Value> = list.iter().collect();
                let cols: &[&str] = if list.iter().any(|i| i.get("code").is_some()) {
                    &["id", "code", "uses", "expires_at_ms", "label"]
                } else {
                    INVITE_COLS
                };
                table(&rows, cols)
            }
            None => key_values(v),
        },
    }
}

/// Columns of `invites ROOM`.
const INVITE_COLS: &[&str] = &["id", "label", "uses", "used", "revoked", "expires_at_ms"];

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn waves_arguments() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            parse_waves(&s(&["2026-12-01T10:15:00Z,10000", "1800000000000,5,vip"])).unwrap(),
            json!({"waves": [
                {"at": "2026-12-01T10:15:00Z", "qty": 10000},
                {"at": 1_800_000_000_000u64, "qty": 5, "category": "vip"},
            ]})
        );
        assert_eq!(parse_waves(&s(&["clear"])).unwrap(), json!({"waves": []}));
        for bad in ["10", "x,y", "1,2,c,d"] {
            assert!(parse_waves(&s(&[bad])).is_err(), "{bad}");
        }
    }

    #[test]
    fn pairs_are_typed() {
        let m = parse_pairs(
            &[
                "rate=300".into(),
                "paused=false".into(),
                "max_active=null".into(),
                "room=vip".into(),
            ],
            room_key,
        )
        .unwrap();
        assert_eq!(m["rate_per_sec"], json!(300));
        assert_eq!(m["paused"], json!(false));
        assert_eq!(m["max_active"], Value::Null);
        assert_eq!(m["room"], json!("vip"));
        assert!(parse_pairs(&["oops".into()], room_key).is_err());
    }

    /// `--json` is one flag wherever it stands, and never a `key=value`.
    #[test]
    fn json_is_accepted_after_the_subcommand() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let mut argv = vec!["sluice", "admin", "--token", "t"];
            argv.extend_from_slice(args);
            match crate::tools::cli::Cli::try_parse_from(argv)
                .unwrap()
                .command
            {
                crate::tools::cli::Command::Admin(a) => a,
                other => panic!("{other:?}"),
            }
        };
        for args in [
            &["--json", "rooms"][..],
            &["rooms", "--json"],
            &["events", "--json"],
            &["room", "default", "--json"],
            &["room", "default", "set", "rate=300", "--json"],
            &["room", "default", "set", "--json", "rate=300"],
            &["event", "demo", "set", "total=500", "version=2", "--json"],
        ] {
            let a = parse(args);
            assert!(a.json, "{args:?}");
            if let AdminCommand::Room { rest, .. } | AdminCommand::Event { rest, .. } = &a.what {
                assert!(
                    !rest.iter().any(|r| r.starts_with('-')),
                    "{args:?}: {rest:?}"
                );
            }
        }
        let a = parse(&["room", "default", "set", "rate=300", "paused=true"]);
        assert!(!a.json);
        match a.what {
            AdminCommand::Room { name, rest } => {
                assert_eq!(name, "default");
                assert_eq!(rest, ["set", "rate=300", "paused=true"]);
            }
            other => panic!("{other:?}"),
        }
        // A negative value is still a value.
        match parse(&["room", "default", "set", "rate=-5", "--json"]).what {
            AdminCommand::Room { rest, .. } => assert_eq!(rest, ["set", "rate=-5"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tables_align() {
        let rows = [
            json!({"room": "a", "state": "open"}),
            json!({"room": "longer", "state": "paused"}),
        ];
        let t = table(&rows.iter().collect::<Vec<_>>(), &["room", "state"]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "room    state");
        assert_eq!(lines[2], "longer  paused");
    }
}
