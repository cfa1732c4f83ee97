//! `sluice simulate`: a queue in virtual time, run by the real admission
//! code ([`sluice_admission::sim`]), before the sale or against a live room.
//!
//! ```text
//! sluice simulate --visitors 50000 --arrivals spike --rate 200
//! sluice simulate --visitors 3000000 --arrivals poisson:20000 --capacity-rps 5000 \
//!     --requests-per-visitor 2 --session-length 90s --little-cap \
//!     --solve-median 1s --solve-p95 4s --patience-median 10m --patience-p95 40m \
//!     --csv series.csv --chart queue.svg
//! sluice simulate --from http://gw:8080 --token $T --rate 300   # "what if"
//! ```
//!
//! The room settings are the admin API's (rate or capacity calibration,
//! burst, max_active, claim window, session TTL); the visitors' behaviour
//! (arrivals, proof-of-work solve time, patience, session length, requests
//! per second) is the operator's guess. The output is a summary table (or
//! one JSON object with `--json`), optionally the per-second series as CSV
//! and a chart (SVG or PNG, by the file name).
//!
//! With `--from URL` the room's live state (`GET
//! /_sluice/admin/rooms/{room}` with the admin token) is the starting point:
//! its line (`queue_length`, already solved), its sessions on the origin
//! (`active_sessions`) and its admitted places not yet claimed
//! (`pending_claims`), which hold slots under a cap, and its settings, any
//! flag on top; the answer is when that line drains, e.g. at `--rate X`. A
//! cap derived from the rate (Little's, `max_active_derived`) is derived
//! again from the new rate; an explicit one is kept. Only
//! `http://` URLs (the binary carries no TLS client): reach a TLS-only
//! gateway through a port-forward.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use sluice_admission::RoomSettings;
use sluice_admission::sim::{self, Arrivals, Dist, SecondRow, SimConfig, SimReport};

use crate::tools::{Failure, failure, usage};

/// When the simulated visitors arrive (`--arrivals`).
#[derive(Clone, Debug, PartialEq)]
pub enum ArrivalSpec {
    /// `spike`: everyone at t = 0.
    Spike,
    /// `ramp:SECONDS`: evenly over that many seconds.
    Ramp(f64),
    /// `poisson:PER_SEC`: a Poisson process.
    Poisson(f64),
    /// `csv:FILE`: arrival times in seconds, first column.
    Csv(PathBuf),
}

fn parse_arrivals(s: &str) -> Result<ArrivalSpec, String> {
    let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
    let num = |what: &str| {
        arg.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("{kind}:{what} needs a number, got {arg:?}"))
    };
    match kind {
        "spike" if arg.is_empty() => Ok(ArrivalSpec::Spike),
        "ramp" => Ok(ArrivalSpec::Ramp(num("SECONDS")?)),
        "poisson" => Ok(ArrivalSpec::Poisson(num("PER_SEC")?)),
        "csv" if !arg.is_empty() => Ok(ArrivalSpec::Csv(PathBuf::from(arg))),
        _ => Err(format!(
            "expected spike, ramp:SECONDS, poisson:PER_SEC or csv:FILE, got {s:?}"
        )),
    }
}

/// Seconds from `250ms`, `1.5s`, `5m`, `2h`, `1d` or a bare number of
/// seconds.
fn parse_secs(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (e.g. 250ms, 30s, 5m, 2h)"))?;
    let mult = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 0.001,
        "m" | "min" | "mins" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        u => return Err(format!("unknown unit {u:?} in {s:?} (ms, s, m, h, d)")),
    };
    Ok(v * mult)
}

/// The value of `--lanes` (one flag, a comma-separated list).
#[derive(Clone, Debug)]
pub struct LaneList(pub Vec<sluice_admission::lanes::Lane>);

/// The value of `--lane-mix`: (lane id, share of arrivals).
#[derive(Clone, Debug)]
pub struct LaneMix(pub Vec<(String, f64)>);

