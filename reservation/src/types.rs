//! Identifiers, settings and outcomes shared by both stores.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use serde::Serialize;

/// Longest event id, in bytes.
pub const MAX_EVENT_ID_LEN: usize = 64;
/// Most shards one event may be split into ([`crate::sharded`]).
pub const MAX_SHARDS: u32 = 64;
/// Separates an event id from its shard number in a shard's id (`hot~3`).
pub const SHARD_SEP: char = '~';
/// Characters of the random part of a hold id (128 bits in unpadded base64url).
pub const HOLD_SUFFIX_LEN: usize = 22;

fn is_id_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

// === EventId ===

/// An event (one thing on sale, with its own stock): `[A-Za-z0-9_-]{1,64}`.
///
/// The id becomes the Redis hash tag of every key of the event, which is why
/// braces, colons and dots are refused.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct EventId(String);

impl EventId {
    /// Validates an event id; `None` when it is empty, longer than 64 bytes
    /// or holds a character outside `[A-Za-z0-9_-]`.
    pub fn parse(s: &str) -> Option<Self> {
        if let Some((base, k)) = s.split_once(SHARD_SEP) {
            // A shard of a sharded event: `{base}~{k}`, k in 1..MAX_SHARDS
            // in canonical decimal (shard 0 is the event itself).
            let k_ok = !k.starts_with('0')
                && k.bytes().all(|b| b.is_ascii_digit())
                && k.parse::<u32>().is_ok_and(|k| (1..MAX_SHARDS).contains(&k));
            return (k_ok && Self::parse(base).is_some()).then(|| Self(s.to_owned()));
        }
        if s.is_empty() || s.len() > MAX_EVENT_ID_LEN || !s.bytes().all(is_id_char) {
            return None;
        }
        Some(Self(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Shard `k` of this event: the event itself for 0, else
    /// `{event}~{k}` (its own hash tag, so a Redis Cluster puts it in a
    /// slot of its own). Called on a shard, shards of its event.
    pub fn shard(&self, k: u32) -> EventId {
        let base = self.base();
        if k == 0 {
            base
        } else {
            Self(format!("{}{SHARD_SEP}{k}", base.0))
        }
    }

    /// `(event, k)` when this id is shard `k ≥ 1` of `event`.
    pub fn shard_of(&self) -> Option<(EventId, u32)> {
        let (base, k) = self.0.split_once(SHARD_SEP)?;
        Some((Self(base.to_owned()), k.parse().ok()?))
    }

    /// Whether this id is a shard `k ≥ 1` of a sharded event (never an
    /// event operators or visitors name).
    pub fn is_shard(&self) -> bool {
        self.0.contains(SHARD_SEP)
    }

    /// The event this id belongs to: itself, or the event of a shard.
    pub fn base(&self) -> EventId {
        Self(self.base_str().to_owned())
    }

    /// [`Self::base`] as text, borrowed.
    pub fn base_str(&self) -> &str {
        self.0
            .split_once(SHARD_SEP)
            .map_or(&self.0, |(base, _)| base)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// === HoldId ===

/// A hold: `{event}.{22 base64url characters of 128 random bits}`.
///
/// The event is part of the id so that `GET /_sluice/holds/{hold_id}` and
/// the payment webhook find the event (and its Redis shard) from the id
/// alone; the random part makes ids unguessable.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct HoldId(String);

impl HoldId {
    /// A fresh random hold id of `event`.
    pub fn generate(event: &EventId) -> Self {
        let bytes = rand::random::<u128>().to_le_bytes();
        let suffix = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        Self::from_parts(event, &suffix)
    }

    /// The id of the hold with random part `suffix` in `event`.
    pub(crate) fn from_parts(event: &EventId, suffix: &str) -> Self {
        Self([event.as_str(), ".", suffix].concat())
    }

    /// Validates the shape of a hold id (no store lookup).
    pub fn parse(s: &str) -> Option<Self> {
        let (event, suffix) = s.rsplit_once('.')?;
        EventId::parse(event)?;
        if suffix.len() != HOLD_SUFFIX_LEN || !suffix.bytes().all(is_id_char) {
            return None;
        }
        // 22 base64 characters carry 132 bits: the last one must leave the
        // 4 spare bits zero, as our encoder does. Decoding checks that.
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(suffix)
            .ok()?;
        if decoded.len() != 16 {
            return None;
        }
        Some(Self(s.to_owned()))
    }

    /// The event the hold belongs to.
    pub fn event(&self) -> EventId {
        let (event, _) = self.0.rsplit_once('.').unwrap_or((&self.0, ""));
        EventId(event.to_owned())
    }

    /// The random part (22 characters).
    pub fn suffix(&self) -> &str {
        self.0.rsplit_once('.').map(|(_, s)| s).unwrap_or("")
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HoldId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// === categories ===

/// Longest category id, in bytes.
pub const MAX_CATEGORY_ID_LEN: usize = 32;
/// Most categories per event (each is a handful of fields in the event's
/// settings hash; a hold names at most this many).
pub const MAX_CATEGORIES: usize = 64;

/// A category (tier) of an event: `[A-Za-z0-9_-]{1,32}`. The characters
/// the stores use as separators (`:`, `/`, `=`, `,`) are refused.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct CategoryId(String);

impl CategoryId {
    /// Validates a category id.
    pub fn parse(s: &str) -> Option<Self> {
        if s.is_empty() || s.len() > MAX_CATEGORY_ID_LEN || !s.bytes().all(is_id_char) {
            return None;
        }
        Some(Self(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CategoryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One category of an event as the operator loads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CategorySpec {
    /// The category.
    pub id: CategoryId,
    /// Its units (available + held + confirmed in it).
    pub total: u64,
    /// Most units of it one visitor may hold and buy; `None`: only the
    /// event's cart limit applies.
    pub cart_limit: Option<u32>,
}

/// One category's counters (`EventState::categories`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CategoryState {
    /// The category.
    pub id: CategoryId,
    /// Its units in all.
    pub total: u64,
    /// Units free to hold.
    pub available: u64,
    /// Units in open holds.
    pub held: u64,
    /// Units sold.
    pub confirmed: u64,
    /// Its own cart limit, if any.
    pub cart_limit: Option<u32>,
}

/// One line of a multi-category hold: `qty` units of `category`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Item {
    /// The category.
    pub category: CategoryId,
    /// Units.
    pub qty: u32,
}

/// Items as the stores write them (in the deadline index member, the hold
/// record and the stream's `items` field): `cat=qty` joined by `/`.
pub fn items_text(items: &[Item]) -> String {
    let parts: Vec<String> = items
        .iter()
        .map(|i| format!("{}={}", i.category, i.qty))
        .collect();
    parts.join("/")
}

/// Parses [`items_text`]'s format (empty text: no items); `None` when
/// malformed.
pub fn parse_items(text: &str) -> Option<Vec<Item>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split('/')
        .map(|part| {
            let (c, q) = part.split_once('=')?;
            Some(Item {
                category: CategoryId::parse(c)?,
                qty: q.parse().ok()?,
            })
        })
        .collect()
}

/// Why a category list would be refused by `set_stock`, if it would.
pub fn categories_problem(categories: &[CategorySpec]) -> Option<&'static str> {
    if categories.len() > MAX_CATEGORIES {
        return Some("more than 64 categories");
    }
    let mut seen = std::collections::HashSet::new();
    let mut sum: u64 = 0;
    for c in categories {
        if !seen.insert(c.id.as_str()) {
            return Some("a category is listed twice");
        }
        if c.cart_limit == Some(0) {
            return Some("a category's cart_limit must be at least 1");
        }
        sum = sum.saturating_add(c.total);
    }
    if sum > crate::MAX_TOTAL {
        Some("categories' totals above 2^53")
    } else {
        None
    }
}

/// Why an item list is refused before any store sees it: the first
/// category listed twice.
pub fn duplicate_category(items: &[Item]) -> Option<&CategoryId> {
    let mut seen = std::collections::HashSet::new();
    items.iter().map(|i| &i.category).find(|c| !seen.insert(*c))
}

// === StockSpec ===

/// What the operator loads with `PUT /_sluice/admin/events/{event}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StockSpec {
    /// Units on sale in all (available + held + confirmed).
    pub total: u64,
    /// Most units one visitor may hold and buy (held + confirmed), ≥ 1.
    pub cart_limit: u32,
    /// How long a hold lasts before its stock goes back. Kept to the
    /// millisecond (the HTTP API speaks whole seconds).
    pub hold_ttl: Duration,
    /// Monotonic version of this stock sync: a version not above the stored
    /// one is refused.
    pub version: u64,
    /// The room whose admitted visitors may buy.
    pub room: String,
}

impl StockSpec {
    /// Why the stores would refuse this spec ([`SetStockOutcome::Invalid`]),
    /// if they would: the check `set_stock` makes, for callers that want
    /// to refuse earlier (the gateway's config validation).
    pub fn problem(&self) -> Option<&'static str> {
        crate::spec_problem(self)
    }

    /// The hold TTL in whole milliseconds (at least 1).
    pub(crate) fn hold_ttl_ms(&self) -> u64 {
        u64::try_from(self.hold_ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// Answer to `set_stock`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SetStockOutcome {
    /// The event did not exist (or was lost with its store): created, with
    /// `available = total`.
    Created {
        /// Units available after the change.
        available: u64,
    },
    /// The event existed with a lower version: total, cart limit, hold TTL
    /// and room replaced; `available = total − held − confirmed`. Existing
    /// holds keep their deadlines.
    Updated {
        /// Units available after the change.
        available: u64,
    },
    /// The version is not above the stored one: nothing changed (HTTP 409
    /// `stale_version`).
    Stale {
        /// The version in the store.
        current_version: u64,
    },
    /// The new total is below what visitors already hold or bought: refused,
    /// nothing changed (the gateway answers 409; the operator must raise the
    /// total or wait for holds to lapse). Refusing keeps
    /// `available + held + confirmed = total` true at all times.
    BelowCommitted {
        /// Units currently held.
        held: u64,
        /// Units confirmed (sold).
        confirmed: u64,
    },
    /// A category's new total (0 for a category left out) is below what is
    /// held or sold in it: refused, nothing changed (HTTP 409
    /// `category_below_committed`).
    CategoryBelowCommitted {
        /// The category.
        category: String,
        /// Units held in it.
        held: u64,
        /// Units sold in it.
        confirmed: u64,
    },
    /// A sharded event's shard count cannot change while units are held
    /// or sold in it (a visitor's cart lives on its home shard, which the
    /// count decides): nothing changed (HTTP 409 `shards_busy`).
    ShardsBusy {
        /// Units held, all shards.
        held: u64,
        /// Units sold, all shards.
        confirmed: u64,
    },
    /// The spec itself is unusable (cart limit 0, TTL 0, total above
    /// 2^53): nothing changed (HTTP 422 `invalid_setting`).
    Invalid {
        /// What is wrong.
        reason: &'static str,
    },
    /// The store had this event once (its load marker survives) but lost
    /// its counters and settings (a flush, an eviction, a failover to an
    /// empty replica): created again from this spec, `available = total`,
    /// as [`SetStockOutcome::Created`]. Only an explicit `set_stock` (an
    /// operator's load) does this; configured stock never does
    /// ([`crate::Inventory::load_if_new`]). Whatever was sold or held in
    /// the lost generation is forgotten: the operator's total must already
    /// account for it. The gateway answers 201 with `"lost": true`.
    Recreated {
        /// Units available after the load.
        available: u64,
        /// The highest version the store had set before the loss (the
        /// marker's), for the operator's log.
        lost_version: u64,
    },
}

/// Answer to [`crate::Inventory::load_if_new`]: loading configured stock,
/// which only ever happens into a store that never had the event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum LoadOutcome {
    /// The store never had the event: created with `available = total`.
    Loaded {
        /// Units available.
        available: u64,
    },
    /// The store has the event's settings: nothing changed (a configured
    /// total never overwrites a live event).
    Present,
    /// The store had the event and lost it (its load marker says so):
    /// nothing changed. The event stays not ready (HTTP 503
    /// `inventory_not_ready`) until an operator loads it explicitly or a
    /// ledger restores it.
    Lost {
        /// The highest version set before the loss.
        last_version: u64,
    },
    /// The spec is unusable: nothing changed.
    Invalid {
        /// What is wrong.
        reason: &'static str,
    },
}

// === holds ===

/// Where a hold is in its life. `Held` is the only non-terminal state; each
/// hold reaches exactly one of the other three, once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldStatus {
    /// Stock taken, deadline not passed.
    Held,
    /// Paid: the units are sold.
    Confirmed,
    /// Given back by its visitor or by a failed payment.
    Released,
    /// Its deadline passed before payment (whether or not the reaper has
    /// visited it yet).
    Expired,
}

impl HoldStatus {
    /// The lower-case name used by the HTTP API and the stream.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Confirmed => "confirmed",
            Self::Released => "released",
            Self::Expired => "expired",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "held" => Self::Held,
            "confirmed" => Self::Confirmed,
            "released" => Self::Released,
            "expired" => Self::Expired,
            _ => return None,
        })
    }
}

/// A hold as the visitor sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HoldView {
    /// The hold's id.
    pub hold_id: HoldId,
    /// Its event.
    pub event: EventId,
    /// Units held.
    pub qty: u32,
    /// Its state, with expiry applied at read time.
    pub status: HoldStatus,
    /// Deadline in Unix seconds (rounded down: the hold is certain to be
    /// valid before this second).
    pub expires_at: u64,
    /// Deadline in Unix milliseconds (the store's own clock).
    pub expires_at_ms: u64,
    /// Units available in the event after the operation (for reads: now).
    pub available: u64,
    /// The owner (the admission token's `sub`).
    pub visitor: String,
    /// Units per category (empty for a hold of an event without
    /// categories).
    pub items: Vec<Item>,
}

/// Answer to `hold`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum HoldOutcome {
    /// A new hold (HTTP 201).
    Held(HoldView),
    /// The same `Idempotency-Key` from the same visitor: the earlier hold, as
    /// it is now (HTTP 201 with the same body). Nothing changed.
    Replayed(HoldView),
    /// Not enough stock (HTTP 409 `sold_out`).
    SoldOut {
        /// Units available.
        available: u64,
    },
    /// held + confirmed + asked would exceed the cart limit (HTTP 409
    /// `cart_limit_exceeded`).
    CartLimitExceeded {
        /// The event's cart limit.
        limit: u32,
        /// Units this visitor already holds or bought.
        held: u32,
    },
    /// Zero, or above the cart limit (HTTP 422 `invalid_quantity`).
    InvalidQuantity {
        /// The event's cart limit.
        limit: u32,
    },
    /// The stock counter or the event's settings are missing: stock never
    /// loaded, or lost with the store (HTTP 503 `inventory_not_ready`).
    /// Never reported as sold out. The store cannot tell "never loaded"
    /// from "lost" (an empty restarted Redis forgets both), so an event
    /// unknown to the store also answers `NotReady`: the gateway answers
    /// 404 `event_not_found` for events outside its configuration.
    NotReady,
    /// An item names a category the event does not have (or the event has
    /// none): nothing held (HTTP 404 `category_not_found`).
    CategoryNotFound {
        /// The first unknown category, in the order asked.
        category: String,
    },
    /// A category listed twice in one hold: nothing held (HTTP 400
    /// `duplicate_category`). Refused before the store is asked.
    DuplicateCategory {
        /// The category.
        category: String,
    },
    /// A bare `qty` on an event with categories: the hold must say which
    /// (HTTP 422 `items_required`).
    ItemsRequired,
    /// Not enough units in one category (HTTP 409 `sold_out`, naming it);
    /// nothing held in any category.
    CategorySoldOut {
        /// The first category short of units, in the order asked.
        category: String,
        /// Units available in it.
        available: u64,
    },
    /// held + confirmed + asked in one category would exceed that
    /// category's cart limit (HTTP 409 `cart_limit_exceeded`, naming it).
    CategoryCartLimitExceeded {
        /// The category.
        category: String,
        /// Its cart limit.
        limit: u32,
        /// Units of it this visitor already holds or bought.
        held: u32,
    },
    /// The event (or shard) is split into another number of shards than
    /// the caller routed by (0: frozen while its shards change): nothing
    /// held. [`crate::sharded::Sharded`] learns the layout from this and
    /// routes again; a gateway never shows it to a visitor (503
    /// `inventory_not_ready` if it ever did).
    Resharded {
        /// The layout stored with the event.
        shards: u32,
    },
}

