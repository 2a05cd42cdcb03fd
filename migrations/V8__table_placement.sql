-- Version 8: every table says where it lives on a distributed database.
--
-- With the Citus extension (docs/scaling.md), the per-merchant tables are
-- distributed on merchant_id and co-located with `charges`, and the tenant
-- tables (`merchants`, `api_keys`) are reference tables, copied to every
-- node. `chargeonce migrate` distributes the tables of versions 1 to 8 right
-- after this migration (src/db/citus.rs), so on Citus every later migration
-- runs on a distributed database, and is written for one:
--
-- * It places each table it creates, before giving it foreign keys (Citus
--   refuses a foreign key between a distributed table and one that is not
--   yet distributed), and adds the table to `citus::TABLES`, which places
--   the tables of a database that gets Citus after it was migrated:
--     CREATE TABLE disputes (...);                      -- no foreign keys
--     PERFORM place_table('disputes', 'by_merchant');   -- or 'reference'
--     ALTER TABLE disputes ADD CONSTRAINT ... FOREIGN KEY ...;
-- * Its statements run inside one `DO $$ BEGIN ... END $$;` block. The
--   migration runner sends a migration file as one query string, and
--   Citus sends most DDL on a distributed table (CREATE INDEX, ADD
--   CONSTRAINT, ALTER COLUMN, ...) to the shards as that query string,
--   which the workers refuse when it holds several commands ("cannot insert
--   multiple commands into a prepared statement"; citusdata/citus#6608,
--   rust-db/refinery#314). In a DO block each statement is its own query.
--
-- tests/api/schema.rs checks both on every run. On PostgreSQL without
-- Citus, place_table does nothing.

CREATE FUNCTION place_table(tbl regclass, placement text) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF placement NOT IN ('by_merchant', 'reference') THEN
        RAISE EXCEPTION 'place_table: placement must be by_merchant or reference, not %', placement;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    -- Idempotent: a table already distributed or made a reference table is
    -- left as it is (one placed otherwise than asked is for the schema test
    -- to report). PL/pgSQL resolves pg_dist_partition, which exists only
    -- with the extension, when it first runs this line.
    IF EXISTS (SELECT 1 FROM pg_dist_partition
                WHERE logicalrelid = tbl AND (partmethod = 'h' OR repmodel = 't')) THEN
        RETURN;
    END IF;
    -- One connection per node for the rest of the transaction: a migration
    -- that distributes a table and then adds a foreign key to it in the
    -- same transaction needs it.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    IF placement = 'reference' THEN
        PERFORM create_reference_table(tbl);
    ELSIF tbl = 'charges'::regclass THEN
        PERFORM create_distributed_table(tbl, 'merchant_id');
    ELSE
        PERFORM create_distributed_table(tbl, 'merchant_id', colocate_with => 'charges');
    END IF;
END
$$;
