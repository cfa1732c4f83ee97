//! `[[rooms]]`: the waiting rooms and the requests each guards.

use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use sluice_admission::RoomSettings;

use crate::config::error::ConfigError;

/// One waiting room and the requests it guards.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoomConfig {
    /// Room id (`[A-Za-z0-9_-]{1,64}`), used in URLs, cookies and keys.
    pub id: String,
    /// Host names this room guards (empty: any host).
    pub hosts: Vec<String>,
    /// Path prefixes this room guards (empty: every path). The most
    /// specific match among all rooms wins.
    pub paths: Vec<String>,
    /// Path prefixes under the room's hosts that are never queued
    /// (`/robots.txt`, static assets, feeds).
    pub bypass_paths: Vec<String>,
    /// Client address ranges that are never queued (monitoring, partners).
    pub bypass_ips: Vec<IpNet>,
    /// Match `paths` and `bypass_paths` ignoring ASCII case, for an origin
    /// that serves `/Tickets` as `/tickets` (IIS, a case-insensitive file
    /// system). Off by default.
    pub case_insensitive_paths: bool,
    /// Pass an encoded slash (`%2F`) in a path this room guards through to
    /// the origin, for an origin that really uses them (routing decides on
    /// the decoded form, where `%2F` is `/`). Off by default: such a
    /// request is answered 400 `malformed_request`, since origins disagree
    /// on whether `%2F` separates segments.
    pub allow_encoded_slashes: bool,
    /// Admissions per second (0 with `capacity_rps` set: derived from it).
    pub rate_per_sec: f64,
    /// Admissions saved up while nobody waits (at least 1).
    pub burst: f64,
    /// The origin's capacity in requests/s; when set, the rate is derived:
    /// `capacity_rps × (1 − safety_margin) / requests_per_visitor_per_sec`.
    pub capacity_rps: Option<f64>,
    /// Share of the capacity kept in reserve, in [0, 1).
    pub safety_margin: f64,
    /// Requests per second one admitted visitor sends to the origin.
    pub requests_per_visitor_per_sec: f64,
    /// Most admitted visitors at once (sessions plus unclaimed admissions).
    pub max_active: Option<u64>,
    /// How long an admitted visitor stays; with it and no `max_active`, the
    /// cap is Little's law: `rate × session_length`.
    #[serde(with = "humantime_serde")]
    pub session_length: Option<Duration>,
    /// Time an admitted visitor has to claim its place before the slot is
    /// given back (no-show).
    #[serde(with = "humantime_serde")]
    pub claim_window: Duration,
    /// Idle lifetime of an admission (session): the admission token lasts
    /// this long and is renewed while the visitor is active.
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    /// Hard cap on a session however active it is (none: sliding forever).
    #[serde(with = "humantime_serde")]
    pub session_hard_cap: Option<Duration>,
    /// Bind admission tokens to the client's network prefix (/24, /56).
    pub bind_ip_prefix: bool,
    /// When the store cannot be reached: `closed` holds new visitors (the
    /// default), `open` lets them through. Admitted visitors always pass.
    pub failure_policy: FailurePolicy,
    /// Status of the waiting-room page for browsers: 200, 202, 429 or 503.
    pub waiting_status: u16,
    /// Challenges and joins allowed per client network prefix per minute
    /// (0: no limit).
    pub join_limit_per_prefix_per_min: u32,
    /// Invite-only: a challenge and a join must carry a valid invite code
    /// (README, "Invite codes"). Off by default.
    pub invite_only: bool,
    /// Invite codes tried per client network prefix per minute, valid or
    /// not (0: no limit), one budget for every gateway on the queue store:
    /// guessing costs time as well as 128 bits.
    pub invite_attempts_per_prefix_per_min: u32,
    /// Enqueue tokens from the origin (`[rooms.enqueue]`): the keys the
    /// room trusts, and whether a join must carry one (README, "One place
    /// per account").
    pub enqueue: EnqueueConfig,
    /// Puzzles per challenge (k).
    pub puzzles: u8,
    /// Lowest proof-of-work difficulty (leading zero bits per puzzle).
    pub difficulty_floor_bits: u8,
    /// Highest proof-of-work difficulty.
    pub difficulty_ceiling_bits: u8,
    /// Under attack (the work a flooding network would need is past the
    /// ceiling), challenges carry this minimum solve age instead of more
    /// work: a wall-clock floor no GPU compresses. `"0s"` turns it off.
    #[serde(with = "humantime_serde")]
    pub attack_min_solve: Duration,
    /// How long a challenge may be solved and redeemed.
    #[serde(with = "humantime_serde")]
    pub challenge_ttl: Duration,
    /// Lifetime of a queue token (a place in line).
    #[serde(with = "humantime_serde")]
    pub queue_token_ttl: Duration,
    /// When the room opens (RFC 3339, e.g. `"2026-12-01T10:00:00Z"`). Until
    /// then visitors join a pre-queue and nobody is admitted; at the opening
    /// they are ordered by a verifiable random draw (README, "Scheduled
    /// opening and the pre-queue draw"). Applied when the room is first
    /// created in the store; later changes go through the admin API.
    pub opens_at: Option<String>,
    /// How the line is ordered: `"fifo"` (the default: first come, first
    /// served, a lone visitor passes straight through), `"random"` (the
    /// visitors waiting at each draw ordered by a verifiable shuffle),
    /// `"queue_all"` (FIFO, nobody passes straight through) or `"reject"`
    /// (nobody waits: a full room answers 503 `room_full` at once). README,
    /// "Queueing methods". Like `opens_at`, applied when the room is first
    /// created in the store; later changes go through the admin API.
    pub method: sluice_admission::QueueMethod,
    /// Priority lanes (README, "Priority lanes"): `[{ id = "presale",
    /// weight = 70 }, { id = "public", weight = 30 }]`. A join goes to the
    /// lane its enqueue token names, else the last (the default). Empty:
    /// one line, as without lanes. Applied when the room is first created
    /// in the store, like `method`.
    pub lanes: Vec<sluice_admission::lanes::Lane>,
    /// How lanes share the rate: `"weighted"` (the default) or `"strict"`
    /// (the first lane first).
    pub lane_mode: sluice_admission::lanes::LaneMode,
    /// The waiting page's look (`[rooms.page]`): brand name, accent
    /// colour, an operator's template directory (see `docs/waiting-page.md`).
    pub page: crate::visitor::template::PageConfig,
    /// Adaptive admission (`[rooms.adaptive]`): the rate steered by the
    /// origin's latency and errors. Off by default.
    pub adaptive: crate::config::adaptive::AdaptiveConfig,
}

