-- 0002_categories: categories (tiers) within an event. Every column is
-- described in ledger/SCHEMA.md. Adding nullable columns rewrites no row;
-- entries of events without categories leave them NULL.

-- The raw fields, as the stream gave them (normalized text).
ALTER TABLE hold_transitions
    ADD COLUMN items      text,
    ADD COLUMN categories text;

-- The categories of the latest stock or restored entry (NULL: none).
ALTER TABLE events ADD COLUMN categories text;

-- Each hold's units per category, from its held or terminal entry
-- (whichever is committed first; both carry the same breakdown).
CREATE TABLE hold_items (
    hold_id          text NOT NULL,
    event            text NOT NULL,
    category         text NOT NULL,
    qty              bigint NOT NULL CHECK (qty > 0),
    PRIMARY KEY (hold_id, category)
);
CREATE INDEX hold_items_event ON hold_items (event, category);

-- Each category's balance, for operators: the totals of the latest
-- stock entry, the units of its holds by their state.
CREATE VIEW category_balance AS
WITH cats AS (
    SELECT e.event,
           c.position,
           split_part(c.spec, ':', 1) AS category,
           split_part(c.spec, ':', 2)::bigint AS total,
           NULLIF(split_part(c.spec, ':', 3)::bigint, 0) AS cart_limit
    FROM events e
    CROSS JOIN LATERAL regexp_split_to_table(e.categories, ',')
        WITH ORDINALITY AS c(spec, position)
    WHERE e.categories IS NOT NULL AND e.categories <> ''
), units AS (
    SELECT i.event,
           i.category,
           COALESCE(sum(i.qty) FILTER (WHERE h.status = 'held'), 0) AS held_units,
           COALESCE(sum(i.qty) FILTER (WHERE h.status = 'confirmed'), 0) AS confirmed_units
    FROM hold_items i JOIN holds h USING (hold_id)
    GROUP BY i.event, i.category
)
SELECT c.event,
       c.category,
       c.position,
       c.total,
       c.cart_limit,
       COALESCE(u.held_units, 0) AS held_units,
       COALESCE(u.confirmed_units, 0) AS confirmed_units,
       c.total - COALESCE(u.held_units, 0) - COALESCE(u.confirmed_units, 0) AS available
FROM cats c
LEFT JOIN units u ON u.event = c.event AND u.category = c.category;