/// Answer to `release`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseOutcome {
    /// Released now; its units went back to stock.
    Released,
    /// Released before (not an error: HTTP 200 `released`).
    AlreadyReleased,
    /// Its deadline had passed; its stock went back (now or before) exactly
    /// once. Not an error either.
    Expired,
    /// Paid: cannot be released (HTTP 409 `hold_confirmed`).
    Confirmed,
    /// No such hold, or another visitor's (HTTP 404 `hold_not_found`).
    NotFound,
    /// The hold exists but the event's stock counter is missing (lost with
    /// part of the store): nothing changed (HTTP 503 `inventory_not_ready`).
    /// Only the Redis store can answer this.
    NotReady,
}

/// Answer to `confirm`. Repeating a `payment_event_id` for the same hold
/// answers what the first delivery answered, and changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmOutcome {
    /// The hold is confirmed (by this payment, or by an earlier one: a
    /// failed payment arriving after success leaves it confirmed).
    Confirmed,
    /// The hold is released: by this failed payment, or it was released
    /// before this payment arrived. After a *succeeded* payment this means
    /// the money must be refunded; the gateway may answer 409.
    Released,
    /// The hold lapsed before the payment (per the store's clock): never
    /// confirmed, its stock went back exactly once (HTTP 409 `hold_expired`).
    Expired,
    /// No such hold (HTTP 404 `hold_not_found`).
    NotFound,
    /// The hold exists but the event's stock counter is missing: nothing
    /// changed, nothing recorded (HTTP 503 `inventory_not_ready`). Only the
    /// Redis store can answer this.
    NotReady,
    /// This payment event id was already applied to another hold of the
    /// event: a provider's payment event is about one payment, so this is
    /// a provider or shop bug. Nothing changed (HTTP 409
    /// `payment_event_reused`).
    PaymentReused,
}