impl RoomConfig {
    /// The admission settings the room starts its store with (`Room::new`),
    /// checked by [`RoomConfig::validate`] with the admission crate's own
    /// `RoomSettings::validate`, so a room the store would refuse is
    /// refused by `check-config` and at start, with the same words.
    pub fn settings(&self) -> RoomSettings {
        let mut s = RoomSettings {
            burst: self.burst.max(1.0),
            ..self.configured_settings()
        };
        s.recalibrate();
        s
    }

    /// The settings as written, before the burst is clamped and the rate
    /// derived from `capacity_rps`.
    fn configured_settings(&self) -> RoomSettings {
        RoomSettings {
            rate_per_sec: self.rate_per_sec,
            burst: self.burst,
            paused: false,
            closed: false,
            sold_out: false,
            max_active: self.max_active,
            claim_window: self.claim_window,
            session_ttl: self.session_ttl,
            capacity_rps: self.capacity_rps,
            safety_margin: self.safety_margin,
            requests_per_visitor_per_sec: self.requests_per_visitor_per_sec,
            session_length: self.session_length,
            method: self.method,
            // a random room's seed is derived in `Room::new` (it needs the
            // pow secret); this stands in for it in the checks
            prequeue_seed: (self.method == sluice_admission::QueueMethod::Random)
                .then(|| "00".repeat(32)),
            lanes: self.lanes.clone(),
            lane_mode: self.lane_mode,
            lane_keep: self.lane_keep(),
            adaptive: sluice_admission::AdaptiveState {
                enabled: self.adaptive.enabled,
                ..Default::default()
            },
            ..RoomSettings::default()
        }
    }

    /// How long the store keeps a lane's segments and a `random` room's
    /// draws (`RoomSettings::lane_keep`, `None` for a FIFO room without
    /// lanes): as long as a queue token of an admitted seq can be presented. A token lives `queue_token_ttl` from its
    /// signing, and an account's second device is handed one for the
    /// account's place as long as the binding lasts; plus a minute for
    /// clock skew between the gateways and the store.
    fn lane_keep(&self) -> Option<Duration> {
        if self.lanes.is_empty() && self.method != sluice_admission::QueueMethod::Random {
            return None;
        }
        Some(self.token_keep())
    }

