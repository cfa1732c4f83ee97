//! `sluice swarm`: a bounded crowd of real HTTP visitors thrown at a running
//! gateway, and an honest account of what they got.
//!
//! ```text
//! sluice swarm --url http://127.0.0.1:8080 --visitors 500 --concurrency 64 \
//!     --duration 2m --rate 400 --pay-ratio 0.5 --webhook-secret $S \
//!     --admin-token $T --json
//! ```
//!
//! # Life of a visitor
//!
//! 1. **Challenge.** `POST /_sluice/rooms/{room}/challenge`; solved with the
//!    native solver ([`sluice_pow::solve`], one thread, on the blocking pool),
//!    no sooner than the challenge's `min_solve_ms`.
//! 2. **Join** with `return_to`: 201 waiting (a queue token) or 200 admitted.
//! 3. **Poll** `GET …/status` with the queue token as a bearer, sleeping
//!    `poll_after_ms` (capped by `--max-poll-ms`) between polls, until
//!    admitted; `sold_out` or `closed` ends the visit.
//! 4. **Hold** a random quantity (1..=`--max-qty`, default the event's cart
//!    limit) with an `Idempotency-Key`; some visitors replay the key (the
//!    same hold must come back) and some try a second hold, which probes the
//!    cart limit. On an event with categories a hold asks for `items`: one
//!    or two categories (a bundle), the units split between them.
//! 5. **Pay or leave.** A `--pay-ratio` share of the holds is paid through
//!    the signed payment webhook; of the rest, half is released and half
//!    left to expire.
//!
//! A `429` or `503` with `Retry-After` is honoured a few times before the
//! visitor gives up. Every request first takes a slot from one global pacer
//! (`--rate`, requests/s), so the whole crowd never exceeds it. With
//! `--url` given several times (gateways sharing one store), requests go to
//! them round-robin, so one visitor's challenge, join, polls and holds land
//! on different gateways, as behind a load balancer. `--arrival-rate`
//! spaces the visitors' arrivals (open loop) instead of letting each
//! finished visitor be replaced at once.
//!
//! # Fairness
//!
//! The report's `fairness.kendall_tau` is Kendall's tau-b between the order
//! the visitors' joins were sent in and the places they were admitted at
//! (module `fairness`): 1 for a FIFO room whose queue reordered nobody,
//! about 0 for a fair lottery. Computed in O(n log n).
//!
//! # Lanes
//!
//! With `--lane-mix presale:30%` and `--enqueue-secret S` (the room's
//! `[rooms.enqueue] hmac_secret`), that share of the visitors joins with an
//! enqueue token naming the lane, signed as the origin would sign it (one
//! account per visitor); the others join without one, into the room's
//! default lane. `fairness.lanes` then gives one tau per lane: FIFO within
//! a lane scores 1 there while the room-wide figure counts the lanes'
//! overtaking.
//!
//! # Bounds
//!
//! At most `--visitors` visitors, `--concurrency` at once, `--rate` requests
//! per second, and a hard stop after `--duration` (in-flight requests are
//! dropped). Only loopback targets (`127.0.0.0/8`, `::1`, `localhost`) are
//! accepted unless `--allow-remote`; the check reads the URL's host and
//! happens before any connection. Only `http://` (the binary has no TLS
//! client).
//!
//! # The report and how "oversold" is counted
//!
//! Counted from the answers: every distinct hold granted (201) with its
//! quantity, every confirmation, release and lapse. The **peak of units
//! outstanding** — granted holds not yet released and not past their
//! `expires_at`, plus confirmed ones — is measured at each grant; more than
//! the event's `total` is overselling *seen by the visitors*. With
//! `--admin-token` the event's stock is also read from the admin API after
//! the run: `held + confirmed` above `total`, or `invariant_holds` false, is
//! overselling *seen by the store*. `oversold` is the larger of the two.
//! A visitor whose granted holds add up to more than the cart limit is
//! **above the cart limit**. Both must be 0. On an event with categories
//! the same two counts are kept per category, against each category's own
//! total and cart limit (`categories` in the JSON report, a line each in the
//! table), and must be 0 in every category too.
//!
//! Exit status: 0; 3 when oversold, above the cart limit (the event's or a
//! category's), an idempotent replay returned a different hold, or the
//! store's invariant is broken; 1 when the gateway cannot be used
//! (unreachable, unknown room); 64 for bad flags or a refused remote
//! target.
//!
//! # Layout
//!
//! - `mod.rs` — the flags, their checks (loopback only) and the exit status.
//! - `crowd.rs` — the run: fail-fast probes, the workers that start the
//!   visitors (paced arrivals, the hard stop), the admin view of the stock.
//! - `visitor.rs` — one visitor's journey: challenge, join, poll, hold, pay
//!   or release.
//! - `client.rs` — the pooled HTTP client, the global request pacer,
//!   latencies and errors per endpoint.
//! - `ledger.rs` — the correctness accounting: units outstanding (nobody
//!   oversold) and each visitor's cart (nobody above the cart limit).
//! - `report.rs` — the verdict, the table, the JSON object, the progress bar.
//! - `demo.rs` — the crowd `sluice serve`'s embedded demo shop sends
//!   through its own gateway: the same visitors, in-process, bounded.