impl ConfirmOutcome {
    /// The lower-case name (`confirmed`, `released`, `expired`,
    /// `not_found`, `not_ready`, `payment_reused`), as recorded per payment
    /// event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confirmed => "confirmed",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::NotFound => "not_found",
            Self::NotReady => "not_ready",
            Self::PaymentReused => "payment_reused",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "confirmed" => Self::Confirmed,
            "released" => Self::Released,
            "expired" => Self::Expired,
            "not_found" => Self::NotFound,
            "not_ready" => Self::NotReady,
            "payment_reused" => Self::PaymentReused,
            _ => return None,
        })
    }
}

// === event state ===

/// An event's counters and settings (`GET /_sluice/admin/events/{event}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventState {
    /// The event.
    pub event: EventId,
    /// Units on sale in all.
    pub total: u64,
    /// Units free to hold; `None` when the stock counter is missing (not
    /// ready: see [`EventState::ready`]).
    pub available: Option<u64>,
    /// Units in holds not yet confirmed, released or reaped.
    pub held: u64,
    /// Units sold.
    pub confirmed: u64,
    /// Version of the last stock sync.
    pub version: u64,
    /// Most units per visitor.
    pub cart_limit: u32,
    /// Hold TTL in whole seconds (rounded up).
    pub hold_ttl_secs: u64,
    /// Hold TTL in milliseconds.
    pub hold_ttl_ms: u64,
    /// The room whose admitted visitors may buy.
    pub room: String,
    /// `available + held + confirmed == total` (false when not ready), and
    /// the same in every category, whose counters add up to the event's.
    pub invariant_holds: bool,
    /// Per-category counters, in the order loaded (empty: no categories).
    pub categories: Vec<CategoryState>,
    /// Scheduled waves not yet released, earliest first (every wave due
    /// by the store's clock was released before this was read).
    pub waves: Vec<Wave>,
    /// Shards the event is split into ([`crate::sharded`]): 1 for a plain
    /// event, 0 while its shard count changes (frozen: nothing is held).
    /// Read through [`crate::sharded::Sharded`], the counters above are
    /// the sums over every shard and `total` the event's.
    pub shards: u32,
    /// Shard 0 of a sharded event read alone: the event's total (`total`
    /// is then shard 0's own). `None` otherwise.
    pub shard_total: Option<u64>,
    /// Units moved off one shard and not yet landed on another (a
    /// transfer in flight, [`crate::sharded`]): neither available nor
    /// held, and part of `total`. 0 for a plain event.
    pub in_transit: u64,
    /// Transfers that moved units off or onto this store event, ever (a
    /// counter: [`crate::Sharded`] compares two reads of it to know that
    /// no unit moved in between). Not part of any HTTP answer.
    #[serde(skip)]
    pub moves: u64,
    /// Each shard's own counters, shard 0 first (empty for a plain event,
    /// or read from one shard alone).
    pub shard_states: Vec<ShardState>,
}