    /// How long a queue token of this room may come back after its seq was
    /// handed out ([`RoomConfig::lane_keep`]'s measure).
    pub fn token_keep(&self) -> Duration {
        let e = &self.enqueue;
        let binding = if e.hmac_secret.is_some() || e.jwks_file.is_some() || e.jwks_url.is_some() {
            crate::visitor::enqueue::BINDING
        } else {
            Duration::ZERO
        };
        self.queue_token_ttl + binding + Duration::from_secs(60)
    }

    /// The settings of the room's proof-of-work difficulty policy: what
    /// `Room::new` builds it from and what [`RoomConfig::validate`] checks
    /// with the policy's own `validate`, so a room `serve` would refuse is
    /// refused by `check-config` with the same words.
    pub fn difficulty(&self) -> sluice_pow::DifficultyConfig {
        sluice_pow::DifficultyConfig {
            floor_bits: self.difficulty_floor_bits,
            ceiling_bits: self.difficulty_ceiling_bits,
            default_bits: self.difficulty_floor_bits,
            puzzles: self.puzzles,
            min_solve_under_attack: self.attack_min_solve,
            ..sluice_pow::DifficultyConfig::default()
        }
    }
}

/// What a room does for new visitors when its store cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Hold new visitors (503 `store_unavailable`) until the store is back.
    #[default]
    Closed,
    /// Let new visitors through unmetered.
    Open,
}

impl Default for RoomConfig {
    fn default() -> Self {
        RoomConfig {
            id: "default".to_owned(),
            hosts: Vec::new(),
            case_insensitive_paths: false,
            allow_encoded_slashes: false,
            paths: Vec::new(),
            bypass_paths: vec!["/robots.txt".to_owned(), "/favicon.ico".to_owned()],
            bypass_ips: Vec::new(),
            rate_per_sec: 50.0,
            burst: 50.0,
            capacity_rps: None,
            safety_margin: 0.2,
            requests_per_visitor_per_sec: 1.0,
            max_active: None,
            session_length: None,
            claim_window: Duration::from_secs(60),
            session_ttl: Duration::from_secs(600),
            session_hard_cap: None,
            bind_ip_prefix: false,
            failure_policy: FailurePolicy::Closed,
            waiting_status: 200,
            join_limit_per_prefix_per_min: 60,
            invite_only: false,
            invite_attempts_per_prefix_per_min: 30,
            enqueue: EnqueueConfig::default(),
            puzzles: 16,
            difficulty_floor_bits: 18,
            difficulty_ceiling_bits: 20,
            attack_min_solve: Duration::from_secs(3),
            challenge_ttl: Duration::from_secs(300),
            queue_token_ttl: Duration::from_secs(86_400),
            opens_at: None,
            method: sluice_admission::QueueMethod::Fifo,
            lanes: Vec::new(),
            lane_mode: sluice_admission::lanes::LaneMode::Weighted,
            page: crate::visitor::template::PageConfig::default(),
            adaptive: crate::config::adaptive::AdaptiveConfig::default(),
        }
    }
}

