-- latch schema: the partition function is the database's (issue #37).
--
-- latch_cluster.scheme: how sensors map to partitions, fixed with the partition count.
-- Databases that exist keep MD5 ranges ('md5'); a database first used by this version takes
-- the bucket of RabbitMQ's consistent-hash exchange ('exchange', `domain::partition`), so
-- each partition's queue of the exchange holds exactly its sensors.
--
-- sensors.hash stays the column every partition's range scan reads, but latch writes it
-- with every sensor (the exchange's function is not one PostgreSQL computes): the
-- generated column becomes a plain one, keeping its values (PostgreSQL 13's DROP
-- EXPRESSION, no rewrite), and NOT NULL, so an insert without it fails rather than put a
-- sensor in no partition.

DO $$
BEGIN
    IF current_setting('server_version_num')::int < 130000 THEN
        RAISE EXCEPTION 'latch needs PostgreSQL 13 or later (this is %)', version();
    END IF;
END $$;

ALTER TABLE latch_cluster ADD COLUMN scheme TEXT NOT NULL DEFAULT 'md5'
    CHECK (scheme IN ('md5', 'exchange'));
ALTER TABLE latch_cluster ALTER COLUMN scheme DROP DEFAULT;

ALTER TABLE sensors ALTER COLUMN hash DROP EXPRESSION;
ALTER TABLE sensors ALTER COLUMN hash SET NOT NULL;

-- A database already in use is an MD5 one for good. A node of the previous version still
-- running during a rolling upgrade inserts sensors without the hash: this fills in the
-- value that version's generated column gave. Databases first used by this version have
-- no such nodes and no trigger.
CREATE FUNCTION latch_md5_hash() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.hash := COALESCE(NEW.hash, ('x' || substr(md5(NEW.id), 1, 8))::bit(32)::int8);
    RETURN NEW;
END $$;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM latch_cluster) OR EXISTS (SELECT 1 FROM sensors) THEN
        CREATE TRIGGER sensors_md5_hash BEFORE INSERT ON sensors
            FOR EACH ROW EXECUTE FUNCTION latch_md5_hash();
    END IF;
END $$;