/// One shard's counters in a sharded event's [`EventState`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShardState {
    /// The shard's id (the event itself for shard 0, `{event}~{k}` after).
    pub id: EventId,
    /// The shard's own total (moves as units are transferred).
    pub total: u64,
    /// Its available units (`None`: the shard is not ready).
    pub available: Option<u64>,
    /// Units held on it.
    pub held: u64,
    /// Units sold on it.
    pub confirmed: u64,
    /// Units it sent that have not landed yet.
    pub sending: u64,
}

impl EventState {
    /// Whether holds can be taken (the stock counter exists).
    pub fn ready(&self) -> bool {
        self.available.is_some()
    }

    /// The earliest pending wave, if any.
    pub fn next_wave(&self) -> Option<&Wave> {
        self.waves.first()
    }

    /// When the next wave opens (Unix ms), if one is pending.
    pub fn next_wave_at_ms(&self) -> Option<u64> {
        self.next_wave().map(|w| w.at_ms)
    }

    /// Units of every wave opening at the next wave's time (all
    /// categories), 0 when none is pending.
    pub fn next_wave_qty(&self) -> u64 {
        let Some(at) = self.next_wave_at_ms() else {
            return 0;
        };
        self.waves
            .iter()
            .filter(|w| w.at_ms == at)
            .map(|w| w.qty)
            .sum()
    }

