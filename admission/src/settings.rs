//! A room's admission settings, the admin patch, and calibration from
//! origin capacity.
//!
//! # Calibration
//!
//! An operator either sets `rate_per_sec` directly, or states the origin's
//! capacity and lets sluice derive the rate:
//!
//! ```text
//! rate_per_sec = capacity_rps × (1 − safety_margin) / requests_per_visitor_per_sec
//! ```
//!
//! (see [`derive_rate`]). Little's law then gives the number of admitted
//! visitors on the site at once when each stays `session_length`:
//!
//! ```text
//! max_active = ceil(rate_per_sec × session_length_seconds)
//! ```
//!
//! (see [`little_max_active`]). An explicit `max_active` always wins; with
//! `session_length` set and no explicit cap, the store enforces the Little
//! cap ([`RoomSettings::effective_max_active`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::lanes::{Lane, LaneMode, validate_lanes};
use crate::prequeue::PrequeueDraw;

/// The highest admission rate accepted (per second). Keeps the store's
/// integer arithmetic (micro-admissions) exact in Lua doubles.
pub const MAX_RATE_PER_SEC: f64 = 1_000_000.0;
/// The largest burst accepted.
pub const MAX_BURST: f64 = 1_000_000.0;

/// The latest opening time accepted (year 9999), in ms.
pub const MAX_OPENS_AT_MS: u64 = 253_402_300_799_000;

/// A setting out of range: `field` names the setting as the admin API spells
/// it (HTTP 422 `invalid_setting`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting {field}: {reason}")]
pub struct InvalidSetting {
    /// The setting, as named in the admin API.
    pub field: &'static str,
    /// Why it was refused, for the operator.
    pub reason: String,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> InvalidSetting {
    InvalidSetting {
        field,
        reason: reason.into(),
    }
}

/// How a room orders its line (`method` in the config and the admin
/// PATCH). The store applies it atomically with the join, so every gateway
/// sharing a store treats a join alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueMethod {
    /// First come, first served; a lone visitor at a room with credit goes
    /// straight through (passthrough). The default.
    #[default]
    Fifo,
    /// Everyone waiting when a draw is made is ordered by a verifiable
    /// shuffle; nobody passes straight through. The room draws again each
    /// time a draw is exhausted ([`crate::prequeue`], "Rolling draws").
    /// Needs a seed (`prequeue_seed`) and no lanes.
    Random,
    /// FIFO without passthrough: every visitor takes a place and is
    /// admitted by the bucket's next advance (a tick), never by the join.
    QueueAll,
    /// Nobody waits: a join is admitted on the spot or refused at once
    /// ([`crate::AdmissionError::Full`], HTTP 503 `room_full`), taking no
    /// place and no seq.
    Reject,
}

impl QueueMethod {
    /// Every method, as the config and the admin API spell them.
    pub const ALL: [QueueMethod; 4] = [
        QueueMethod::Fifo,
        QueueMethod::Random,
        QueueMethod::QueueAll,
        QueueMethod::Reject,
    ];

    /// The name the config and the admin API use.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueMethod::Fifo => "fifo",
            QueueMethod::Random => "random",
            QueueMethod::QueueAll => "queue_all",
            QueueMethod::Reject => "reject",
        }
    }

    /// The method named `s`, or an [`InvalidSetting`] of `method` listing
    /// the names.
    pub fn parse(s: &str) -> Result<QueueMethod, InvalidSetting> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| invalid("method", "must be one of fifo, random, queue_all, reject"))
    }

    /// The store's number for it (the Lua state's `method` field).
    pub fn code(self) -> u8 {
        match self {
            QueueMethod::Fifo => 0,
            QueueMethod::Random => 1,
            QueueMethod::QueueAll => 2,
            QueueMethod::Reject => 3,
        }
    }

    /// Whether a join may be admitted on the spot (passthrough).
    pub fn passes_through(self) -> bool {
        matches!(self, QueueMethod::Fifo | QueueMethod::Reject)
    }

    fn is_fifo(&self) -> bool {
        *self == QueueMethod::Fifo
    }
}