mod client;
mod crowd;
pub mod demo;
mod fairness;
mod ledger;
mod report;
mod visitor;

use std::io::{IsTerminal as _, Write as _};
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use http::Uri;

use crate::tools::{Failure, failure, usage};

/// Exit status when the run shows overselling or a broken limit (2 is
/// clap's for a flag it cannot parse).
const EXIT_VIOLATION: u8 = 3;
/// How often one step is retried after a 429/503 or a lost connection.
const RETRIES: u32 = 5;

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime_serde::re::humantime::parse_duration(s)
        .map_err(|e| format!("not a duration: {s:?} ({e}; e.g. 30s, 5m)"))
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| (0.0..=1.0).contains(v))
        .ok_or_else(|| format!("expected a number between 0 and 1, got {s:?}"))
}

/// Flags of `sluice swarm`.
#[derive(Debug, Args)]
pub struct SwarmArgs {
    /// The gateway's base URL (http:// only); repeat for gateways sharing
    /// one store: requests are spread over them round-robin.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: Vec<String>,
    /// The room the visitors queue in.
    #[arg(long, default_value = "default")]
    pub room: String,
    /// The event they buy.
    #[arg(long, default_value = "demo")]
    pub event: String,
    /// Visitors in all.
    #[arg(long, default_value_t = 100)]
    pub visitors: u64,
    /// Visitors at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// New visitors per second at most (0: as fast as --concurrency lets
    /// them in).
    #[arg(long, default_value_t = 0.0)]
    pub arrival_rate: f64,
    /// Hard stop: in-flight visitors are abandoned after this.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Cap on requests per second of the whole crowd (0: none).
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Longest sleep between status polls, whatever `poll_after_ms` says
    /// (the gateway never asks for more than 20 s).
    #[arg(long, default_value_t = 20_000)]
    pub max_poll_ms: u64,
    /// Most units one visitor asks for [default: the event's cart limit].
    #[arg(long)]
    pub max_qty: Option<u32>,
    /// Share of the holds paid through the webhook (needs --webhook-secret).
    #[arg(long, default_value = "0", value_parser = parse_ratio)]
    pub pay_ratio: f64,
    /// The gateway's payment webhook secret.
    #[arg(long, env = "SLUICE_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,
    /// Admin token: the event's stock is read from the admin API for the
    /// report.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Share of the visitors joining each lane, `ID:SHARE,…` (0.3 or
    /// 30%), with an enqueue token naming it (needs --enqueue-secret); the
    /// rest join without one, into the room's default lane.
    #[arg(long, value_name = "ID:SHARE,…", value_parser = crate::tools::simulate::parse_lane_mix)]
    pub lane_mix: Option<crate::tools::simulate::LaneMix>,
    /// The room's enqueue HMAC secret (`[rooms.enqueue] hmac_secret`): the
    /// swarm signs its visitors' enqueue tokens with it, as the origin.
    #[arg(long, env = "SLUICE_ENQUEUE_SECRET", hide_env_values = true)]
    pub enqueue_secret: Option<String>,
    /// Seed of the visitors' choices (quantities, who pays, lanes).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Allow a target that is not a loopback address.
    #[arg(long)]
    pub allow_remote: bool,
}

/// Runs `sluice swarm`; returns the process exit code.
pub fn run(args: SwarmArgs) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(f) => f.exit("swarm"),
    }
}

fn run_inner(args: SwarmArgs) -> Result<ExitCode, Failure> {
    let bases = args
        .url
        .iter()
        .map(|u| check_target(u, args.allow_remote))
        .collect::<Result<Vec<_>, _>>()?;
    if args.concurrency == 0 {
        return Err(usage("--concurrency must be at least 1"));
    }
    if !(args.rate.is_finite() && args.rate >= 0.0) {
        return Err(usage("--rate must be a number of requests/s (0: no cap)"));
    }
    if !(args.arrival_rate.is_finite() && args.arrival_rate >= 0.0) {
        return Err(usage(
            "--arrival-rate must be a number of visitors/s (0: no cap)",
        ));
    }
    if args.max_qty == Some(0) {
        return Err(usage("--max-qty must be at least 1"));
    }
    if args.pay_ratio > 0.0 && args.webhook_secret.is_none() {
        return Err(usage("--pay-ratio needs --webhook-secret"));
    }
    let lane_mix = args.lane_mix.as_ref().map_or(Vec::new(), |m| m.0.clone());
    if !lane_mix.is_empty() {
        if args.enqueue_secret.as_deref().is_none_or(str::is_empty) {
            return Err(usage(
                "--lane-mix needs --enqueue-secret (the room's enqueue hmac_secret)",
            ));
        }
        let sum: f64 = lane_mix.iter().map(|(_, s)| s).sum();
        if sum > 1.0 + 1e-9 {
            return Err(usage(format!(
                "--lane-mix: the shares add up to {sum}, more than 1"
            )));
        }
        for (i, (id, _)) in lane_mix.iter().enumerate() {
            if lane_mix[..i].iter().any(|(other, _)| other == id) {
                return Err(usage(format!("--lane-mix: lane {id:?} named twice")));
            }
        }
    }
    for (flag, v) in [("--room", &args.room), ("--event", &args.event)] {
        if v.is_empty()
            || v.len() > 64
            || !v
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(usage(format!("{flag} must match [A-Za-z0-9_-]{{1,64}}")));
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| failure(format!("cannot start the runtime: {e}")))?;
    let report = rt.block_on(crowd::swarm(args.clone_settings(bases, lane_mix)))?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        writeln!(out, "{}", report.to_json())
    } else {
        write!(out, "{}", report.table())
    };
    written.map_err(|e| failure(format!("cannot write the report: {e}")))?;
    Ok(if report.violations().is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("sluice: swarm: FAILED: {}", report.violations().join("; "));
        ExitCode::from(EXIT_VIOLATION)
    })
}