    /// How many waves are pending.
    pub fn pending_waves(&self) -> usize {
        self.waves.len()
    }
}

// === waves ===

/// Most waves one schedule may hold.
pub const MAX_WAVES: usize = 1000;

/// A scheduled release of stock: at `at_ms` (the store's clock, Unix ms),
/// `qty` units are added to the event's total and available (and to
/// `category`'s, for an event with categories), exactly once.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Wave {
    /// When it opens, Unix milliseconds (store time).
    pub at_ms: u64,
    /// Units it adds.
    pub qty: u64,
    /// The category it adds to (`None` for an event without categories).
    pub category: Option<CategoryId>,
}

/// Waves as the stores write them (the settings hash's `waves` field, the
/// stream's `waves` field): `at:qty:category` (category empty when none)
/// joined by `,`.
pub fn waves_text(waves: &[Wave]) -> String {
    let parts: Vec<String> = waves
        .iter()
        .map(|w| {
            let c = w.category.as_ref().map(CategoryId::as_str).unwrap_or("");
            format!("{}:{}:{c}", w.at_ms, w.qty)
        })
        .collect();
    parts.join(",")
}

/// Parses [`waves_text`]'s format; `None` when malformed.
pub fn parse_waves(text: &str) -> Option<Vec<Wave>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',')
        .map(|part| {
            let mut f = part.splitn(3, ':');
            let at_ms = f.next()?.parse().ok()?;
            let qty = f.next()?.parse().ok()?;
            let c = f.next()?;
            let category = if c.is_empty() {
                None
            } else {
                Some(CategoryId::parse(c)?)
            };
            Some(Wave {
                at_ms,
                qty,
                category,
            })
        })
        .collect()
}

