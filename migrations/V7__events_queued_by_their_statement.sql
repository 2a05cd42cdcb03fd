-- Version 7: the statement that writes an event also queues it.
--
-- Until now a statement-level trigger with a transition table
-- (`events_enqueue`, V6) added every new event to `event_queue`. Such a
-- trigger cannot run on a database distributed by merchant (Citus refuses
-- to create it, and where allowed it fails at execution), so the
-- statements that write events now insert their queue rows themselves, in
-- the same statement (`db::records`, `db::charges::RECORD_OUTCOMES`): an
-- event is queued exactly when it commits, as before. `tests/api/schema.rs`
-- checks that every statement that writes an event queues it.
--
-- Upgrading: instances of the previous version write events without
-- queueing them once this migration has run, so replace them before (or
-- together with) applying it; an event they write meanwhile is found by
-- the query below, run again by hand:
--   INSERT INTO event_queue (event_id, merchant_id, type)
--   SELECT id, merchant_id, type FROM events e
--    WHERE NOT EXISTS (SELECT 1 FROM webhook_deliveries d
--                       WHERE d.merchant_id = e.merchant_id AND d.event_id = e.id)
--   ON CONFLICT DO NOTHING;
-- (it may queue events no endpoint wanted again; their fan-out adds nothing).

DROP TRIGGER events_enqueue ON events;
DROP FUNCTION enqueue_new_events();
