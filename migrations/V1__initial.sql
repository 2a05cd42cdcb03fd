-- chargeonce schema, version 1.
-- The database guards the invariants by itself: every rule the service relies
-- on is a named constraint, so a bug in the application cannot break it.

CREATE TABLE merchants (
    id          uuid        PRIMARY KEY,
    name        text        NOT NULL CONSTRAINT merchants_name_length CHECK (char_length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Secret API keys are stored as SHA-256 digests only. The secrets are 192-bit
-- random strings, so a fast hash is enough: there is nothing to brute-force.
CREATE TABLE api_keys (
    key_hash    bytea       PRIMARY KEY CONSTRAINT api_keys_hash_length CHECK (octet_length(key_hash) = 32),
    merchant_id uuid        NOT NULL REFERENCES merchants (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_merchant ON api_keys (merchant_id);

-- A charge row is also its idempotency record: the key, the request
-- fingerprint and the processing lease live here, and the row is the stored
-- response that replays are rendered from.
CREATE TABLE charges (
    id                     uuid        PRIMARY KEY,           -- UUIDv7: time-ordered
    merchant_id            uuid        NOT NULL REFERENCES merchants (id),
    -- NULL once the retention window has passed and the sweeper released it.
    client_idempotency_key text        CONSTRAINT charges_key_format
                                       CHECK (client_idempotency_key ~ '^[!-~]{1,255}$'),
    request_fingerprint    bytea       NOT NULL CONSTRAINT charges_fingerprint_length
                                       CHECK (octet_length(request_fingerprint) = 32),
    amount                 bigint      NOT NULL CONSTRAINT charges_amount_range
                                       CHECK (amount > 0 AND amount <= 99999999999),
    currency               text        NOT NULL CONSTRAINT charges_currency_format
                                       CHECK (currency ~ '^[A-Z]{3}$'),
    customer               text        CONSTRAINT charges_customer_length CHECK (char_length(customer) <= 255),
    description            text        CONSTRAINT charges_description_length CHECK (char_length(description) <= 1000),
    metadata               jsonb       NOT NULL DEFAULT '{}' CONSTRAINT charges_metadata_object
                                       CHECK (jsonb_typeof(metadata) = 'object'),
    status                 text        NOT NULL CONSTRAINT charges_status_valid
                                       CHECK (status IN ('pending', 'succeeded', 'failed')),
    failure_code           text,
    failure_message        text,
    processor_payment_id   text,
    -- The processing lease: while it lies in the future, a request is calling
    -- the processor for this charge and nobody else may.
    locked_until           timestamptz,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT charges_merchant_key_unique UNIQUE (merchant_id, client_idempotency_key),
    CONSTRAINT charges_failure_iff_failed CHECK ((status = 'failed') = (failure_code IS NOT NULL)),
    CONSTRAINT charges_pending_has_lease CHECK (status <> 'pending' OR locked_until IS NOT NULL),
    CONSTRAINT charges_final_has_no_lease CHECK (status = 'pending' OR locked_until IS NULL)
);
-- Listing, newest first per merchant (ids are time-ordered).
CREATE INDEX charges_merchant_id_desc ON charges (merchant_id, id DESC);
-- Pending charges, for the recovery of abandoned leases.
CREATE INDEX charges_pending_lease ON charges (locked_until) WHERE status = 'pending';
-- Keys still held, for the retention sweeper.
CREATE INDEX charges_held_keys ON charges (id) WHERE client_idempotency_key IS NOT NULL;

-- The transactional outbox: one row per state change, written in the same
-- transaction as the change.
CREATE TABLE events (
    id          uuid        PRIMARY KEY,
    merchant_id uuid        NOT NULL REFERENCES merchants (id),
    charge_id   uuid        NOT NULL REFERENCES charges (id),
    type        text        NOT NULL CONSTRAINT events_type_valid
                            CHECK (type IN ('charge.succeeded', 'charge.failed')),
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_one_per_transition UNIQUE (charge_id, type)
);
CREATE INDEX events_merchant ON events (merchant_id, id);