/// The validated `scheme://authority` of the target, refused (before any
/// connection) unless it is loopback or `allow_remote` is set. No name is
/// resolved: a host name other than `localhost` counts as remote.
fn check_target(url: &str, allow_remote: bool) -> Result<String, Failure> {
    let uri: Uri = url
        .parse()
        .map_err(|e| usage(format!("bad --url {url:?}: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(usage(format!(
                "{url}: https is not supported; use an http:// address (e.g. a port-forward)"
            )));
        }
        _ => return Err(usage(format!("--url {url:?}: expected an http:// URL"))),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| usage(format!("--url {url:?}: no host")))?;
    let host = authority.host();
    if !allow_remote && !is_loopback_host(host) {
        return Err(usage(format!(
            "refusing to swarm {host}: not a loopback address (127.0.0.0/8, ::1, localhost); \
             pass --allow-remote to load a remote gateway you are responsible for"
        )));
    }
    Ok(format!("http://{authority}"))
}

/// `localhost` (and `*.localhost`), `127.0.0.0/8`, `::1` and their
/// IPv4-mapped forms.
fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let lower = h.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    h.parse::<IpAddr>()
        .map(|ip| ip.to_canonical().is_loopback())
        .unwrap_or(false)
}

impl SwarmArgs {
    fn clone_settings(&self, bases: Vec<String>, lane_mix: Vec<(String, f64)>) -> Settings {
        Settings {
            bases,
            arrival_rate: self.arrival_rate,
            room: self.room.clone(),
            event: self.event.clone(),
            visitors: self.visitors,
            concurrency: self.concurrency,
            duration: self.duration,
            rate: self.rate,
            max_poll: Duration::from_millis(self.max_poll_ms.max(1)),
            max_qty: self.max_qty,
            pay_ratio: self.pay_ratio,
            webhook_secret: self.webhook_secret.clone(),
            admin_token: self.admin_token.clone(),
            lane_mix,
            enqueue_secret: self.enqueue_secret.clone(),
            seed: self.seed,
            buy: true,
            solvers: 0,
            progress: !self.json && std::io::stderr().is_terminal(),
        }
    }
}

/// The run's settings, validated.
#[derive(Clone, Debug)]
struct Settings {
    bases: Vec<String>,
    arrival_rate: f64,
    room: String,
    event: String,
    visitors: u64,
    concurrency: usize,
    duration: Duration,
    rate: f64,
    max_poll: Duration,
    max_qty: Option<u32>,
    pay_ratio: f64,
    webhook_secret: Option<String>,
    admin_token: Option<String>,
    /// (lane id, share of the visitors) joining with an enqueue token
    /// naming the lane; the rest join without one.
    lane_mix: Vec<(String, f64)>,
    /// The room's enqueue HMAC secret, to sign those tokens.
    enqueue_secret: Option<String>,
    seed: u64,
    /// Admitted visitors hold (and pay or release); false: they leave once
    /// let in, and the stock is untouched (the embedded demo's fans, who
    /// must not sell out the shop before the newcomer gets in).
    buy: bool,
    /// Proofs of work solved at once (0: no bound but `concurrency`). A
    /// crowd far larger than the machine's cores solves faster one after
    /// the other than all at once: its visitors then join in the order
    /// they came, instead of all together once every solve is done.
    solvers: usize,
    progress: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1",
            "127.9.8.7",
            "[::1]",
            "localhost",
            "LocalHost",
            "a.localhost",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "192.0.2.1",
            "10.0.0.1",
            "[2001:db8::1]",
            "example.com",
            "localhost.example.com",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn targets() {
        assert_eq!(
            check_target("http://127.0.0.1:8080/", false).unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            check_target("http://[::1]:9", false).unwrap(),
            "http://[::1]:9"
        );
        let e = check_target("http://192.0.2.1:8080", false).unwrap_err();
        assert_eq!(e.code, crate::tools::failure::EXIT_USAGE);
        assert!(e.message.contains("--allow-remote"), "{}", e.message);
        assert!(check_target("http://192.0.2.1:8080", true).is_ok());
        assert!(check_target("https://127.0.0.1", false).is_err());
        assert!(check_target("127.0.0.1:8080", false).is_err());
    }
}
