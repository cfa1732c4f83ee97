//! The schema: plain SQL files in `ledger/migrations/`, embedded in the
//! binary and applied at start, each once, in order.
//!
//! Applying takes a transaction-scoped advisory lock first, so ledgers
//! started together apply each migration exactly once (the others wait,
//! then find it recorded in `ledger_schema_version` and do nothing), and a
//! failed migration leaves nothing half-applied.

use tokio_postgres::Client;

use crate::error::Result;

/// The advisory lock key of migrations (an arbitrary constant: "sluiceLG").
const MIGRATION_LOCK: i64 = 0x736c_7569_6365_4c47;

/// The migrations, in order: (version, name, SQL).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "initial", include_str!("../migrations/0001_initial.sql")),
    (
        2,
        "categories",
        include_str!("../migrations/0002_categories.sql"),
    ),
    (
        3,
        "category_reconciliation",
        include_str!("../migrations/0003_category_reconciliation.sql"),
    ),
];

/// The newest schema version this binary knows.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

/// Applies every migration the database lacks; returns the versions
/// applied by this call (empty when the schema was current).
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS ledger_schema_version (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let current: i32 = tx
        .query_one(
            "SELECT COALESCE(max(version), 0) FROM ledger_schema_version",
            &[],
        )
        .await?
        .get(0);
    let mut applied = Vec::new();
    for (version, name, sql) in MIGRATIONS {
        if *version <= current {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO ledger_schema_version (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await?;
        applied.push(*version);
    }
    tx.commit().await?;
    Ok(applied)
}
