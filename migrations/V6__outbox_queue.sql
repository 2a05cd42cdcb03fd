-- Version 6: an event row is written once and never changed.
--
-- Until now "not yet fanned out" was a column of the event, `dispatched`,
-- with a partial index on it: the fan-out locked every event row and then
-- updated it, and since the partial index names the column the update could
-- not be HOT, so each event was written twice, JSON and all, with a new
-- entry in each of its indexes. The outbox is now two parts: `events`, the
-- record (written once), and `event_queue`, one small row per event not yet
-- fanned out, which the fan-out deletes. A statement trigger puts every new
-- event in the queue, so no statement that writes an event can forget it.
--
-- Measured (BENCHMARKS.md, round 5): per charge, 4 index entries, one row
-- lock and one rewrite of the event fewer.
--
-- Upgrading: instances of the previous version keep serving charges against
-- this schema (their event inserts enter the queue through the trigger), but
-- their dispatcher, backlog gauge and event retention statements name
-- `dispatched` and fail (logged, retried) until they are replaced.

CREATE TABLE event_queue (
    event_id    uuid NOT NULL,
    merchant_id uuid NOT NULL,
    -- The event's type, so the fan-out matches endpoints without reading
    -- the event.
    type        text NOT NULL,
    CONSTRAINT event_queue_pkey PRIMARY KEY (event_id, merchant_id)
);

-- One call per statement, whatever its number of rows (a batch of outcomes
-- writes all its events in one statement).
CREATE FUNCTION enqueue_new_events() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_queue (event_id, merchant_id, type)
    SELECT id, merchant_id, type FROM new_events;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_enqueue
    AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION enqueue_new_events();

INSERT INTO event_queue (event_id, merchant_id, type)
SELECT id, merchant_id, type FROM events WHERE NOT dispatched;

DROP INDEX events_undispatched;
ALTER TABLE events DROP COLUMN dispatched;

-- A charge event has no refund and a refund event no charge: each
-- "one event per change" key is kept only for the events it is about, so an
-- event enters one of the two indexes, not both (the other entry was a
-- NULL). ON CONFLICT names them by their columns and predicate.
CREATE UNIQUE INDEX events_one_per_charge_change_idx ON events (merchant_id, charge_id, type)
    WHERE charge_id IS NOT NULL;
CREATE UNIQUE INDEX events_one_per_refund_change_idx ON events (merchant_id, refund_id, type)
    WHERE refund_id IS NOT NULL;
ALTER TABLE events
    DROP CONSTRAINT events_one_per_charge_change,
    DROP CONSTRAINT events_one_per_refund_change;
ALTER INDEX events_one_per_charge_change_idx RENAME TO events_one_per_charge_change;
ALTER INDEX events_one_per_refund_change_idx RENAME TO events_one_per_refund_change;

-- An event's merchant is its charge's or its refund's: `events_about_its_object`
-- says every event names one of them, and `events_charge_fkey` and
-- `events_refund_fkey` reference them by (id, merchant_id), whose merchants
-- are in turn checked by `charges_merchant_id_fkey` and
-- `refunds_merchant_id_fkey`. The direct reference to `merchants` checked
-- the same thing once more, a lookup and a row lock on the merchant per
-- event.
ALTER TABLE events DROP CONSTRAINT events_merchant_id_fkey;
