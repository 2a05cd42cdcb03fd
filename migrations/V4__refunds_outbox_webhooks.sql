-- Version 4: refunds; the outbox made complete (every state change of a
-- charge or a refund is one event) and delivered by webhooks; and every key
-- of a per-merchant table includes merchant_id, so the schema can be
-- distributed by merchant (docs/scaling.md). `merchants` is the tenant table
-- itself and `api_keys` is looked up by the key alone (before the merchant is
-- known): both would be reference tables, and keep their keys.
--
-- On a large live table, the primary key change and the new constraints
-- below lock `charges` while they build and validate; build the unique index
-- first with CREATE UNIQUE INDEX CONCURRENTLY and attach it with
-- ADD CONSTRAINT ... PRIMARY KEY USING INDEX (expand, then contract).

-- Charges: the primary key carries the merchant.
ALTER TABLE events DROP CONSTRAINT events_charge_id_fkey;
ALTER TABLE charges DROP CONSTRAINT charges_pkey;
ALTER TABLE charges ADD CONSTRAINT charges_pkey PRIMARY KEY (id, merchant_id);

-- What refunds take from a charge. `refunds_reserved` is the sum of its
-- pending and succeeded refunds; a refund is created only by raising it
-- within the charge's amount, in the same transaction (never a read in the
-- application followed by a write), and a failed refund gives its amount
-- back. `amount_refunded` is the succeeded part. The checks catch a bug
-- that would break either rule.
ALTER TABLE charges
    ADD COLUMN refunds_reserved bigint NOT NULL DEFAULT 0,
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT charges_refunds_within_amount
        CHECK (refunds_reserved >= 0 AND refunds_reserved <= amount),
    ADD CONSTRAINT charges_refunded_within_reserved
        CHECK (amount_refunded >= 0 AND amount_refunded <= refunds_reserved),
    ADD CONSTRAINT charges_refunds_only_of_succeeded
        CHECK (refunds_reserved = 0 OR status = 'succeeded');

-- A refund row is also its idempotency record, exactly like a charge: its
-- own key space per merchant, the fingerprint, the processing lease.
CREATE TABLE refunds (
    id                     uuid        NOT NULL,          -- UUIDv7: time-ordered
    merchant_id            uuid        NOT NULL REFERENCES merchants (id),
    charge_id              uuid        NOT NULL,
    -- NULL once the retention window has passed and the sweeper released it.
    client_idempotency_key text        CONSTRAINT refunds_key_format
                                       CHECK (client_idempotency_key ~ '^[!-~]{1,255}$'),
    request_fingerprint    bytea       NOT NULL CONSTRAINT refunds_fingerprint_length
                                       CHECK (octet_length(request_fingerprint) = 32),
    amount                 bigint      NOT NULL CONSTRAINT refunds_amount_positive CHECK (amount > 0),
    currency               text        NOT NULL CONSTRAINT refunds_currency_format
                                       CHECK (currency ~ '^[A-Z]{3}$'),
    reason                 text        CONSTRAINT refunds_reason_valid
                                       CHECK (reason IN ('duplicate', 'fraudulent', 'requested_by_customer')),
    metadata               jsonb       NOT NULL DEFAULT '{}' CONSTRAINT refunds_metadata_object
                                       CHECK (jsonb_typeof(metadata) = 'object'),
    status                 text        NOT NULL CONSTRAINT refunds_status_valid
                                       CHECK (status IN ('pending', 'succeeded', 'failed')),
    failure_code           text,
    failure_message        text,
    -- The processor's payment this refunds (the charge's), and its refund.
    processor_payment_id   text        NOT NULL,
    processor_refund_id    text,
    locked_until           timestamptz,
    processor_attempts     integer     NOT NULL DEFAULT 0
                                       CONSTRAINT refunds_processor_attempts_non_negative
                                       CHECK (processor_attempts >= 0),
    next_attempt_at        timestamptz,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT refunds_pkey PRIMARY KEY (id, merchant_id),
    CONSTRAINT refunds_merchant_key_unique UNIQUE (merchant_id, client_idempotency_key),
    CONSTRAINT refunds_charge_fkey FOREIGN KEY (charge_id, merchant_id)
        REFERENCES charges (id, merchant_id),
    CONSTRAINT refunds_failure_iff_failed CHECK ((status = 'failed') = (failure_code IS NOT NULL)),
    CONSTRAINT refunds_pending_has_lease CHECK (status <> 'pending' OR locked_until IS NOT NULL),
    CONSTRAINT refunds_final_has_no_lease CHECK (status = 'pending' OR locked_until IS NULL)
);
-- Listing, newest first per merchant: partial on a predicate only the
-- listing statement states, so no key lookup can pick it (see V3).
CREATE INDEX refunds_listing ON refunds (merchant_id, id DESC) WHERE status IS NOT NULL;
-- A charge's refunds; led by the charge, so it never competes with the key.
CREATE INDEX refunds_of_charge ON refunds (charge_id, merchant_id, id DESC);
-- Pending refunds, for the recovery worker; held keys, for the sweeper.
CREATE INDEX refunds_pending_lease ON refunds (locked_until) WHERE status = 'pending';
CREATE INDEX refunds_held_keys ON refunds (id) WHERE client_idempotency_key IS NOT NULL;

-- The outbox: one event per state change of a charge or a refund, written in
-- the same transaction as the change. `data` is the object as the change
-- left it. `dispatched` turns true once the event has been handed to the
-- merchant's webhook endpoints (one delivery row each).
ALTER TABLE events RENAME COLUMN payload TO data;
ALTER TABLE events ALTER COLUMN charge_id DROP NOT NULL;
ALTER TABLE events
    ADD COLUMN refund_id uuid,
    ADD COLUMN dispatched boolean NOT NULL DEFAULT false;