impl RoomConfig {
    /// Checks one room; `field` is where it sits (`rooms[0]`). Whether its
    /// id is unique is [`crate::config::Config::validate`]'s to check.
    pub fn validate(&self, field: &str) -> Result<(), ConfigError> {
        // Stricter than the admission crate's `validate_room_id` (which
        // also takes `.`): the same rule as event ids, kept as it was.
        if !crate::config::valid_id(&self.id) {
            return Err(ConfigError::invalid(
                format!("{field}.id"),
                "must match [A-Za-z0-9_-]{1,64}",
            ));
        }
        self.validate_rules(field)?;
        // The admission crate's own check (the one the store makes before
        // it keeps a room's settings): on the settings as written, so a
        // rate below zero or a burst below 1 is refused even where
        // `capacity_rps` or the clamp in `settings` would replace it, and
        // on the settings the store will be given. Its field names are the
        // room's keys (`rate_per_sec`, `claim_window`, `session_ttl`…).
        for settings in [self.configured_settings(), self.settings()] {
            settings
                .validate()
                .map_err(|e| ConfigError::invalid(format!("{field}.{}", e.field), e.reason))?;
        }
        if let Some(t) = &self.opens_at
            && let Err(e) = crate::gate::schedule::parse_rfc3339_ms(t)
        {
            return Err(ConfigError::invalid(format!("{field}.opens_at"), e));
        }
        if self.opens_at.is_some() && self.method == sluice_admission::QueueMethod::Reject {
            return Err(ConfigError::invalid(
                format!("{field}.method"),
                "a scheduled room lines up its early arrivals: reject cannot be scheduled",
            ));
        }
        if let Err(e) = self.enqueue.verifier() {
            return Err(ConfigError::invalid(format!("{field}.enqueue"), e));
        }
        if !matches!(self.waiting_status, 200 | 202 | 429 | 503) {
            return Err(ConfigError::invalid(
                format!("{field}.waiting_status"),
                "must be 200, 202, 429 or 503",
            ));
        }
        // The difficulty policy's own check, on the settings the room
        // will build it from (`Room::new`): puzzles, floor ≤ ceiling,
        // and the work cap (`puzzles × 2^ceiling ≤ 2^24`).
        self.difficulty().validate().map_err(|e| {
            use sluice_pow::DifficultyConfigError as E;
            let name = match e {
                E::Puzzles(_) => format!("{field}.puzzles"),
                E::Order { .. } | E::OverCap { .. } => {
                    format!("{field}.difficulty_ceiling_bits")
                }
                // Settings a room does not expose (their defaults pass).
                _ => field.to_owned(),
            };
            ConfigError::invalid(name, e.to_string())
        })?;
        self.challenge_spec().validate().map_err(|e| {
            use sluice_pow::SpecError as E;
            let name = match e {
                E::Ttl => format!("{field}.challenge_ttl"),
                E::MinSolve => format!("{field}.attack_min_solve"),
                E::Puzzles(_) => format!("{field}.puzzles"),
                E::Bits(_) => format!("{field}.difficulty_ceiling_bits"),
                _ => field.to_owned(),
            };
            ConfigError::invalid(name, e.to_string())
        })?;
        self.page.validate(&format!("{field}.page"))?;
        self.adaptive.validate(&format!("{field}.adaptive"))
    }

    /// The hardest challenge the room can issue (its ceiling, under attack):
    /// what [`RoomConfig::validate`] hands to the challenge format's own
    /// check, so a TTL the format cannot carry, or a minimum solve age not
    /// shorter than the TTL (no join could ever be in time), is refused
    /// before a visitor meets it.
    fn challenge_spec(&self) -> sluice_pow::ChallengeSpec {
        sluice_pow::ChallengeSpec {
            room: self.id.clone(),
            puzzles: self.puzzles,
            difficulty_bits: self.difficulty_ceiling_bits,
            ttl: self.challenge_ttl,
            min_solve: self.attack_min_solve,
        }
    }

