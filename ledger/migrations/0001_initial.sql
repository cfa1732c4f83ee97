-- 0001_initial: the ledger's tables. Every column is described in
-- ledger/SCHEMA.md. Applied once, in a transaction, by the first
-- `sluice ledger` that finds it missing from ledger_schema_version.

-- One row per event the ledger has seen an entry of.
CREATE TABLE events (
    event            text PRIMARY KEY,
    total            bigint NOT NULL DEFAULT 0,
    version          bigint NOT NULL DEFAULT 0,
    stock_ms         bigint NOT NULL DEFAULT 0,
    stock_seq        bigint NOT NULL DEFAULT 0,
    held_units       bigint NOT NULL DEFAULT 0,
    confirmed_units  bigint NOT NULL DEFAULT 0,
    last_ms          bigint NOT NULL DEFAULT 0,
    last_seq         bigint NOT NULL DEFAULT 0,
    entries          bigint NOT NULL DEFAULT 0,
    dead_letters     bigint NOT NULL DEFAULT 0,
    drift_units      bigint NOT NULL DEFAULT 0,
    reconciled_stream_id text,
    reconciled_at    timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Every stream entry the ledger understood, once.
CREATE TABLE hold_transitions (
    event            text NOT NULL,
    stream_id        text NOT NULL,
    stream_ms        bigint NOT NULL,
    stream_seq       bigint NOT NULL,
    hold_id          text,
    kind             text NOT NULL
        CHECK (kind IN ('held', 'confirmed', 'released', 'expired', 'stock', 'restored')),
    visitor          text,
    qty              bigint NOT NULL,
    available_after  bigint NOT NULL,
    ts               timestamptz NOT NULL,
    expires_at       timestamptz,
    reason           text,
    payment_event_id text,
    version          bigint,
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT hold_transitions_entry UNIQUE (event, stream_id),
    -- NULL hold ids (stock, restored) are distinct from each other.
    CONSTRAINT hold_transitions_hold_kind UNIQUE (hold_id, kind)
);
CREATE INDEX hold_transitions_order ON hold_transitions (event, stream_ms, stream_seq);

-- One row per hold: its latest state.
CREATE TABLE holds (
    hold_id          text PRIMARY KEY,
    event            text NOT NULL,
    visitor          text NOT NULL,
    qty              bigint NOT NULL,
    held_at          timestamptz,
    expires_at       timestamptz,
    expires_at_ms    bigint,
    status           text NOT NULL
        CHECK (status IN ('held', 'confirmed', 'released', 'expired')),
    ended_at         timestamptz,
    end_reason       text,
    payment_event_id text,
    updated_at       timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 80);
-- No index on status: a hold's end rewrites its row in place (a HOT
-- update, room left by the fill factor); a rebuild reads one event's
-- holds through this index and filters them.
CREATE INDEX holds_visitor ON holds (event, visitor);

-- One row per payment event id the store applied.
CREATE TABLE payments (
    event            text NOT NULL,
    payment_event_id text NOT NULL,
    hold_id          text NOT NULL,
    outcome          text NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    ts               timestamptz NOT NULL,
    stream_id        text NOT NULL,
    PRIMARY KEY (event, payment_event_id)
);
CREATE INDEX payments_hold ON payments (hold_id);

-- Entries the ledger could not understand: parked, never dropped.
CREATE TABLE dead_letters (
    event            text NOT NULL,
    stream_id        text NOT NULL,
    fields           jsonb NOT NULL,
    error            text NOT NULL,
    at               timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_entry UNIQUE (event, stream_id)
);

-- Each room's queue high-water mark: only ever rises.
CREATE TABLE rooms (
    room             text PRIMARY KEY,
    tail             bigint NOT NULL,
    frontier         bigint NOT NULL,
    epoch            bigint NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Checks where the ledger's count disagreed with the store's.
CREATE TABLE reconciliation (
    event            text NOT NULL,
    stream_id        text NOT NULL,
    ledger_available bigint NOT NULL,
    store_available  bigint NOT NULL,
    drift_units      bigint NOT NULL,
    checked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event, stream_id)
);

-- The ledger's balance of each event, for operators.
CREATE VIEW event_balance AS
SELECT event,
       total,
       version,
       held_units,
       confirmed_units,
       total - held_units - confirmed_units AS available,
       drift_units,
       reconciled_stream_id,
       reconciled_at,
       updated_at
FROM events;