/// Why a schedule is refused before any store sees it
/// ([`ScheduleOutcome::Invalid`]): too many waves, a wave of 0 units or
/// above 2^53 in all.
pub fn waves_problem(waves: &[Wave]) -> Option<&'static str> {
    if waves.len() > MAX_WAVES {
        return Some("more than 1000 waves");
    }
    if waves.iter().any(|w| w.qty == 0) {
        return Some("a wave's qty must be at least 1");
    }
    let sum = waves.iter().fold(0u64, |a, w| a.saturating_add(w.qty));
    if sum > crate::MAX_TOTAL {
        return Some("waves' units above 2^53");
    }
    None
}

/// Answer to [`crate::Inventory::schedule_waves`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ScheduleOutcome {
    /// The pending schedule is now `waves` (earliest first). Waves of the
    /// old schedule that were due were released first.
    Scheduled {
        /// The schedule as stored.
        waves: Vec<Wave>,
    },
    /// The store has no stock for the event (never loaded, or lost):
    /// nothing changed (HTTP 503 `inventory_not_ready`, or 404
    /// `event_not_found` for an event the gateway does not know).
    NotReady,
    /// A wave opens at or before the store's clock: nothing changed (HTTP
    /// 422 `wave_in_past`).
    WaveInPast {
        /// The first such wave's time.
        at_ms: u64,
        /// The store's clock.
        now_ms: u64,
    },
    /// A wave names a category the event does not have (or the event has
    /// none): nothing changed (HTTP 404 `category_not_found`).
    CategoryNotFound {
        /// The category.
        category: String,
    },
    /// Unusable: a qty of 0, too many waves, a wave without a category on
    /// an event with categories, the total pushed above 2^53 (HTTP 422
    /// `invalid_setting`). Nothing changed.
    Invalid {
        /// What is wrong.
        reason: &'static str,
    },
}