ALTER TABLE events DROP CONSTRAINT events_pkey;
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (id, merchant_id);
ALTER TABLE events DROP CONSTRAINT events_type_valid;
ALTER TABLE events DROP CONSTRAINT events_one_per_transition;
ALTER TABLE events
    ADD CONSTRAINT events_type_valid CHECK (type IN (
        'charge.pending', 'charge.succeeded', 'charge.failed',
        'refund.pending', 'refund.succeeded', 'refund.failed')),
    ADD CONSTRAINT events_about_its_object CHECK (
        CASE WHEN type LIKE 'charge.%' THEN charge_id IS NOT NULL AND refund_id IS NULL
             ELSE refund_id IS NOT NULL AND charge_id IS NULL END),
    ADD CONSTRAINT events_one_per_charge_change UNIQUE (merchant_id, charge_id, type),
    ADD CONSTRAINT events_one_per_refund_change UNIQUE (merchant_id, refund_id, type),
    ADD CONSTRAINT events_charge_fkey FOREIGN KEY (charge_id, merchant_id)
        REFERENCES charges (id, merchant_id),
    ADD CONSTRAINT events_refund_fkey FOREIGN KEY (refund_id, merchant_id)
        REFERENCES refunds (id, merchant_id);
DROP INDEX events_merchant;
CREATE INDEX events_listing ON events (merchant_id, id DESC);
CREATE INDEX events_undispatched ON events (id) WHERE NOT dispatched;

-- Where a merchant wants its events. The signing secret is stored as it is:
-- signing needs it (so do not hand out database access you would not hand
-- out the secrets with). Deleting an endpoint keeps the row (its deliveries
-- refer to it) and stops deliveries to it.
CREATE TABLE webhook_endpoints (
    id                     uuid        NOT NULL,
    merchant_id            uuid        NOT NULL REFERENCES merchants (id),
    url                    text        NOT NULL CONSTRAINT webhook_endpoints_url_format
                                       CHECK (url ~ '^https?://' AND char_length(url) <= 2048),
    -- NULL: every type.
    event_types            text[]      CONSTRAINT webhook_endpoints_types_valid
                                       CHECK (event_types <@ ARRAY[
                                           'charge.pending', 'charge.succeeded', 'charge.failed',
                                           'refund.pending', 'refund.succeeded', 'refund.failed']),
    secret                 text        NOT NULL CONSTRAINT webhook_endpoints_secret_format
                                       CHECK (secret ~ '^whsec_[A-Za-z0-9+/=]{20,}$'),
    client_idempotency_key text        CONSTRAINT webhook_endpoints_key_format
                                       CHECK (client_idempotency_key ~ '^[!-~]{1,255}$'),
    request_fingerprint    bytea       NOT NULL CONSTRAINT webhook_endpoints_fingerprint_length
                                       CHECK (octet_length(request_fingerprint) = 32),
    created_at             timestamptz NOT NULL DEFAULT now(),
    deleted_at             timestamptz,
    CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (id, merchant_id),
    CONSTRAINT webhook_endpoints_merchant_key_unique UNIQUE (merchant_id, client_idempotency_key)
);
CREATE INDEX webhook_endpoints_of_merchant ON webhook_endpoints (merchant_id, id DESC)
    WHERE deleted_at IS NULL;

-- One delivery per event and endpoint, tried until delivered or out of
-- attempts. A delivery being sent holds a lease, so two instances never send
-- one event to one endpoint at the same time.
CREATE TABLE webhook_deliveries (
    id               uuid        NOT NULL,
    merchant_id      uuid        NOT NULL,
    event_id         uuid        NOT NULL,
    endpoint_id      uuid        NOT NULL,
    status           text        NOT NULL CONSTRAINT webhook_deliveries_status_valid
                                 CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0 CONSTRAINT webhook_deliveries_attempts_non_negative
                                 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    locked_until     timestamptz,
    last_status_code integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id, merchant_id),
    CONSTRAINT webhook_deliveries_one_per_endpoint UNIQUE (merchant_id, event_id, endpoint_id),
    CONSTRAINT webhook_deliveries_event_fkey FOREIGN KEY (event_id, merchant_id)
        REFERENCES events (id, merchant_id) ON DELETE CASCADE,
    CONSTRAINT webhook_deliveries_endpoint_fkey FOREIGN KEY (endpoint_id, merchant_id)
        REFERENCES webhook_endpoints (id, merchant_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

-- Every attempt of a delivery: what the receiver answered, or why not.
CREATE TABLE webhook_attempts (
    id          uuid        NOT NULL,
    merchant_id uuid        NOT NULL,
    delivery_id uuid        NOT NULL,
    attempt     integer     NOT NULL CONSTRAINT webhook_attempts_attempt_positive CHECK (attempt > 0),
    status_code integer,
    error       text,
    duration_ms integer     NOT NULL CONSTRAINT webhook_attempts_duration_non_negative
                            CHECK (duration_ms >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_attempts_pkey PRIMARY KEY (id, merchant_id),
    CONSTRAINT webhook_attempts_one_per_number UNIQUE (merchant_id, delivery_id, attempt),
    CONSTRAINT webhook_attempts_delivery_fkey FOREIGN KEY (delivery_id, merchant_id)
        REFERENCES webhook_deliveries (id, merchant_id) ON DELETE CASCADE
);
