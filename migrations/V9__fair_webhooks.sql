-- Version 9: no merchant can slow down another's webhooks (SECURITY.md,
-- "Webhooks: limits and fairness").
--
-- * Endpoint slots. A live endpoint holds one of its merchant's slots, 1 to
--   `webhooks.max_endpoints_per_merchant`, and `webhook_endpoints_one_per_slot`
--   lets no two endpoints of a merchant hold the same one: the cap is kept
--   by a unique index, so concurrent creations cannot overshoot it. Deleting
--   an endpoint clears its slot (NULLs never conflict), which frees it. The
--   index is not partial on `deleted_at IS NULL`: statements that find an
--   endpoint by its id say that too, and the planner would read the
--   merchant's live endpoints through such an index instead of probing the
--   primary key (migration V3).
--   Existing live endpoints get slots 1, 2, ... in the order they were made;
--   a merchant that already has more than the cap keeps them all, and gets a
--   new one only once deletions free a slot within the cap.
-- * The circuit breaker, per endpoint: its failed attempts in a row, since
--   when it has been failing, before when none of its deliveries is tried
--   (`retry_at`), and when it was disabled for failing too long.
-- * A new event type, `webhook_endpoint.disabled`, about an endpoint
--   (`webhook_endpoint_id`), at most one per endpoint.
-- * A queued event whose fan-out failed on its own is set aside: tried again
--   at `next_attempt_at`, its failures counted, the last one kept.
--
-- The statements are in one DO block: on Citus, DDL on a distributed table
-- sent in a query string of several commands fails on the workers, and the
-- migration runner sends a file as one string. Each ADD CONSTRAINT is an
-- ALTER TABLE of its own, which Citus requires too.
--
-- On a large `events` table the checks below are validated under the lock
-- of the ALTER TABLE; add them NOT VALID and VALIDATE them separately there.

DO $$ BEGIN

ALTER TABLE webhook_endpoints
    ADD COLUMN slot integer CONSTRAINT webhook_endpoints_slot_positive CHECK (slot > 0),
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0
        CONSTRAINT webhook_endpoints_failures_non_negative CHECK (consecutive_failures >= 0),
    ADD COLUMN failing_since timestamptz,
    ADD COLUMN retry_at timestamptz,
    ADD COLUMN disabled_at timestamptz;

UPDATE webhook_endpoints w
   SET slot = numbered.n
  FROM (SELECT merchant_id, id,
               row_number() OVER (PARTITION BY merchant_id ORDER BY id) AS n
          FROM webhook_endpoints
         WHERE deleted_at IS NULL) numbered
 WHERE w.merchant_id = numbered.merchant_id AND w.id = numbered.id;

ALTER TABLE webhook_endpoints
    ADD CONSTRAINT webhook_endpoints_slot_iff_live CHECK ((deleted_at IS NULL) = (slot IS NOT NULL));
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_types_valid;
ALTER TABLE webhook_endpoints
    ADD CONSTRAINT webhook_endpoints_types_valid CHECK (event_types <@ ARRAY[
        'charge.pending', 'charge.succeeded', 'charge.failed',
        'refund.pending', 'refund.succeeded', 'refund.failed',
        'webhook_endpoint.disabled']);

CREATE UNIQUE INDEX webhook_endpoints_one_per_slot ON webhook_endpoints (merchant_id, slot);

ALTER TABLE events ADD COLUMN webhook_endpoint_id uuid;
ALTER TABLE events DROP CONSTRAINT events_type_valid;
ALTER TABLE events
    ADD CONSTRAINT events_type_valid CHECK (type IN (
        'charge.pending', 'charge.succeeded', 'charge.failed',
        'refund.pending', 'refund.succeeded', 'refund.failed',
        'webhook_endpoint.disabled'));
ALTER TABLE events DROP CONSTRAINT events_about_its_object;
ALTER TABLE events
    ADD CONSTRAINT events_about_its_object CHECK (
        CASE WHEN type LIKE 'charge.%'
                  THEN charge_id IS NOT NULL AND refund_id IS NULL AND webhook_endpoint_id IS NULL
             WHEN type LIKE 'refund.%'
                  THEN refund_id IS NOT NULL AND charge_id IS NULL AND webhook_endpoint_id IS NULL
             ELSE webhook_endpoint_id IS NOT NULL AND charge_id IS NULL AND refund_id IS NULL END);
ALTER TABLE events
    ADD CONSTRAINT events_webhook_endpoint_fkey FOREIGN KEY (webhook_endpoint_id, merchant_id)
        REFERENCES webhook_endpoints (id, merchant_id);

CREATE UNIQUE INDEX events_one_per_endpoint_change ON events (merchant_id, webhook_endpoint_id, type)
    WHERE webhook_endpoint_id IS NOT NULL;

ALTER TABLE event_queue
    ADD COLUMN attempts integer NOT NULL DEFAULT 0
        CONSTRAINT event_queue_attempts_non_negative CHECK (attempts >= 0),
    ADD COLUMN next_attempt_at timestamptz,
    ADD COLUMN last_error text;

END $$;