/// The admission settings of one room. Stored with the room's state, so
/// every gateway sharing a store sees the same values within a tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoomSettings {
    /// Admissions per second (the bucket's refill rate). Default 10. When
    /// `capacity_rps` is set this is derived from it (see the module docs).
    pub rate_per_sec: f64,
    /// The most admissions that may be saved up while nobody waits, and so
    /// the most let through at once after a quiet spell. At least 1 (a
    /// smaller bucket could never hold one whole admission). Default 10.
    pub burst: f64,
    /// Paused: joins are taken, nobody is admitted, places are kept. Credit
    /// does not accrue while paused and is capped at `burst`, so resuming
    /// lets at most `burst` through at once, then the steady rate.
    pub paused: bool,
    /// Closed: joins are refused and nobody is admitted. Default false.
    pub closed: bool,
    /// Sold out: every event the room sells has nothing available. Set by
    /// the gateways from the shared inventory (not an admin setting); it
    /// halts admission exactly like `paused` (joins are taken, places kept,
    /// no credit saved), and lifting it when stock comes back resumes at
    /// most `burst` at once, then the steady rate. Default false.
    pub sold_out: bool,
    /// The most admitted visitors at once (active sessions plus admitted
    /// places not yet claimed). `None`: no cap unless `session_length` is
    /// set (then Little's law). Default `None`.
    pub max_active: Option<u64>,
    /// How long an admitted visitor has to claim the place (fetch the
    /// admission token) before the slot is refunded as credit. Default 60 s.
    #[serde(with = "duration_ms")]
    pub claim_window: Duration,
    /// Idle lifetime of an active session: renewed by every request of the
    /// visitor (sliding), ended by expiry or revoke. Default 5 minutes.
    #[serde(with = "duration_ms")]
    pub session_ttl: Duration,
    /// The origin's capacity in requests per second. When set, the rate is
    /// derived from it. Default `None`.
    pub capacity_rps: Option<f64>,
    /// The share of `capacity_rps` kept in reserve, in [0, 1). Default 0.2.
    pub safety_margin: f64,
    /// Requests per second one admitted visitor sends to the origin, for
    /// calibration. Default 1.
    pub requests_per_visitor_per_sec: f64,
    /// How long an admitted visitor stays, for the Little cap. Default `None`.
    #[serde(with = "opt_duration_ms")]
    pub session_length: Option<Duration>,
    /// When a scheduled room opens (store clock, ms since the Unix epoch).
    /// Before it, joins are taken into a pre-queue and nobody is admitted;
    /// at the opening the pre-queue is ordered by a draw with
    /// `prequeue_seed` (see [`crate::prequeue`]). Default `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at_ms: Option<u64>,
    /// The pre-queue seed, 64 hex digits (32 bytes), secret until the
    /// opening; its SHA-256 is public from the start. Set with `opens_at_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequeue_seed: Option<String>,
    /// The draw as a gateway last saw it. Only a hint for a store that lost
    /// its state ([`crate::QueueStore::recover`]): a store whose pre-queue
    /// is still open adopts it; a store that made its own draw keeps that.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequeue_draw: Option<PrequeueDraw>,
    /// Adaptive admission's shared state (the gateway steers the rate from
    /// the origin's latency and errors). Default: off.
    pub adaptive: AdaptiveState,
    /// The lowest proof-of-work difficulty, in leading zero bits, set live
    /// by the admin API (`difficulty_floor_bits`). `None`: the gateway's
    /// configuration. Checked against the work cap by the gateway, which
    /// owns the difficulty policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difficulty_floor_bits: Option<u8>,
    /// The highest difficulty before the room counts as under attack
    /// (`difficulty_ceiling_bits`). `None`: the configuration's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difficulty_ceiling_bits: Option<u8>,
    /// Challenges and joins allowed per client network per minute
    /// (`join_limit_per_prefix_per_min`; 0 turns the limit off). `None`: the
    /// configuration's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join_limit_per_prefix_per_min: Option<u32>,
    /// How the line is ordered ([`QueueMethod`]). Left out of the stored
    /// JSON while FIFO, so a gateway of an older version reads the settings
    /// of a FIFO room as before.
    #[serde(skip_serializing_if = "QueueMethod::is_fifo")]
    pub method: QueueMethod,
    /// Priority lanes ([`crate::lanes`]): empty (the default) is one line,
    /// and is left out of the stored JSON, so such a room's settings read
    /// exactly as before.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<Lane>,
    /// How lanes share the rate (left out while weighted).
    #[serde(skip_serializing_if = "LaneMode::is_weighted")]
    pub lane_mode: LaneMode,
    /// How long a lane's segments (lane seq → place) are kept once those
    /// seqs were admitted: at least as long as a queue token of them can be
    /// presented ([`crate::lanes`], "Forgetting"). `None` (left out of the
    /// stored JSON): kept for the room's life.
    #[serde(with = "opt_duration_ms", skip_serializing_if = "Option::is_none")]
    pub lane_keep: Option<Duration>,
    /// Bumped by the store at every write of these settings: a write names
    /// the version it read, and is refused when another write came first
    /// ([`crate::QueueStore::update_settings`]), so two writers never
    /// revert each other.
    pub version: u64,
}