    /// The routing rules: paths that start with `/`, normalise, and stay
    /// out of `/_sluice/`; host names that normalise.
    fn validate_rules(&self, field: &str) -> Result<(), ConfigError> {
        for (name, list) in [("paths", &self.paths), ("bypass_paths", &self.bypass_paths)] {
            for p in list {
                if !p.starts_with('/') {
                    return Err(ConfigError::invalid(
                        format!("{field}.{name}"),
                        format!("`{p}` must start with /"),
                    ));
                }
                // A rule is matched in its canonical form, so one that
                // cannot be normalised could never match as written.
                let canonical = crate::edge::canonical::normalize_rule(p).map_err(|e| {
                    ConfigError::invalid(format!("{field}.{name}"), format!("`{p}`: {e}"))
                })?;
                if canonical == "/_sluice" || canonical.starts_with("/_sluice/") {
                    return Err(ConfigError::invalid(
                        format!("{field}.{name}"),
                        "/_sluice/ is reserved for the gateway",
                    ));
                }
            }
        }
        for h in &self.hosts {
            crate::edge::canonical::normalize_host(h).map_err(|e| {
                ConfigError::invalid(format!("{field}.hosts"), format!("`{h}`: {e}"))
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;
    use crate::config::Config;

    /// The admission crate's own check of a room's settings: what the store
    /// would refuse when the room is first written, `validate` refuses
    /// with its words, naming the room's key.
    #[test]
    fn room_settings_are_checked_by_the_admission_crate_itself() {
        let bad = |f: fn(&mut RoomConfig)| {
            let mut r = RoomConfig::default();
            f(&mut r);
            let store = r.settings().validate().err();
            let c = Config {
                rooms: vec![r],
                ..Config::default()
            };
            (c.validate().unwrap_err().to_string(), store)
        };
        for (f, field) in [
            (
                (|r: &mut RoomConfig| r.rate_per_sec = -1.0) as fn(&mut RoomConfig),
                "rooms[0].rate_per_sec",
            ),
            // refused as written, though `capacity_rps` replaces the rate
            (
                |r| {
                    r.rate_per_sec = -1.0;
                    r.capacity_rps = Some(100.0);
                },
                "rooms[0].rate_per_sec",
            ),
            (|r| r.burst = 0.5, "rooms[0].burst"),
            (|r| r.burst = f64::NAN, "rooms[0].burst"),
            (|r| r.session_ttl = Duration::ZERO, "rooms[0].session_ttl"),
            (|r| r.claim_window = Duration::ZERO, "rooms[0].claim_window"),
            (|r| r.capacity_rps = Some(0.0), "rooms[0].capacity_rps"),
            (|r| r.safety_margin = 1.0, "rooms[0].safety_margin"),
            (|r| r.max_active = Some(0), "rooms[0].max_active"),
            (
                |r| r.requests_per_visitor_per_sec = 0.0,
                "rooms[0].requests_per_visitor_per_sec",
            ),
            (
                |r| {
                    r.lanes = vec![sluice_admission::lanes::Lane {
                        id: "presale".into(),
                        weight: 0,
                    }]
                },
                "rooms[0].lanes",
            ),
            (
                |r| {
                    r.lanes = vec![
                        sluice_admission::lanes::Lane {
                            id: "a".into(),
                            weight: 1,
                        };
                        2
                    ]
                },
                "rooms[0].lanes",
            ),
            (
                |r| {
                    r.method = sluice_admission::QueueMethod::Reject;
                    r.lanes = vec![sluice_admission::lanes::Lane {
                        id: "a".into(),
                        weight: 1,
                    }]
                },
                "rooms[0].lanes",
            ),
        ] {
            let (err, store) = bad(f);
            assert!(err.contains(&format!("`{field}`")), "{field}: {err}");
            if let Some(store) = store {
                assert!(err.ends_with(&store.reason), "{err} / {store}");
            }
        }
        RoomConfig::default().settings().validate().unwrap();
    }

    /// `[rooms.enqueue] jwks_url`: https only, no user info, sane timings,
    /// `jwks_ca` only with it; a room trusting only the URL may require
    /// tokens.
    #[test]
    fn enqueue_jwks_urls_are_checked() {
        let with = |f: fn(&mut EnqueueConfig)| {
            let mut e = EnqueueConfig::default();
            f(&mut e);
            e.verifier().map(|v| v.is_some())
        };
        assert_eq!(
            with(|e| {
                e.required = true;
                e.jwks_url = Some("https://shop.example/.well-known/jwks.json".into());
                e.sign_in_url = Some("https://shop.example/login?next=/drop".into());
            }),
            Ok(true)
        );
        assert_eq!(
            with(|e| {
                e.hmac_secret = Some("x".repeat(32));
                e.sign_in_url = Some("/account/login".into());
            }),
            Ok(true)
        );
        for (f, words) in [
            (
                (|e: &mut EnqueueConfig| e.jwks_url = Some("http://shop.example/jwks".into()))
                    as fn(&mut EnqueueConfig),
                "https",
            ),
            (
                |e| e.jwks_url = Some("https://user:pw@shop.example/jwks".into()),
                "user info",
            ),
            (|e| e.jwks_url = Some("jwks.json".into()), "https"),
            (|e| e.jwks_ca = Some("/etc/ca.pem".into()), "needs jwks_url"),
            (
                |e| {
                    e.hmac_secret = Some("x".repeat(32));
                    e.sign_in_url = Some("javascript:alert(1)".into());
                },
                "sign_in_url",
            ),
            (
                |e| {
                    e.hmac_secret = Some("x".repeat(32));
                    e.sign_in_url = Some("//evil.example/login".into());
                },
                "sign_in_url",
            ),
            (
                |e| {
                    e.jwks_url = Some("https://shop.example/jwks".into());
                    e.jwks_retry = Duration::ZERO;
                },
                "jwks_retry",
            ),
            (
                |e| {
                    e.jwks_url = Some("https://shop.example/jwks".into());
                    e.jwks_ca = Some("/nonexistent/ca.pem".into());
                },
                "jwks_ca",
            ),
        ] {
            let err = with(f).unwrap_err();
            assert!(err.contains(words), "{words}: {err}");
        }
    }

    /// The challenge format's own check: a TTL it cannot carry, or a
    /// minimum solve age under attack not shorter than the TTL (every join
    /// would come too early or too late), is refused with its words.
    #[test]
    fn room_challenges_are_checked_by_the_format_itself() {
        let ms = Duration::from_millis;
        for (ttl, min_solve, field) in [
            (Duration::ZERO, Duration::ZERO, "rooms[0].challenge_ttl"),
            (ms(u64::from(u32::MAX) + 1), ms(1), "rooms[0].challenge_ttl"),
            (ms(3_000), ms(3_000), "rooms[0].attack_min_solve"),
            (ms(3_000), ms(10_000), "rooms[0].attack_min_solve"),
        ] {
            let r = RoomConfig {
                challenge_ttl: ttl,
                attack_min_solve: min_solve,
                ..RoomConfig::default()
            };
            let format = r.challenge_spec().validate().unwrap_err();
            let c = Config {
                rooms: vec![r],
                ..Config::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(&format!("`{field}`")), "{err}");
            assert!(err.ends_with(&format.to_string()), "{err} / {format}");
        }
        let ok = RoomConfig {
            challenge_ttl: ms(3_001),
            attack_min_solve: ms(3_000),
            ..RoomConfig::default()
        };
        Config {
            rooms: vec![ok],
            ..Config::default()
        }
        .validate()
        .unwrap();
    }

    /// The difficulty policy's own check: what `Room::new` (so `serve`)
    /// refuses, `validate` (so `check-config`) refuses with its words.
    #[test]
    fn room_difficulty_is_checked_by_the_policy_itself() {
        let room = |puzzles: u8, floor: u8, ceiling: u8| RoomConfig {
            puzzles,
            difficulty_floor_bits: floor,
            difficulty_ceiling_bits: ceiling,
            ..RoomConfig::default()
        };
        for (r, field, words) in [
            // 16 × 2^21 = 2^25 hashes, past the 2^24 cap.
            (
                room(16, 18, 21),
                "rooms[0].difficulty_ceiling_bits",
                "max ceiling 20",
            ),
            (
                room(1, 18, 25),
                "rooms[0].difficulty_ceiling_bits",
                "max ceiling 24",
            ),
            (
                room(16, 19, 18),
                "rooms[0].difficulty_ceiling_bits",
                "floor_bits",
            ),
            (room(0, 18, 20), "rooms[0].puzzles", "puzzles"),
            (room(65, 1, 2), "rooms[0].puzzles", "puzzles"),
        ] {
            let policy = sluice_pow::DifficultyPolicy::new(r.difficulty()).unwrap_err();
            let c = Config {
                rooms: vec![r],
                ..Config::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(field) && err.contains(words), "{err}");
            assert!(err.ends_with(&policy.to_string()), "{err} / {policy}");
        }
        for ok in [room(16, 18, 20), room(1, 24, 24), room(64, 1, 18)] {
            sluice_pow::DifficultyPolicy::new(ok.difficulty()).unwrap();
            Config {
                rooms: vec![ok],
                ..Config::default()
            }
            .validate()
            .unwrap();
        }
    }
}

/// `[rooms.enqueue]`: enqueue tokens the origin signs for its logged-in
/// visitors (API.md wave 2, "Enqueue tokens").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EnqueueConfig {
    /// A join must carry a valid enqueue token (403
    /// `enqueue_token_required` without one).
    pub required: bool,
    /// HS256 secret shared with the origin (at least 32 bytes).
    pub hmac_secret: Option<String>,
    /// The origin's JWKS (Ed25519 keys, each with a `kid`), read at start.
    pub jwks_file: Option<std::path::PathBuf>,
    /// The origin's JWKS fetched over HTTPS (`https://…`), refreshed
    /// every `jwks_ttl` and early when a token names a key it lacks (a
    /// rotation), at most once per `jwks_retry`; keys of other types in it
    /// are skipped.
    pub jwks_url: Option<String>,
    /// CA certificates (PEM) trusted for `jwks_url`, instead of the
    /// system's roots.
    pub jwks_ca: Option<std::path::PathBuf>,
    /// How long a fetched JWKS is used before it is fetched again (a
    /// shorter `Cache-Control: max-age` of the origin's wins, down to 1m).
    #[serde(with = "humantime_serde")]
    pub jwks_ttl: Duration,
    /// Least time between two early fetches, or after a failed one.
    #[serde(with = "humantime_serde")]
    pub jwks_retry: Duration,
    /// Longest a token may live (`exp` at most this far ahead).
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    /// Where the waiting page sends a fan who must sign in first (the
    /// shop's sign-in page, which hands a token back in the fragment): an
    /// `https://` URL or a path of this site. Without it the page links
    /// back to the page the fan asked for.
    pub sign_in_url: Option<String>,
}

impl Default for EnqueueConfig {
    fn default() -> Self {
        Self {
            required: false,
            hmac_secret: None,
            jwks_file: None,
            jwks_url: None,
            jwks_ca: None,
            jwks_ttl: Duration::from_secs(600),
            jwks_retry: Duration::from_secs(30),
            max_ttl: Duration::from_secs(600),
            sign_in_url: None,
        }
    }
}

impl EnqueueConfig {
    /// The verifier of the room's enqueue tokens; `None` when the room
    /// trusts no key (tokens are then ignored, and `required` refused).
    pub fn verifier(&self) -> Result<Option<sluice_admission::enqueue::EnqueueVerifier>, String> {
        if self.jwks_ca.is_some() && self.jwks_url.is_none() {
            return Err("jwks_ca needs jwks_url".into());
        }
        if let Some(url) = &self.sign_in_url {
            check_sign_in_url(url)?;
        }
        if self.hmac_secret.is_none() && self.jwks_file.is_none() && self.jwks_url.is_none() {
            if self.required {
                return Err("required needs hmac_secret, jwks_file or jwks_url".into());
            }
            return Ok(None);
        }
        let jwks = match &self.jwks_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("jwks_file {}: {e}", p.display()))?,
            ),
            None => None,
        };
        if let Some(url) = &self.jwks_url {
            check_jwks_url(url)?;
            if !(1.0..=7.0 * 86_400.0).contains(&self.jwks_ttl.as_secs_f64()) {
                return Err("jwks_ttl must be between 1s and 7 days".into());
            }
            if !(1.0..=3_600.0).contains(&self.jwks_retry.as_secs_f64()) {
                return Err("jwks_retry must be between 1s and 1h".into());
            }
            if let Some(ca) = &self.jwks_ca {
                crate::proxy::tls::load_ca_bundle(ca).map_err(|e| format!("jwks_ca: {e}"))?;
            }
        }
        sluice_admission::enqueue::EnqueueVerifier::new(
            self.hmac_secret.as_deref().map(str::as_bytes),
            jwks.as_deref(),
            self.jwks_url.is_some(),
            self.max_ttl,
        )
        .map(Some)
    }
}

/// A `sign_in_url` is an `https://` URL or a path of this site (`/…`,
/// not `//…`), at most 2,048 characters without controls or spaces.
fn check_sign_in_url(url: &str) -> Result<(), String> {
    let shaped = url.len() <= 2048
        && !url.chars().any(|c| c.is_control() || c.is_whitespace())
        && (url.starts_with("https://") || (url.starts_with('/') && !url.starts_with("//")));
    if !shaped {
        return Err(format!(
            "sign_in_url `{url}`: must be an https URL or a path starting with one /"
        ));
    }
    url.parse::<http::Uri>()
        .map(|_| ())
        .map_err(|e| format!("sign_in_url `{url}`: {e}"))
}

/// A `jwks_url` is `https://host[:port]/path`, no user info, no fragment.
fn check_jwks_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("jwks_url `{url}`: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("jwks_url `{url}`: must be an https URL"));
    }
    match uri.authority() {
        Some(a) if !a.host().is_empty() && !a.as_str().contains('@') => Ok(()),
        _ => Err(format!("jwks_url `{url}`: needs a host and no user info")),
    }
}