// === transitions ===

/// Kind of a transition in the event's log (the Redis stream's `type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    /// A hold was taken.
    Held,
    /// A hold was paid.
    Confirmed,
    /// A hold was released (by its visitor, or a failed payment).
    Released,
    /// A hold's deadline passed and its stock went back.
    Expired,
    /// The stock was set (`set_stock`).
    Stock,
    /// The event was rebuilt from a durable record after the store lost it
    /// (`restore`): `qty` is the total, `available` what went back on sale.
    Restored,
}

impl TransitionKind {
    /// The stream's `type` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Confirmed => "confirmed",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Stock => "stock",
            Self::Restored => "restored",
        }
    }

    /// Parses the stream's `type` field; `None` for a type this version
    /// does not know.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "held" => Self::Held,
            "confirmed" => Self::Confirmed,
            "released" => Self::Released,
            "expired" => Self::Expired,
            "stock" => Self::Stock,
            "restored" => Self::Restored,
            _ => return None,
        })
    }

    /// A hold's end: confirmed, released or expired.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Confirmed | Self::Released | Self::Expired)
    }

    /// About one hold (everything but `stock` and `restored`).
    pub fn is_hold(self) -> bool {
        !matches!(self, Self::Stock | Self::Restored)
    }
}

/// One entry of an event's transition log (see `STREAM.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transition {
    /// What happened.
    pub kind: TransitionKind,
    /// The hold (empty for `stock` and `restored`).
    pub hold_id: String,
    /// The hold's visitor (empty for `stock` and `restored`).
    pub visitor: String,
    /// Units moved (for `stock` and `restored`: the total).
    pub qty: u64,
    /// Units available after the transition.
    pub available: u64,
    /// Store time of the transition, Unix milliseconds.
    pub ts_ms: u64,
    /// The payment event that caused a `confirmed` or payment `released`.
    pub payment_event_id: Option<String>,
    /// For a hold's transition: units per category (empty without
    /// categories).
    pub items: Vec<Item>,
    /// For `stock` and `restored`: the categories as loaded (empty
    /// without categories).
    pub categories: Vec<CategorySpec>,
    /// For `stock`: `wave` when a scheduled wave was released, `waves`
    /// when the schedule was replaced, `None` for a stock load.
    pub reason: Option<String>,
    /// For `stock` entries of waves: the schedule still pending after it.
    pub waves: Vec<Wave>,
}

