-- Version 10: a batch of one merchant's outcomes is recorded by one call.
--
-- For each record of the batch, in the order given (ids ascending, so two
-- batches lock rows in the same order): its update from pending to the
-- outcome, its event, and the event's queue row if a live endpoint of the
-- merchant wants that type (an event no endpoint wants has nothing to fan
-- out); for a refund also its charge's refunded and reserved amounts. A
-- record no longer pending (another request recorded it first) is skipped.
-- Each function returns the records it changed, as they are now. The two
-- are alike on purpose: one function over both tables would need dynamic
-- SQL, planned again at every call.
--
-- One call instead of one statement per change: on Citus the coordinator
-- hands the whole call to the merchant's worker (`place_function` below
-- distributes it by its first argument, co-located with `charges`), one
-- round trip instead of one per statement, and each statement inside runs
-- on that worker's own shards. On PostgreSQL it saves the per-statement
-- protocol round and the transaction's BEGIN and COMMIT.
--
-- Every statement inside names the merchant, so on Citus each runs on one
-- shard. Each takes its values from the loop's row, never as an element of
-- an array parameter: Citus 13.2 crashes the backend on an UPDATE whose SET
-- names an array element of a PL/pgSQL parameter (`SET status =
-- p_statuses[i]`). "pending" is said as `status IS NOT DISTINCT FROM 'pending'`, which
-- implies no partial index's predicate (src/db/mod.rs, `Statement`).

DO $$ BEGIN

CREATE FUNCTION place_function(fn regprocedure) RETURNS void
    LANGUAGE plpgsql AS $body$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    -- Idempotent: a function already distributed is left as it is.
    IF EXISTS (SELECT 1 FROM pg_dist_object
                WHERE classid = 'pg_proc'::regclass AND objid = fn
                  AND distribution_argument_index IS NOT NULL) THEN
        RETURN;
    END IF;
    PERFORM create_distributed_function(fn, '$1', colocate_with => 'charges');
END
$body$;

CREATE FUNCTION record_charge_outcomes(
    p_merchant uuid, p_ids uuid[], p_statuses text[], p_failure_codes text[],
    p_failure_messages text[], p_processor_ids text[], p_event_ids uuid[],
    p_event_data jsonb[])
    RETURNS SETOF charges LANGUAGE plpgsql AS $body$
DECLARE
    o record;
    changed charges;
BEGIN
    FOR o IN SELECT * FROM unnest(p_ids, p_statuses, p_failure_codes, p_failure_messages,
                                  p_processor_ids, p_event_ids, p_event_data)
                        AS given (id, status, failure_code, failure_message, processor_id,
                              event_id, event_data)
    LOOP
        UPDATE charges
           SET status = o.status, failure_code = o.failure_code,
               failure_message = o.failure_message, processor_payment_id = o.processor_id,
               locked_until = NULL, updated_at = now()
         WHERE merchant_id = p_merchant AND id = o.id
           AND status IS NOT DISTINCT FROM 'pending'
        RETURNING * INTO changed;
        CONTINUE WHEN NOT FOUND;
        INSERT INTO events (id, merchant_id, charge_id, type, data)
        VALUES (o.event_id, p_merchant, changed.id, 'charge.' || changed.status,
                o.event_data);
        IF EXISTS (SELECT 1 FROM webhook_endpoints e
                    WHERE e.merchant_id = p_merchant
                      AND e.deleted_at IS NULL AND e.disabled_at IS NULL
                      AND (e.event_types IS NULL
                           OR 'charge.' || changed.status = ANY (e.event_types))) THEN
            INSERT INTO event_queue (event_id, merchant_id, type)
            VALUES (o.event_id, p_merchant, 'charge.' || changed.status);
        END IF;
        RETURN NEXT changed;
    END LOOP;
END
$body$;

CREATE FUNCTION record_refund_outcomes(
    p_merchant uuid, p_ids uuid[], p_statuses text[], p_failure_codes text[],
    p_failure_messages text[], p_processor_ids text[], p_event_ids uuid[],
    p_event_data jsonb[])
    RETURNS SETOF refunds LANGUAGE plpgsql AS $body$
DECLARE
    o record;
    changed refunds;
BEGIN
    FOR o IN SELECT * FROM unnest(p_ids, p_statuses, p_failure_codes, p_failure_messages,
                                  p_processor_ids, p_event_ids, p_event_data)
                        AS given (id, status, failure_code, failure_message, processor_id,
                              event_id, event_data)
    LOOP
        UPDATE refunds
           SET status = o.status, failure_code = o.failure_code,
               failure_message = o.failure_message, processor_refund_id = o.processor_id,
               locked_until = NULL, updated_at = now()
         WHERE merchant_id = p_merchant AND id = o.id
           AND status IS NOT DISTINCT FROM 'pending'
        RETURNING * INTO changed;
        CONTINUE WHEN NOT FOUND;
        -- A succeeded refund adds to the charge's refunded amount; a failed
        -- one gives its reservation back.
        UPDATE charges
           SET amount_refunded = amount_refunded
                   + CASE WHEN changed.status = 'succeeded' THEN changed.amount ELSE 0 END,
               refunds_reserved = refunds_reserved
                   - CASE WHEN changed.status = 'failed' THEN changed.amount ELSE 0 END,
               updated_at = now()
         WHERE merchant_id = p_merchant AND id = changed.charge_id;
        INSERT INTO events (id, merchant_id, refund_id, type, data)
        VALUES (o.event_id, p_merchant, changed.id, 'refund.' || changed.status,
                o.event_data);
        IF EXISTS (SELECT 1 FROM webhook_endpoints e
                    WHERE e.merchant_id = p_merchant
                      AND e.deleted_at IS NULL AND e.disabled_at IS NULL
                      AND (e.event_types IS NULL
                           OR 'refund.' || changed.status = ANY (e.event_types))) THEN
            INSERT INTO event_queue (event_id, merchant_id, type)
            VALUES (o.event_id, p_merchant, 'refund.' || changed.status);
        END IF;
        RETURN NEXT changed;
    END LOOP;
END
$body$;

PERFORM place_function('record_charge_outcomes(uuid, uuid[], text[], text[], text[], text[], uuid[], jsonb[])');
PERFORM place_function('record_refund_outcomes(uuid, uuid[], text[], text[], text[], text[], uuid[], jsonb[])');

END $$;
