//! The crate's faults. Business outcomes (a join refused because the room is
//! closed aside, see [`AdmissionError::Closed`]) are values inside `Ok`.

use std::time::Duration;

pub use crate::settings::InvalidSetting;

/// What can go wrong in the admission stores and key handling.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The store answered with an error (connection refused, reset, script
    /// error…). Safe to retry; the gateway applies the room's failure policy.
    #[error("queue store error: {0}")]
    Store(String),
    /// The store did not answer within the configured timeout. The operation
    /// may or may not have been applied (a join may have used a seq: harmless,
    /// seqs are never reissued).
    #[error("queue store timed out after {0:?}")]
    StoreTimeout(Duration),
    /// The store answered something this code does not understand (a script
    /// of another version, a corrupted key).
    #[error("unexpected reply from the queue store: {0}")]
    Protocol(String),
    /// The room has no state in the store: never configured, or the store
    /// lost it (Redis restarted empty). The gateway calls
    /// [`crate::QueueStore::recover`] with its settings and the highest
    /// tail/frontier it has seen.
    #[error("room {0:?} has no state in the store")]
    RoomNotFound(String),
    /// The room is closed: it takes no joins (HTTP 423 `room_closed`). A
    /// refusal rather than a fault, kept here so `join` has one return type.
    #[error("room {0:?} is closed")]
    Closed(String),
    /// A room of the `reject` method could not admit the join on the spot
    /// (someone waits, no credit, or the active cap): it takes no place and
    /// no seq (HTTP 503 `room_full`). A refusal, like [`Self::Closed`].
    #[error("room {0:?} is full")]
    Full(String),
    /// A join named a lane the room does not have (HTTP 422
    /// `lane_not_found`): nothing handed out. A refusal, like
    /// [`Self::Closed`].
    #[error("room {0:?} has no such lane")]
    LaneNotFound(String),
    /// The settings the store holds for a room are unparseable, larger
    /// than [`crate::settings::MAX_SETTINGS_BYTES`] or invalid. The gateway
    /// keeps its last good copy, logs it and counts it.
    #[error("the store's settings of room {room:?} are refused: {reason}")]
    StoredSettings {
        /// The room.
        room: String,
        /// Why.
        reason: String,
    },
    /// A settings write named a version the store no longer has: another
    /// write came first. Read again, apply the change again, retry.
    #[error("settings changed meanwhile (store version {current})")]
    SettingsConflict {
        /// The store's version now.
        current: u64,
    },
    /// Fewer replicas acknowledged a join than `wait_replicas` asks for
    /// (the seq may be lost by a failover; the gateway answers 503 and never
    /// reuses it).
    #[error("join acknowledged by {acked} of {wanted} replicas")]
    NotReplicated {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acked: u32,
    },
    /// A room id that cannot be used as a key hash tag.
    #[error("invalid room id {0:?}: 1-64 characters of [A-Za-z0-9._-]")]
    InvalidRoomId(String),
    /// A setting out of range.
    #[error(transparent)]
    InvalidSetting(#[from] InvalidSetting),
    /// A key file that cannot be read or parsed, or a key directory without
    /// keys.
    #[error("key error: {0}")]
    Key(String),
    /// File-system error while loading or writing keys.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl From<redis::RedisError> for AdmissionError {
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            AdmissionError::StoreTimeout(Duration::ZERO)
        } else {
            AdmissionError::Store(e.to_string())
        }
    }
}

/// Checks a room id: 1 to 64 characters of `[A-Za-z0-9._-]`. Room ids become
/// Redis hash tags (`sluice:{room}:…`), so braces and spaces are out.
pub fn validate_room_id(room: &str) -> Result<(), AdmissionError> {
    let ok = !room.is_empty()
        && room.len() <= 64
        && room
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(AdmissionError::InvalidRoomId(room.to_owned()))
    }
}