/// `presale:70,public:30`: lane ids and weights (`--lanes`); a bare id
/// weighs 1.
fn parse_lanes(s: &str) -> Result<LaneList, String> {
    let lanes = s
        .split(',')
        .map(|part| {
            let (id, w) = part.trim().split_once(':').unwrap_or((part.trim(), "1"));
            let weight = w
                .trim()
                .parse::<u32>()
                .map_err(|_| format!("lane {id:?}: weight {w:?} is not a whole number"))?;
            Ok(sluice_admission::lanes::Lane {
                id: id.trim().to_owned(),
                weight,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    sluice_admission::lanes::validate_lanes(&lanes)?;
    Ok(LaneList(lanes))
}

/// `presale:20%,members:0.1`: the share of arriving visitors per lane
/// (`--lane-mix`), as a fraction or a percentage.
pub(crate) fn parse_lane_mix(s: &str) -> Result<LaneMix, String> {
    s.split(',')
        .map(|part| {
            let (id, v) = part
                .trim()
                .split_once(':')
                .ok_or_else(|| format!("expected LANE:SHARE (e.g. presale:20%), got {part:?}"))?;
            let v = v.trim();
            let share = match v.strip_suffix('%') {
                Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
                None => v.parse::<f64>(),
            }
            .ok()
            .filter(|x| x.is_finite() && (0.0..=1.0).contains(x))
            .ok_or_else(|| {
                format!("lane {id:?}: share {v:?} is not between 0 and 1 (or 0% and 100%)")
            })?;
            Ok((id.trim().to_owned(), share))
        })
        .collect::<Result<_, String>>()
        .map(LaneMix)
}

/// Flags of `sluice simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Visitors who arrive [default: 50000; 0 with --from].
    #[arg(long)]
    pub visitors: Option<u64>,
    /// When they arrive: spike, ramp:SECONDS, poisson:PER_SEC or csv:FILE
    /// (arrival times in seconds, first column).
    #[arg(long, default_value = "spike", value_parser = parse_arrivals)]
    pub arrivals: ArrivalSpec,
    /// Admissions per second [default: derived from --capacity-rps, else
    /// the live room's with --from, else 10].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Burst: admissions saved up while nobody waits [default: 10].
    #[arg(long)]
    pub burst: Option<f64>,
    /// Cap on admitted visitors at once (active sessions + unclaimed
    /// places) [default: none].
    #[arg(long)]
    pub max_active: Option<u64>,
    /// The room's queueing method: fifo, random, queue_all or reject
    /// [default: fifo, or the live room's with --from]. A visitor a full
    /// reject room refuses counts as abandoned; a random room's draws are
    /// seeded from --seed.
    #[arg(long)]
    pub method: Option<String>,
    /// Priority lanes, `ID:WEIGHT,…` (the last is the default lane)
    /// [default: none, or the live room's with --from].
    #[arg(long, value_name = "ID:WEIGHT,…", value_parser = parse_lanes)]
    pub lanes: Option<LaneList>,
    /// How lanes share the rate: weighted or strict [default: weighted, or
    /// the live room's with --from].
    #[arg(long)]
    pub lane_mode: Option<String>,
    /// Share of arriving visitors per lane, `ID:SHARE,…` (0.2 or 20%); the
    /// default lane (the last) takes what the others leave [default:
    /// everyone in the default lane].
    #[arg(long, value_name = "ID:SHARE,…", value_parser = parse_lane_mix)]
    pub lane_mix: Option<LaneMix>,
    /// How long an admitted visitor stays on the origin.
    #[arg(long, default_value = "1s", value_parser = parse_secs)]
    pub session_length: f64,
    /// Let the room enforce Little's cap, ceil(rate × session length).
    #[arg(long)]
    pub little_cap: bool,
    /// End a session when its visit ends (the origin sends `Sluice-Command:
    /// revoke`) instead of letting it expire after the session TTL.
    #[arg(long)]
    pub revoke: bool,
    /// Time an admitted visitor has to claim its place [default: 60s].
    #[arg(long, value_parser = parse_secs)]
    pub claim_window: Option<f64>,
    /// Idle lifetime of a session after the visitor's last request
    /// [default: 5m].
    #[arg(long, value_parser = parse_secs)]
    pub session_ttl: Option<f64>,
    /// Origin capacity, requests/s: derives the rate unless --rate is given,
    /// and is drawn on the chart.
    #[arg(long)]
    pub capacity_rps: Option<f64>,
    /// Share of capacity kept in reserve, for calibration [default: 0.2].
    #[arg(long)]
    pub safety_margin: Option<f64>,
    /// Requests per second an admitted visitor sends to the origin
    /// [default: 1].
    #[arg(long)]
    pub requests_per_visitor: Option<f64>,
    /// Median proof-of-work solve time.
    #[arg(long, default_value = "0s", value_parser = parse_secs)]
    pub solve_median: f64,
    /// 95th percentile of the solve time (log-normal) [default: fixed].
    #[arg(long, value_parser = parse_secs)]
    pub solve_p95: Option<f64>,
    /// Median patience: how long a visitor waits before giving up
    /// [default: forever].
    #[arg(long, value_parser = parse_secs)]
    pub patience_median: Option<f64>,
    /// 95th percentile of the patience (log-normal) [default: fixed].
    #[arg(long, value_parser = parse_secs)]
    pub patience_p95: Option<f64>,
    /// Seed of the random stream: same seed, same result.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The store tick (a divisor of 1s).
    #[arg(long, default_value = "100ms", value_parser = parse_secs)]
    pub tick: f64,
    /// Stop after this much virtual time.
    #[arg(long, default_value = "7d", value_parser = parse_secs)]
    pub max_time: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write the per-second series as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write a chart of queue length, admissions and origin load: SVG or
    /// PNG, by the file name's extension (.svg or .png).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    pub chart: Option<PathBuf>,
    /// Start from a live gateway's room (http:// base URL).
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    /// Admin token for --from.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The room to read with --from.
    #[arg(long, default_value = "default")]
    pub room: String,
}

/// The live room read with `--from`.
#[derive(Debug)]
struct Live {
    url: String,
    room: String,
    queue_length: u64,
    /// Sessions on the origin and admitted places not yet claimed: with a
    /// cap they hold slots, so the what-if starts with them.
    active_sessions: u64,
    pending_claims: u64,
    paused: bool,
    /// Waiting per lane id, with lanes.
    lanes_waiting: Vec<(String, u64)>,
}

/// Runs `sluice simulate`; returns the process exit code (0, 64 for bad
/// flags or input, 1 when the live room cannot be read or a file written).
pub fn run(args: SimulateArgs) -> ExitCode {
    match run_inner(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.exit("simulate"),
    }
}

fn run_inner(args: &SimulateArgs) -> Result<(), Failure> {
    let chart = args
        .chart
        .as_deref()
        .map(|p| chart_format(p).map(|f| (p, f)))
        .transpose()?;
    let (cfg, live) = build_config(args)?;
    let show_bar = !args.json && std::io::stderr().is_terminal();
    let bar = if show_bar {
        let b = ProgressBar::new(1000);
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} simulating [{bar:40}] {percent:>3}% {elapsed}")
        {
            b.set_style(style.progress_chars("=> "));
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let report = sim::run(&cfg, |f| bar.set_position((f * 1000.0) as u64))
        .map_err(|e| usage(e.to_string()))?;
    bar.finish_and_clear();

    if let Some(path) = &args.csv {
        write_csv(path, &report.series)
            .map_err(|e| failure(format!("cannot write {}: {e}", path.display())))?;
    }
    if let Some((path, format)) = chart {
        write_chart(path, format, &report)
            .map_err(|e| failure(format!("cannot draw the chart {}: {e}", path.display())))?;
    }
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        let mut v = serde_json::to_value(&report).unwrap_or(Value::Null);
        if let (Some(live), Value::Object(m)) = (&live, &mut v) {
            m.insert(
                "from".into(),
                json!({
                    "url": live.url,
                    "room": live.room,
                    "queue_length": live.queue_length,
                    "active_sessions": live.active_sessions,
                    "pending_claims": live.pending_claims,
                    "paused": live.paused,
                }),
            );
        }
        writeln!(out, "{v}")
    } else {
        write!(out, "{}", summary(&cfg, &report, live.as_ref()))
    };
    written.map_err(|e| failure(format!("cannot write the report: {e}")))
}

/// Turns the flags (and the live room) into a [`SimConfig`].
fn build_config(args: &SimulateArgs) -> Result<(SimConfig, Option<Live>), Failure> {
    let mut room = RoomSettings::default();
    let mut live = None;
    let mut live_capacity = None;
    if let Some(url) = &args.from {
        let token = args
            .token
            .as_deref()
            .ok_or_else(|| usage("--from needs --token (or SLUICE_ADMIN_TOKEN)"))?;
        let v = fetch_room(url, token, &args.room).map_err(failure)?;
        apply_live(&mut room, &v);
        live_capacity = room.capacity_rps;
        let paused = v["paused"].as_bool().unwrap_or(false);
        // what-if: as if admission were running
        room.paused = false;
        room.closed = false;
        live = Some(Live {
            url: url.clone(),
            room: args.room.clone(),
            queue_length: v["queue_length"].as_u64().unwrap_or(0),
            active_sessions: v["active_sessions"].as_u64().unwrap_or(0),
            pending_claims: v["pending_claims"].as_u64().unwrap_or(0),
            paused,
            lanes_waiting: v["lanes"]
                .as_array()
                .map(|ls| {
                    ls.iter()
                        .filter_map(|l| {
                            Some((l["id"].as_str()?.to_owned(), l["waiting"].as_u64()?))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
    if let Some(b) = args.burst {
        room.burst = b;
    }
    if let Some(m) = args.max_active {
        room.max_active = Some(m);
    }
    if let Some(m) = &args.method {
        room.method = sluice_admission::QueueMethod::parse(m)
            .map_err(|e| usage(format!("--method: {}", e.reason)))?;
    }
    if let Some(l) = &args.lanes {
        room.lanes = l.0.clone();
    }
    if let Some(m) = &args.lane_mode {
        room.lane_mode = parse_lane_mode(m).map_err(|e| usage(format!("--lane-mode: {e}")))?;
    }
    if let Some(s) = args.claim_window {
        room.claim_window = secs(s, "--claim-window")?;
    }
    if let Some(s) = args.session_ttl {
        room.session_ttl = secs(s, "--session-ttl")?;
    }
    if let Some(m) = args.safety_margin {
        room.safety_margin = m;
    }
    if let Some(r) = args.requests_per_visitor {
        room.requests_per_visitor_per_sec = r;
    }
    if let Some(r) = args.rate {
        // an explicit rate wins over calibration
        room.rate_per_sec = r;
        room.capacity_rps = None;
    } else if let Some(c) = args.capacity_rps {
        room.capacity_rps = Some(c);
    }
    room.recalibrate();
    if args.little_cap {
        room.session_length = Some(secs(args.session_length, "--session-length")?);
    }
    // (a random room's seed is the run's own: `SimConfig::room_settings`)
    sluice_admission::sim::SimConfig {
        room: room.clone(),
        ..Default::default()
    }
    .room_settings()
    .validate()
    .map_err(|e| usage(e.to_string()))?;

    let arrivals = match &args.arrivals {
        ArrivalSpec::Spike => Arrivals::Spike,
        ArrivalSpec::Ramp(s) => Arrivals::Ramp { seconds: *s },
        ArrivalSpec::Poisson(r) => Arrivals::Poisson { per_sec: *r },
        ArrivalSpec::Csv(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
            let mut times = sim::parse_arrival_times(&text)
                .map_err(|e| usage(format!("{}: {e}", path.display())))?;
            if let Some(n) = args.visitors {
                times.sort_by(f64::total_cmp);
                times.truncate(n as usize);
            }
            Arrivals::Times(times)
        }
    };
    let lane_mix = match &args.lane_mix {
        Some(mix) => lane_mix(&room.lanes, &mix.0)?,
        None => Vec::new(),
    };
    let (initial_queue, initial_lanes) = match &live {
        Some(l) => initial_line(&room.lanes, l),
        None => (0, Vec::new()),
    };
    let tick_ms = (args.tick * 1000.0).round();
    if !(1.0..=1000.0).contains(&tick_ms) {
        return Err(usage("--tick must be between 1ms and 1s"));
    }
    let cfg = SimConfig {
        visitors: args
            .visitors
            .unwrap_or(if live.is_some() { 0 } else { 50_000 }),
        initial_queue,
        initial_lanes,
        lane_mix,
        initial_active: live.as_ref().map_or(0, |l| l.active_sessions),
        initial_pending: live.as_ref().map_or(0, |l| l.pending_claims),
        arrivals,
        room,
        session_seconds: args.session_length,
        revoke_at_end: args.revoke,
        solve: Dist::from_median_p95(args.solve_median, args.solve_p95),
        patience: args
            .patience_median
            .map(|m| Dist::from_median_p95(m, args.patience_p95)),
        capacity_rps: args.capacity_rps.or(live_capacity),
        seed: args.seed,
        tick_ms: tick_ms as u64,
        horizon_seconds: args.max_time,
    };
    if args.patience_median.is_none() && args.patience_p95.is_some() {
        return Err(usage("--patience-p95 needs --patience-median"));
    }
    cfg.validate().map_err(|e| usage(e.to_string()))?;
    Ok((cfg, live))
}

fn parse_lane_mode(s: &str) -> Result<sluice_admission::lanes::LaneMode, String> {
    match s {
        "weighted" => Ok(sluice_admission::lanes::LaneMode::Weighted),
        "strict" => Ok(sluice_admission::lanes::LaneMode::Strict),
        _ => Err(format!("expected weighted or strict, got {s:?}")),
    }
}

/// The share of arrivals per lane of `lanes` from `--lane-mix`: the lanes
/// named get their share, the default lane (the last) what is left unless
/// it is named too (then the shares must add up to 1).
fn lane_mix(
    lanes: &[sluice_admission::lanes::Lane],
    mix: &[(String, f64)],
) -> Result<Vec<f64>, Failure> {
    if lanes.is_empty() {
        return Err(usage(
            "--lane-mix needs a room with lanes (--lanes, or a live room's with --from)",
        ));
    }
    let mut shares = vec![None; lanes.len()];
    for (id, share) in mix {
        let i = lanes.iter().position(|l| &l.id == id).ok_or_else(|| {
            let ids: Vec<&str> = lanes.iter().map(|l| l.id.as_str()).collect();
            usage(format!(
                "--lane-mix: no lane {id:?} (lanes: {})",
                ids.join(", ")
            ))
        })?;
        if shares[i].replace(*share).is_some() {
            return Err(usage(format!("--lane-mix: lane {id:?} named twice")));
        }
    }
    let named: f64 = shares.iter().flatten().sum();
    let last = lanes.len() - 1;
    if shares[last].is_none() {
        if named > 1.0 + 1e-9 {
            return Err(usage(format!(
                "--lane-mix: the shares add up to {named}, more than 1"
            )));
        }
        shares[last] = Some((1.0 - named).max(0.0));
    } else if (named - 1.0).abs() > 1e-6 {
        return Err(usage(format!(
            "--lane-mix: with the default lane named, the shares must add up to 1 (they add up to {named})"
        )));
    }
    Ok(shares.into_iter().map(|s| s.unwrap_or(0.0)).collect())
}

/// The live room's line: its length and, with lanes, how it splits over
/// `lanes` (by id; a lane the simulation does not have sends its line to
/// the default lane).
fn initial_line(lanes: &[sluice_admission::lanes::Lane], live: &Live) -> (u64, Vec<u64>) {
    if lanes.is_empty() || live.lanes_waiting.is_empty() {
        return (live.queue_length, Vec::new());
    }
    let mut per = vec![0u64; lanes.len()];
    for (id, n) in &live.lanes_waiting {
        let i = lanes
            .iter()
            .position(|l| &l.id == id)
            .unwrap_or(lanes.len() - 1);
        per[i] += n;
    }
    (per.iter().sum(), per)
}

fn secs(s: f64, flag: &str) -> Result<Duration, Failure> {
    Duration::try_from_secs_f64(s).map_err(|_| usage(format!("{flag}: not a duration")))
}

/// Copies the live room's settings (admin view, API.md) into `room`.
fn apply_live(room: &mut RoomSettings, v: &Value) {
    if let Some(r) = v["rate_per_sec"].as_f64() {
        room.rate_per_sec = r;
    }
    if let Some(b) = v["burst"].as_f64() {
        room.burst = b;
    }
    // The cap in force: Little's (derived from the rate and the session
    // length) follows the rate, so a --rate on top re-derives it; an
    // explicit one is kept. A gateway that does not say which is taken as
    // explicit.
    let little = v["max_active_derived"].as_bool() == Some(true);
    match v["session_length_secs"]
        .as_f64()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero())
    {
        Some(d) if little => {
            room.max_active = None;
            room.session_length = Some(d);
        }
        _ => room.max_active = v["max_active"].as_u64(),
    }
    if let Some(m) = v["method"]
        .as_str()
        .and_then(|m| sluice_admission::QueueMethod::parse(m).ok())
    {
        room.method = m;
    }
    if let Some(ls) = v["lanes"].as_array() {
        room.lanes = ls
            .iter()
            .filter_map(|l| {
                Some(sluice_admission::lanes::Lane {
                    id: l["id"].as_str()?.to_owned(),
                    weight: u32::try_from(l["weight"].as_u64()?).ok()?,
                })
            })
            .collect();
    }
    if let Some(m) = v["lane_mode"]
        .as_str()
        .and_then(|m| parse_lane_mode(m).ok())
    {
        room.lane_mode = m;
    }
    room.capacity_rps = v["capacity_rps"].as_f64();
    if let Some(m) = v["safety_margin"].as_f64() {
        room.safety_margin = m;
    }
    if let Some(r) = v["requests_per_visitor_per_sec"].as_f64() {
        room.requests_per_visitor_per_sec = r;
    }
    if let Some(d) = v["claim_window_secs"]
        .as_f64()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
    {
        room.claim_window = d;
    }
    if let Some(d) = v["session_ttl_secs"]
        .as_f64()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
    {
        room.session_ttl = d;
    }
}

/// `GET {base}/_sluice/admin/rooms/{room}` with the admin token, on a
/// current-thread runtime (the CLI is otherwise synchronous).
fn fetch_room(base: &str, token: &str, room: &str) -> Result<Value, String> {
    use http_body_util::{BodyExt as _, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let url = format!("{}/_sluice/admin/rooms/{room}", base.trim_end_matches('/'));
    let uri: http::Uri = url.parse().map_err(|e| format!("bad URL {url:?}: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "{url}: https is not supported here; use an http:// address (e.g. a port-forward)"
            ));
        }
        _ => return Err(format!("{url}: expected an http:// URL")),
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    rt.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
        let req = http::Request::get(uri)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|e| format!("{url}: {e}"))?;
        let limit = Duration::from_secs(10);
        let resp = tokio::time::timeout(limit, client.request(req))
            .await
            .map_err(|_| format!("{url}: no answer within {limit:?}"))?
            .map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status();
        let body = tokio::time::timeout(limit, resp.into_body().collect())
            .await
            .map_err(|_| format!("{url}: body not received within {limit:?}"))?
            .map_err(|e| format!("{url}: {e}"))?
            .to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            return Err(format!("{url}: HTTP {status}: {}", text.trim()));
        }
        serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
    })
}

// === output ===

/// `4m 10s`, `12.3s`, `2h 05m`, `3d 4h`.
fn human(secs: f64) -> String {
    if !secs.is_finite() {
        return "never".into();
    }
    if secs < 60.0 {
        return format!("{secs:.1}s");
    }
    let s = secs.round() as u64;
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m:02}m")
    } else {
        format!("{m}m {sec:02}s")
    }
}

/// `1,234,567`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn rate_str(r: f64) -> String {
    if r.fract() == 0.0 && r.abs() < 1e15 {
        thousands(r as u64)
    } else {
        format!("{r:.1}")
    }
}

/// The human summary table.
fn summary(cfg: &SimConfig, r: &SimReport, live: Option<&Live>) -> String {
    let mut s = String::new();
    let arrivals = match &cfg.arrivals {
        Arrivals::Spike => "all at once".to_owned(),
        Arrivals::Ramp { seconds } => format!("over {}", human(*seconds)),
        Arrivals::Poisson { per_sec } => format!("Poisson {}/s", rate_str(*per_sec)),
        Arrivals::Times(t) => format!("{} times from CSV", thousands(t.len() as u64)),
    };
    let cap = match r.max_active {
        Some(m) => format!("max active {}", thousands(m)),
        None => "no active cap".into(),
    };
    s.push_str(&format!(
        "sluice simulate: rate {}/s, burst {}, {cap}, seed {}\n",
        rate_str(r.rate_per_sec),
        rate_str(r.burst),
        cfg.seed
    ));
    if let Some(l) = live {
        line(
            &mut s,
            "live room",
            format!(
                "{} at {}: {} in line, {} active, {} admitted not yet claimed{}",
                l.room,
                l.url,
                thousands(l.queue_length),
                thousands(l.active_sessions),
                thousands(l.pending_claims),
                if l.paused {
                    " (paused: simulated as resumed)"
                } else {
                    ""
                }
            ),
        );
    }
    line(
        &mut s,
        "visitors",
        format!("{} ({arrivals})", thousands(r.visitors)),
    );
    line(
        &mut s,
        "admitted",
        format!(
            "{} ({} passthrough)",
            thousands(r.admitted),
            thousands(r.passthrough)
        ),
    );
    line(
        &mut s,
        "abandoned",
        format!(
            "{} ({} no-show slots refunded, {} late claims)",
            thousands(r.abandoned),
            thousands(r.refunded),
            thousands(r.late_claims)
        ),
    );
    if r.unfinished > 0 {
        line(
            &mut s,
            "still waiting",
            format!("{} at the horizon", thousands(r.unfinished)),
        );
    }
    line(
        &mut s,
        "drain",
        match r.drain_seconds {
            // under a minute `human` already says "19.9s": once is enough
            Some(d) if d < 60.0 => human(d),
            Some(d) => format!("{} ({d:.1} s)", human(d)),
            None => format!("not within {}", human(r.simulated_seconds)),
        },
    );
    line(&mut s, "peak queue", thousands(r.peak_queue_length));
    summary_load(&mut s, r);
    summary_lanes(&mut s, cfg, r);
    if let Some(l) = live {
        match r.drain_seconds {
            Some(d) => s.push_str(&format!(
                "The line of {} drains in {} at {}/s.\n",
                thousands(l.queue_length),
                human(d),
                rate_str(r.rate_per_sec)
            )),
            None => s.push_str(&format!(
                "The line of {} does not drain within {} at {}/s.\n",
                thousands(l.queue_length),
                human(r.simulated_seconds),
                rate_str(r.rate_per_sec)
            )),
        }
    }
    s
}

/// The summary's lines on waits and load: wait percentiles, origin
/// requests/s against capacity, edge polls/s.
fn summary_load(s: &mut String, r: &SimReport) {
    let w = r.wait_seconds;
    line(
        s,
        "wait mean / p50",
        format!("{} / {}", human(w.mean), human(w.p50)),
    );
    line(
        s,
        "wait p95 / p99 / max",
        format!("{} / {} / {}", human(w.p95), human(w.p99), human(w.max)),
    );
    line(
        s,
        "fairness (Kendall tau)",
        match r.kendall_tau {
            Some(t) => format!("{t:.6} (arrival order against place)"),
            None => "n/a (no arrival order: a spike, or under two admitted)".into(),
        },
    );
    let capacity = match r.capacity_rps {
        Some(c) => {
            let verdict = if r.origin_peak_rps > c {
                "OVER capacity"
            } else {
                "within capacity"
            };
            format!(" against capacity {} ({verdict})", rate_str(c))
        }
        None => String::new(),
    };
    line(
        s,
        "origin requests/s",
        format!(
            "peak {:.1}, mean {:.1}{capacity}",
            r.origin_peak_rps, r.origin_mean_rps
        ),
    );
    line(
        s,
        "edge polls/s",
        format!(
            "mean {}, peak {} ({} polls)",
            thousands(r.edge_polls_per_sec.mean.round() as u64),
            thousands(r.edge_polls_per_sec.peak),
            thousands(r.edge_polls_per_sec.total)
        ),
    );
    let (p, q) = (r.edge_requests_polling, r.edge_requests_pushed);
    line(
        s,
        "edge requests/s",
        format!(
            "polling: mean {}, peak {}; pushed: mean {}, peak {} ({} vs {} requests, {:.0}% fewer)",
            thousands(p.mean.round() as u64),
            thousands(p.peak),
            thousands(q.mean.round() as u64),
            thousands(q.peak),
            thousands(p.total),
            thousands(q.total),
            if p.total > 0 {
                100.0 * (1.0 - q.total as f64 / p.total as f64)
            } else {
                0.0
            }
        ),
    );
}

/// One line per lane: its visitors, admissions, waits, drain and the
/// fairness within it.
fn summary_lanes(s: &mut String, cfg: &SimConfig, r: &SimReport) {
    if r.lanes.is_empty() {
        return;
    }
    let mode = match cfg.room.lane_mode {
        sluice_admission::lanes::LaneMode::Weighted => "weighted",
        sluice_admission::lanes::LaneMode::Strict => "strict",
    };
    s.push_str(&format!(
        "  lanes ({mode}; the room-wide tau above counts the lanes' overtaking)\n"
    ));
    for l in &r.lanes {
        let drain = match l.drain_seconds {
            Some(d) => human(d),
            None if l.visitors == 0 => "-".into(),
            None => "not drained".into(),
        };
        let tau = match l.kendall_tau {
            Some(t) => format!("{t:.6}"),
            None => "n/a".into(),
        };
        line(
            s,
            &format!("  {} (weight {})", l.id, l.weight),
            format!(
                "{} visitors, {} admitted ({} passthrough), {} abandoned; wait p50 / p95 {} / {}; drain {drain}; tau {tau}",
                thousands(l.visitors),
                thousands(l.admitted),
                thousands(l.passthrough),
                thousands(l.abandoned),
                human(l.wait_seconds.p50),
                human(l.wait_seconds.p95),
            ),
        );
    }
}

/// One `key   value` line of the summary.
fn line(s: &mut String, k: &str, v: String) {
    s.push_str(&format!("  {k:<23}{v}\n"));
}

/// The per-second series, one row per second.
fn write_csv(path: &Path, rows: &[SecondRow]) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(
        w,
        "t,queue_length,joined,admitted_per_sec,claimed,abandoned,active_sessions,pending_claims,origin_rps,polls,push_requests"
    )?;
    for r in rows {
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{:.3},{},{}",
            r.t,
            r.queue_length,
            r.joined,
            r.admitted_per_sec,
            r.claimed,
            r.abandoned,
            r.active_sessions,
            r.pending_claims,
            r.origin_rps,
            r.polls,
            r.push_requests
        )?;
    }
    w.flush()
}

