-- Version 2: the pace of processor retries is recorded on the charge, so the
-- recovery worker backs off per charge and a restart keeps the pace.
-- Expand only: both columns have constant defaults (instant on PostgreSQL 11+).

ALTER TABLE charges
    -- Processor calls for this charge that ended without a final answer
    -- (timeout, 5xx, 429, a conflict on the processor's key).
    ADD COLUMN processor_attempts integer NOT NULL DEFAULT 0
        CONSTRAINT charges_processor_attempts_non_negative CHECK (processor_attempts >= 0),
    -- The recovery worker leaves the charge alone until then. A client's
    -- retry with the same key does not wait for it.
    ADD COLUMN next_attempt_at timestamptz;
