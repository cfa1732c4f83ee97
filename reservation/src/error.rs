//! Faults of the reservation stores.
//!
//! Business outcomes (sold out, cart limit, not ready, expired…) are values
//! inside `Ok`; a [`ReservationError`] means the store could not give an
//! answer at all. The gateway maps [`ReservationError::is_unavailable`] to
//! 503 `store_unavailable` with `Retry-After`, anything else to 500.

use std::time::Duration;

/// A fault: the store gave no business answer.
#[derive(Debug, thiserror::Error)]
pub enum ReservationError {
    /// Redis could not be reached, dropped the connection, or said it cannot
    /// serve right now (`LOADING` after a restart, `CLUSTERDOWN`,
    /// `TRYAGAIN`, `MASTERDOWN`, `READONLY` replica). Safe to retry; a write
    /// (hold, release, confirm) may or may not have been applied, which is
    /// why clients send an `Idempotency-Key` and webhooks a
    /// `payment_event_id`.
    #[error("reservation store unavailable: {0}")]
    Unavailable(#[source] redis::RedisError),

    /// The call did not finish within the configured timeout
    /// ([`crate::RedisConfig::timeout`]). Same retry rules as
    /// [`ReservationError::Unavailable`].
    #[error("reservation store did not answer within {0:?}")]
    Timeout(Duration),

    /// Redis answered with an error reply to a script or command (a bug in a
    /// script, `WRONGTYPE` on a key someone else wrote, out of memory).
    /// Not transient: retrying will fail the same way.
    #[error("reservation store rejected a command: {0}")]
    Script(#[source] redis::RedisError),

    /// The write was applied on the primary but fewer replicas than
    /// [`crate::RedisConfig::wait_replicas`] acknowledged it within
    /// [`crate::RedisConfig::wait_timeout`]: a failover now could lose it.
    /// A fresh hold has been released again before this is returned (see
    /// the Redis store's "Durability" docs); a confirmation stays applied
    /// and is safe to repeat with the same `payment_event_id`. The gateway
    /// answers 503 `store_unavailable`.
    #[error("only {acked} of {wanted} replicas acknowledged the write in time")]
    NotReplicated {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acked: u32,
    },

    /// A script answered with a shape this crate does not understand (a
    /// script from another version of sluice, or a corrupted key).
    #[error("reservation store answered unexpectedly: {0}")]
    Protocol(String),

    /// A hold of a sharded event lost the race for the units pulled to its
    /// home shard in every one of its `rounds` home attempts, and no pass
    /// over the shards proved the event sold out (module docs of
    /// [`crate::sharded`], "Sold out"). Nothing was held; safe to retry.
    /// The gateway answers 503 `store_unavailable`, never "sold out".
    #[error(
        "the units of this event kept moving: no hold and no proof of sold out in {rounds} rounds"
    )]
    Contended {
        /// Home attempts made.
        rounds: u32,
    },

    /// The store could not be set up (a malformed Redis URL, a client
    /// option Redis refused).
    #[error("reservation store misconfigured: {0}")]
    Config(String),
}

impl ReservationError {
    /// Whether the gateway should answer 503 `store_unavailable` (the
    /// store is down, slow or restarting) rather than 500.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_)
                | Self::Timeout(_)
                | Self::NotReplicated { .. }
                | Self::Contended { .. }
        )
    }

    /// Classifies an error from the Redis client.
    pub(crate) fn from_redis(err: redis::RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        let transient_server = matches!(
            err.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
            ) | ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
        );
        if transient_server
            || err.is_io_error()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || err.is_timeout()
            || err.is_unrecoverable_error()
        {
            Self::Unavailable(err)
        } else {
            Self::Script(err)
        }
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = ReservationError> = std::result::Result<T, E>;