/// The largest settings document a store keeps (its JSON, in bytes). A
/// write above it is refused and a read above it is ignored (the last good
/// copy stays in force): a pushed document past a hard limit must never
/// meet code that assumed it could not happen.
pub const MAX_SETTINGS_BYTES: usize = 16 * 1024;

/// The longest adaptive `mode` or `reason` text kept.
pub const MAX_REASON_LEN: usize = 256;

/// Adaptive admission's state, kept with the room's settings so that every
/// gateway sharing the store sees it within a tick: whether it steers the
/// room (switched live by the admin API), until when an operator's manual
/// rate overrides it, and the steering gateway's last decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdaptiveState {
    /// The gateways steer the rate. While on and `capacity_rps` is set, the
    /// capacity-derived rate is a ceiling, not the rate itself.
    pub enabled: bool,
    /// An operator's manual rate stands until then (store clock, ms since
    /// the epoch; 0: no override).
    pub override_until_ms: u64,
    /// The last decision: `increasing`, `decreasing`, `holding`,
    /// `overridden` or `off` (empty before the first).
    pub mode: String,
    /// Why, in words (`p99 812 ms > 500 ms`).
    pub reason: String,
    /// The origin's p99 latency in the last window, ms (`None`: too few
    /// requests to tell).
    pub p99_ms: Option<f64>,
    /// The share of the last window's upstream requests that failed (5xx,
    /// unreachable, timeout).
    pub error_ratio: Option<f64>,
    /// When the decision was taken (store clock, ms).
    pub decided_at_ms: u64,
}

impl Default for RoomSettings {
    fn default() -> Self {
        Self {
            rate_per_sec: 10.0,
            burst: 10.0,
            paused: false,
            closed: false,
            sold_out: false,
            max_active: None,
            claim_window: Duration::from_secs(60),
            session_ttl: Duration::from_secs(300),
            capacity_rps: None,
            safety_margin: 0.2,
            requests_per_visitor_per_sec: 1.0,
            session_length: None,
            opens_at_ms: None,
            prequeue_seed: None,
            prequeue_draw: None,
            adaptive: AdaptiveState::default(),
            difficulty_floor_bits: None,
            difficulty_ceiling_bits: None,
            join_limit_per_prefix_per_min: None,
            method: QueueMethod::Fifo,
            lanes: Vec::new(),
            lane_mode: LaneMode::Weighted,
            lane_keep: None,
            version: 0,
        }
    }
}

/// The admission rate that keeps the origin under its capacity:
/// `capacity_rps × (1 − safety_margin) / requests_per_visitor_per_sec`.
///
/// With 1,000 requests/s of capacity, a 20% margin and 4 requests per
/// second per visitor, 200 visitors/s are admitted.
pub fn derive_rate(
    capacity_rps: f64,
    safety_margin: f64,
    requests_per_visitor_per_sec: f64,
) -> f64 {
    if requests_per_visitor_per_sec <= 0.0 {
        return 0.0;
    }
    (capacity_rps * (1.0 - safety_margin) / requests_per_visitor_per_sec).max(0.0)
}

/// Little's law: visitors on the site at once when `rate` arrive per second
/// and each stays `session_length`: `ceil(rate × session_length_seconds)`,
/// at least 1.
pub fn little_max_active(rate: f64, session_length: Duration) -> u64 {
    let v = (rate * session_length.as_secs_f64()).ceil();
    if v.is_finite() && v >= 1.0 {
        v as u64
    } else {
        1
    }
}