/// The format of `--chart`, from the file's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChartFormat {
    Svg,
    Png,
}

/// `.svg` or `.png` (any case); anything else is a usage error, refused
/// before the simulation runs.
fn chart_format(path: &Path) -> Result<ChartFormat, Failure> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => Ok(ChartFormat::Svg),
        Some("png") => Ok(ChartFormat::Png),
        _ => Err(usage(format!(
            "--chart {}: the file name must end in .svg or .png",
            path.display()
        ))),
    }
}

/// Chart size, pixels.
const CHART_SIZE: (u32, u32) = (1100, 760);

/// Writes the chart as SVG or PNG (by `format`).
fn write_chart(path: &Path, format: ChartFormat, r: &SimReport) -> Result<(), String> {
    use plotters::prelude::*;
    register_chart_font()?;
    match format {
        ChartFormat::Svg => {
            let root = SVGBackend::new(path, CHART_SIZE).into_drawing_area();
            draw_chart(&root, r)?;
            root.present().map_err(|x| x.to_string())
        }
        ChartFormat::Png => {
            let (w, h) = CHART_SIZE;
            let mut rgb = vec![0u8; w as usize * h as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, CHART_SIZE).into_drawing_area();
                draw_chart(&root, r)?;
                root.present().map_err(|x| x.to_string())?;
            }
            let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
            let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut writer = enc.write_header().map_err(|e| e.to_string())?;
            writer.write_image_data(&rgb).map_err(|e| e.to_string())?;
            writer.finish().map_err(|e| e.to_string())
        }
    }
}

