//! The ledger's faults. Business answers (a drift, a dead letter) are
//! values; these are what stops a batch from being written or acknowledged.

use thiserror::Error;

/// A fault of the ledger; the batch at hand is retried, never acknowledged.
#[derive(Debug, Error)]
pub enum LedgerError {
    /// PostgreSQL refused, failed or could not be reached.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// Redis refused, failed or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The consumer group of a stream is gone (the store lost its data, a
    /// `FLUSHALL`): it is created again.
    #[error("consumer group missing on {0}")]
    NoGroup(String),
    /// A reply of Redis had a shape the ledger does not understand.
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// A URL or an option is unusable.
    #[error("config: {0}")]
    Config(String),
    /// The event has categories: a record without them would restore it
    /// as a plain event (read it with `Ledger::event_record_with_categories`).
    #[error("event {0} has categories: its record must be read with them")]
    Categorized(String),
    /// A call took longer than its bound.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
}

/// The crate's result.
pub type Result<T, E = LedgerError> = std::result::Result<T, E>;