impl RoomSettings {
    /// Checks every field; the first bad one is reported.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let finite_in = |field, v: f64, lo: f64, hi: f64| {
            if v.is_finite() && v >= lo && v <= hi {
                Ok(())
            } else {
                Err(invalid(
                    field,
                    format!("must be between {lo} and {hi}, got {v}"),
                ))
            }
        };
        finite_in("rate_per_sec", self.rate_per_sec, 0.0, MAX_RATE_PER_SEC)?;
        finite_in("burst", self.burst, 1.0, MAX_BURST)?;
        if self.max_active == Some(0) {
            return Err(invalid(
                "max_active",
                "must be at least 1 (omit it for no cap)",
            ));
        }
        let cw = self.claim_window;
        if cw < Duration::from_secs(1) || cw > Duration::from_secs(86_400) {
            return Err(invalid("claim_window", "must be between 1 s and 24 h"));
        }
        let st = self.session_ttl;
        if st < Duration::from_secs(1) || st > Duration::from_secs(7 * 86_400) {
            return Err(invalid("session_ttl", "must be between 1 s and 7 days"));
        }
        if let Some(c) = self.capacity_rps
            && !(c.is_finite() && c > 0.0 && c <= 1e9)
        {
            return Err(invalid(
                "capacity_rps",
                format!("must be above 0 and at most 1000000000, got {c}"),
            ));
        }
        if !(self.safety_margin.is_finite() && (0.0..1.0).contains(&self.safety_margin)) {
            return Err(invalid("safety_margin", "must be in [0, 1)"));
        }
        finite_in(
            "requests_per_visitor_per_sec",
            self.requests_per_visitor_per_sec,
            1e-6,
            1e6,
        )?;
        if let Some(c) = self.capacity_rps {
            let r = derive_rate(c, self.safety_margin, self.requests_per_visitor_per_sec);
            if r > MAX_RATE_PER_SEC {
                return Err(invalid("capacity_rps", "derives a rate above 1,000,000/s"));
            }
        }
        if let Some(sl) = self.session_length
            && (sl.is_zero() || sl > Duration::from_secs(86_400))
        {
            return Err(invalid("session_length", "must be between 1 ms and 24 h"));
        }
        if self.opens_at_ms == Some(0) || self.opens_at_ms.is_some_and(|t| t > MAX_OPENS_AT_MS) {
            return Err(invalid(
                "opens_at",
                "must be a time after 1970 and before 10000",
            ));
        }
        if let Some(seed) = &self.prequeue_seed
            && (seed.len() != 64 || crate::prequeue::from_hex(seed).is_none())
        {
            return Err(invalid("prequeue_seed", "must be 64 hex digits"));
        }
        if self.opens_at_ms.is_some() && self.prequeue_seed.is_none() {
            return Err(invalid("prequeue_seed", "a scheduled room needs a seed"));
        }
        if let Some(d) = self.prequeue_draw
            && (d.n > crate::prequeue::MAX_TICKETS || d.from.checked_add(d.n).is_none())
        {
            return Err(invalid("prequeue_draw", "out of range"));
        }
        if self.method == QueueMethod::Random {
            // a lane's places are handed out in its own FIFO order: a draw
            // across lanes would break the order lanes promise
            if !self.lanes.is_empty() {
                return Err(invalid(
                    "method",
                    "random cannot be combined with lanes (each lane is its own FIFO line)",
                ));
            }
            // the draws' seeds derive from the room's seed
            if self.prequeue_seed.is_none() {
                return Err(invalid("prequeue_seed", "a random room needs a seed"));
            }
        }
        if self.method == QueueMethod::Reject && self.opens_at_ms.is_some() {
            return Err(invalid(
                "method",
                "a scheduled room lines up its early arrivals: reject cannot be scheduled",
            ));
        }
        validate_lanes(&self.lanes).map_err(|r| invalid("lanes", r))?;
        if self
            .lane_keep
            .is_some_and(|k| k < Duration::from_secs(1) || k > Duration::from_secs(366 * 86_400))
        {
            return Err(invalid("lane_keep", "between 1 s and 366 days"));
        }
        if !self.lanes.is_empty() {
            if self.opens_at_ms.is_some() || self.prequeue_draw.is_some() {
                return Err(invalid(
                    "lanes",
                    "a scheduled room draws one line: lanes cannot be scheduled",
                ));
            }
            if self.method == QueueMethod::Reject {
                return Err(invalid(
                    "lanes",
                    "a reject room has nobody waiting: lanes need fifo or queue_all",
                ));
            }
        }
        let a = &self.adaptive;
        if a.mode.len() > MAX_REASON_LEN || a.reason.len() > MAX_REASON_LEN {
            return Err(invalid("adaptive", "mode or reason too long"));
        }
        for (field, v) in [
            ("adaptive.p99_ms", a.p99_ms),
            ("adaptive.error_ratio", a.error_ratio),
        ] {
            if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                return Err(invalid(field, "must be a finite number, not negative"));
            }
        }
        if let (Some(f), Some(c)) = (self.difficulty_floor_bits, self.difficulty_ceiling_bits)
            && f > c
        {
            return Err(invalid(
                "difficulty_floor_bits",
                "must not be above difficulty_ceiling_bits",
            ));
        }
        for (field, v) in [
            ("difficulty_floor_bits", self.difficulty_floor_bits),
            ("difficulty_ceiling_bits", self.difficulty_ceiling_bits),
        ] {
            if v.is_some_and(|b| b > 32) {
                return Err(invalid(field, "must be an integer from 0 to 32"));
            }
        }
        if self
            .join_limit_per_prefix_per_min
            .is_some_and(|l| l > 1_000_000)
        {
            return Err(invalid(
                "join_limit_per_prefix_per_min",
                "must be an integer from 0 to 1000000",
            ));
        }
        Ok(())
    }

    /// The settings as the store keeps them (JSON), refused when invalid
    /// or larger than [`MAX_SETTINGS_BYTES`].
    pub fn to_stored(&self) -> Result<String, InvalidSetting> {
        self.validate()?;
        let json = serde_json::to_string(self).map_err(|e| invalid("settings", e.to_string()))?;
        if json.len() > MAX_SETTINGS_BYTES {
            return Err(invalid("settings", "larger than the store keeps"));
        }
        Ok(json)
    }

    /// Settings read back from the store: refused when unparseable, larger
    /// than [`MAX_SETTINGS_BYTES`] or invalid, so a reader keeps its last
    /// good copy (and says so) instead of applying them.
    pub fn from_stored(json: &str) -> Result<RoomSettings, InvalidSetting> {
        if json.len() > MAX_SETTINGS_BYTES {
            return Err(invalid("settings", "larger than the store keeps"));
        }
        let s: RoomSettings =
            serde_json::from_str(json).map_err(|e| invalid("settings", e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// Re-derives `rate_per_sec` from `capacity_rps` when that is set.
    /// While adaptive admission steers the room, the derived rate is only a
    /// ceiling: the steered rate stays when it is below it.
    pub fn recalibrate(&mut self) {
        if let Some(c) = self.capacity_rps {
            let derived = derive_rate(c, self.safety_margin, self.requests_per_visitor_per_sec);
            self.rate_per_sec = if self.adaptive.enabled {
                self.rate_per_sec.min(derived)
            } else {
                derived
            };
        }
    }

    /// The highest rate adaptive admission may set: the capacity-derived
    /// rate when `capacity_rps` is set.
    pub fn capacity_rate(&self) -> Option<f64> {
        self.capacity_rps
            .map(|c| derive_rate(c, self.safety_margin, self.requests_per_visitor_per_sec))
    }

    /// The cap the store enforces: `max_active` if set, else the Little cap
    /// from `session_length` if set, else none.
    pub fn effective_max_active(&self) -> Option<u64> {
        self.max_active.or_else(|| {
            self.session_length
                .map(|sl| little_max_active(self.rate_per_sec, sl))
        })
    }
}

/// A partial update of [`RoomSettings`], as sent to
/// `PATCH /_sluice/admin/rooms/{room}`. Absent fields are left alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoomPatch {
    /// Sets the rate directly and turns capacity calibration off.
    pub rate_per_sec: Option<f64>,
    /// Sets the burst.
    pub burst: Option<f64>,
    /// Pauses or resumes admission.
    pub paused: Option<bool>,
    /// Closes or reopens the room.
    pub closed: Option<bool>,
    /// Sets the cap on admitted visitors at once; `0` removes it.
    pub max_active: Option<u64>,
    /// Sets the origin capacity and re-derives the rate from it.
    pub capacity_rps: Option<f64>,
    /// Sets the safety margin (re-derives the rate when calibrated).
    pub safety_margin: Option<f64>,
    /// Sets requests per visitor per second (re-derives when calibrated).
    pub requests_per_visitor_per_sec: Option<f64>,
    /// Sets the expected session length in seconds, for the Little cap; `0`
    /// removes it.
    pub session_length_secs: Option<f64>,
    /// Sets the claim window in seconds.
    pub claim_window_secs: Option<f64>,
    /// Sets the session idle lifetime in seconds.
    pub session_ttl_secs: Option<f64>,
    /// Sets the queueing method (`fifo`, `random`, `queue_all`, `reject`).
    pub method: Option<String>,
}

impl RoomPatch {
    /// Applies the patch to `settings`, all or nothing: on error `settings`
    /// is unchanged. Giving both `rate_per_sec` and `capacity_rps` is an
    /// error (which one should win?).
    pub fn apply(&self, settings: &mut RoomSettings) -> Result<(), InvalidSetting> {
        if self.rate_per_sec.is_some() && self.capacity_rps.is_some() {
            return Err(invalid(
                "rate_per_sec",
                "give either rate_per_sec or capacity_rps, not both",
            ));
        }
        let secs = |field, v: f64| {
            if v.is_finite() && (0.0..=1e7).contains(&v) {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(invalid(field, "must be a number of seconds"))
            }
        };
        let mut s = settings.clone();
        if let Some(r) = self.rate_per_sec {
            s.rate_per_sec = r;
            s.capacity_rps = None;
        }
        if let Some(b) = self.burst {
            s.burst = b;
        }
        if let Some(p) = self.paused {
            s.paused = p;
        }
        if let Some(c) = self.closed {
            s.closed = c;
        }
        if let Some(m) = self.max_active {
            s.max_active = if m == 0 { None } else { Some(m) };
        }
        if let Some(c) = self.capacity_rps {
            s.capacity_rps = Some(c);
        }
        if let Some(m) = self.safety_margin {
            s.safety_margin = m;
        }
        if let Some(r) = self.requests_per_visitor_per_sec {
            s.requests_per_visitor_per_sec = r;
        }
        if let Some(v) = self.session_length_secs {
            let d = secs("session_length_secs", v)?;
            s.session_length = if d.is_zero() { None } else { Some(d) };
        }
        if let Some(v) = self.claim_window_secs {
            s.claim_window = secs("claim_window_secs", v)?;
        }
        if let Some(v) = self.session_ttl_secs {
            s.session_ttl = secs("session_ttl_secs", v)?;
        }
        if let Some(m) = &self.method {
            s.method = QueueMethod::parse(m)?;
            if s.method == QueueMethod::Random && s.prequeue_seed.is_none() {
                // a fresh secret seed: its commitment is public from now on
                s.prequeue_seed = Some(crate::prequeue::new_seed_hex());
            }
        }
        s.validate()?;
        s.recalibrate();
        s.validate()?;
        *settings = s;
        Ok(())
    }
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

mod opt_duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_are_valid() {
        RoomSettings::default().validate().unwrap();
    }

    #[test]
    fn calibration_formulas() {
        assert!((derive_rate(1000.0, 0.2, 4.0) - 200.0).abs() < 1e-9);
        assert_eq!(little_max_active(200.0, Duration::from_secs(90)), 18_000);
        assert_eq!(little_max_active(0.5, Duration::from_secs(3)), 2);
        assert_eq!(little_max_active(0.0, Duration::from_secs(3)), 1);
    }

    #[test]
    fn patch_capacity_rederives_rate() {
        let mut s = RoomSettings::default();
        let p = RoomPatch {
            capacity_rps: Some(500.0),
            safety_margin: Some(0.1),
            requests_per_visitor_per_sec: Some(3.0),
            ..Default::default()
        };
        p.apply(&mut s).unwrap();
        assert!((s.rate_per_sec - 150.0).abs() < 1e-9);
        // a later margin change re-derives again
        RoomPatch {
            safety_margin: Some(0.4),
            ..Default::default()
        }
        .apply(&mut s)
        .unwrap();
        assert!((s.rate_per_sec - 100.0).abs() < 1e-9);
        // setting the rate directly turns calibration off
        RoomPatch {
            rate_per_sec: Some(7.0),
            ..Default::default()
        }
        .apply(&mut s)
        .unwrap();
        assert_eq!(s.capacity_rps, None);
        assert_eq!(s.rate_per_sec, 7.0);
    }

    #[test]
    fn patch_is_all_or_nothing() {
        let mut s = RoomSettings::default();
        let before = s.clone();
        let err = RoomPatch {
            burst: Some(0.5),
            paused: Some(true),
            ..Default::default()
        }
        .apply(&mut s)
        .unwrap_err();
        assert_eq!(err.field, "burst");
        assert_eq!(s, before);
        let err = RoomPatch {
            rate_per_sec: Some(1.0),
            capacity_rps: Some(1.0),
            ..Default::default()
        }
        .apply(&mut s)
        .unwrap_err();
        assert_eq!(err.field, "rate_per_sec");
        for bad in [f64::NAN, -1.0, 2e6] {
            assert!(
                RoomPatch {
                    rate_per_sec: Some(bad),
                    ..Default::default()
                }
                .apply(&mut s)
                .is_err()
            );
        }
        assert!(
            RoomPatch {
                safety_margin: Some(1.0),
                ..Default::default()
            }
            .apply(&mut s)
            .is_err()
        );
    }

    #[test]
    fn little_cap_is_effective_unless_explicit() {
        let mut s = RoomSettings {
            rate_per_sec: 20.0,
            session_length: Some(Duration::from_secs(30)),
            ..Default::default()
        };
        assert_eq!(s.effective_max_active(), Some(600));
        s.max_active = Some(50);
        assert_eq!(s.effective_max_active(), Some(50));
        RoomPatch {
            max_active: Some(0),
            ..Default::default()
        }
        .apply(&mut s)
        .unwrap();
        assert_eq!(s.effective_max_active(), Some(600));
    }

    #[test]
    fn method_names_patch_and_json() {
        for m in QueueMethod::ALL {
            assert_eq!(QueueMethod::parse(m.as_str()), Ok(m));
            let s = RoomSettings {
                method: m,
                prequeue_seed: (m == QueueMethod::Random).then(|| "00".repeat(32)),
                ..Default::default()
            };
            s.validate().unwrap();
            let j = s.to_stored().unwrap();
            assert_eq!(j.contains("\"method\""), m != QueueMethod::Fifo);
            assert_eq!(RoomSettings::from_stored(&j).unwrap(), s);
        }
        let mut s = RoomSettings::default();
        for bad in ["FIFO", "", "lottery", "queue-all", "fifo "] {
            let err = RoomPatch {
                method: Some(bad.into()),
                ..Default::default()
            }
            .apply(&mut s)
            .unwrap_err();
            assert_eq!(err.field, "method");
        }
        assert_eq!(s.method, QueueMethod::Fifo);
        RoomPatch {
            method: Some("queue_all".into()),
            ..Default::default()
        }
        .apply(&mut s)
        .unwrap();
        assert_eq!(s.method, QueueMethod::QueueAll);
        // random takes a fresh seed when the room has none, and keeps one
        let mut r = s.clone();
        RoomPatch {
            method: Some("random".into()),
            ..Default::default()
        }
        .apply(&mut r)
        .unwrap();
        assert_eq!(r.method, QueueMethod::Random);
        let seed = r.prequeue_seed.clone().unwrap();
        assert_eq!(seed.len(), 64);
        RoomPatch {
            method: Some("random".into()),
            ..Default::default()
        }
        .apply(&mut r)
        .unwrap();
        assert_eq!(r.prequeue_seed, Some(seed));
        // random with lanes is refused, and changes nothing
        let mut laned = RoomSettings {
            lanes: ["a", "b"]
                .map(|id| crate::lanes::Lane {
                    id: id.into(),
                    weight: 1,
                })
                .to_vec(),
            ..Default::default()
        };
        let before = laned.clone();
        let err = RoomPatch {
            method: Some("random".into()),
            ..Default::default()
        }
        .apply(&mut laned)
        .unwrap_err();
        assert_eq!(err.field, "method");
        assert_eq!(laned, before);
        // a JSON value of another type is refused by the settings' parser
        assert!(RoomSettings::from_stored(r#"{"method":3}"#).is_err());
        // reject takes nobody in line: it cannot hold a pre-queue
        let s = RoomSettings {
            method: QueueMethod::Reject,
            opens_at_ms: Some(1),
            prequeue_seed: Some("00".repeat(32)),
            ..Default::default()
        };
        assert_eq!(s.validate().unwrap_err().field, "method");
    }

    #[test]
    fn settings_roundtrip_json() {
        let s = RoomSettings {
            session_length: Some(Duration::from_millis(1500)),
            capacity_rps: Some(100.0),
            ..Default::default()
        };
        let j = serde_json::to_string(&s).unwrap();
        let back: RoomSettings = serde_json::from_str(&j).unwrap();
        assert_eq!(s, back);
    }
}