/// Categories as the stream's `categories` field writes them:
/// `id:total:cart_limit` (0 = none) joined by `,`.
pub fn categories_text(categories: &[CategorySpec]) -> String {
    let parts: Vec<String> = categories
        .iter()
        .map(|c| format!("{}:{}:{}", c.id, c.total, c.cart_limit.unwrap_or(0)))
        .collect();
    parts.join(",")
}

/// Parses [`categories_text`]'s format; `None` when malformed.
pub fn parse_categories(text: &str) -> Option<Vec<CategorySpec>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',')
        .map(|part| {
            let mut f = part.split(':');
            let id = CategoryId::parse(f.next()?)?;
            let total = f.next()?.parse().ok()?;
            let limit: u32 = f.next()?.parse().ok()?;
            Some(CategorySpec {
                id,
                total,
                cart_limit: (limit > 0).then_some(limit),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn event_ids() {
        assert!(EventId::parse("demo").is_some());
        assert!(EventId::parse("A-z_09").is_some());
        assert!(EventId::parse(&"a".repeat(64)).is_some());
        for bad in ["", "a.b", "a{b}", "a:b", "a b", "é", &"a".repeat(65)] {
            assert!(EventId::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn hold_ids_round_trip() {
        let ev = EventId::parse("demo").unwrap();
        for _ in 0..100 {
            let id = HoldId::generate(&ev);
            assert_eq!(id.suffix().len(), HOLD_SUFFIX_LEN);
            let parsed = HoldId::parse(id.as_str()).unwrap();
            assert_eq!(parsed, id);
            assert_eq!(parsed.event(), ev);
        }
    }

    #[test]
    fn bad_hold_ids() {
        let good = HoldId::generate(&EventId::parse("demo").unwrap());
        let suffix = good.suffix().to_owned();
        for bad in [
            String::new(),
            "demo".into(),
            format!("demo.{}", &suffix[..21]),
            format!("demo.{suffix}A"),
            format!(".{suffix}"),
            format!("de{{mo.{suffix}"),
            format!("demo.{}+", &suffix[..21]),
            "demo.AAAAAAAAAAAAAAAAAAAAA_".into(),
        ] {
            assert!(HoldId::parse(&bad).is_none(), "{bad:?}");
        }
    }
}
