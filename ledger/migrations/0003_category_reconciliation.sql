-- 0003_category_reconciliation: reconciliation per category. Every column
-- is described in ledger/SCHEMA.md. A check row names its category ('' for
-- the event as a whole, as every row before this migration did).

ALTER TABLE reconciliation ADD COLUMN category text NOT NULL DEFAULT '';
ALTER TABLE reconciliation DROP CONSTRAINT reconciliation_pkey;
ALTER TABLE reconciliation ADD PRIMARY KEY (event, stream_id, category);

-- The last exact check's disagreeing categories, "{category}={drift}"
-- joined by ','; NULL when every category agreed (or none was checked).
ALTER TABLE events ADD COLUMN category_drift text;