/// Plotters draws text with ab_glyph, which knows only registered fonts:
/// "sans-serif" is Ubuntu Light, carried in the binary (no system fonts).
fn register_chart_font() -> Result<(), String> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(
            "sans-serif",
            plotters::style::FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        )
        .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err("the bundled chart font could not be loaded".into())
    }
}

/// The chart: queue length above; admissions per second, origin requests
/// per second and the capacity line below.
fn draw_chart<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    r: &SimReport,
) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| e.to_string();

    let rows = &r.series;
    let t_max = (rows.len().max(2) - 1) as f64;
    let q_max = rows
        .iter()
        .map(|x| x.queue_length)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let rate_max = rows
        .iter()
        .map(|x| (x.admitted_per_sec as f64).max(x.origin_rps))
        .fold(r.capacity_rps.unwrap_or(0.0), f64::max)
        .max(1.0)
        * 1.1;

    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (top, bottom) = root.split_vertically(360);

    let mut q = ChartBuilder::on(&top)
        .caption("Queue length", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..q_max * 1.05)
        .map_err(|x| e(&x))?;
    q.configure_mesh()
        .x_desc("seconds")
        .y_desc("visitors in line")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|x| e(&x))?;
    q.draw_series(LineSeries::new(
        rows.iter().map(|x| (x.t as f64, x.queue_length as f64)),
        BLUE.stroke_width(2),
    ))
    .map_err(|x| e(&x))?;

    let mut o = ChartBuilder::on(&bottom)
        .caption("Per second", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..rate_max)
        .map_err(|x| e(&x))?;
    o.configure_mesh()
        .x_desc("seconds")
        .y_desc("per second")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|x| e(&x))?;
    o.draw_series(LineSeries::new(
        rows.iter().map(|x| (x.t as f64, x.admitted_per_sec as f64)),
        GREEN.stroke_width(2),
    ))
    .map_err(|x| e(&x))?
    .label("admitted/s")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN.stroke_width(2)));
    o.draw_series(LineSeries::new(
        rows.iter().map(|x| (x.t as f64, x.origin_rps)),
        RED.stroke_width(2),
    ))
    .map_err(|x| e(&x))?
    .label("origin requests/s")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    if let Some(c) = r.capacity_rps {
        o.draw_series(LineSeries::new(
            [(0.0, c), (t_max, c)],
            BLACK.stroke_width(1),
        ))
        .map_err(|x| e(&x))?
        .label("capacity")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
    o.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn flag_values() {
        assert_eq!(parse_arrivals("spike"), Ok(ArrivalSpec::Spike));
        assert_eq!(parse_arrivals("ramp:60"), Ok(ArrivalSpec::Ramp(60.0)));
        assert_eq!(parse_arrivals("poisson:2.5"), Ok(ArrivalSpec::Poisson(2.5)));
        assert_eq!(
            parse_arrivals("csv:a.csv"),
            Ok(ArrivalSpec::Csv(PathBuf::from("a.csv")))
        );
        assert!(parse_arrivals("ramp").is_err());
        assert!(parse_arrivals("wave:3").is_err());
        assert_eq!(parse_secs("250ms"), Ok(0.25));
        assert_eq!(parse_secs("5m"), Ok(300.0));
        assert_eq!(parse_secs("1.5"), Ok(1.5));
        assert_eq!(parse_secs("7d"), Ok(604_800.0));
        assert!(parse_secs("soon").is_err());
        assert!(parse_secs("3 weeks").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(human(12.34), "12.3s");
        assert_eq!(human(250.0), "4m 10s");
        assert_eq!(human(7_500.0), "2h 05m");
        assert_eq!(human(f64::INFINITY), "never");
    }
}
