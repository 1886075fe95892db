-- latch schema v6: cluster mode. Several nodes share this database; the fleet is divided
-- into a fixed number of partitions, each leased by one node at a time.

-- The sensor's 32-bit hash (`domain::partition::hash32`: the first four bytes of the MD5
-- of its id), so a partition's sensors are one range of this index.
ALTER TABLE sensors
    ADD COLUMN hash BIGINT GENERATED ALWAYS AS (('x' || substr(md5(id), 1, 8))::bit(32)::int8) STORED;
CREATE INDEX sensors_hash ON sensors (hash);

-- The partition count, fixed by the first node that uses the database: a sensor's
-- partition must never change.
CREATE TABLE latch_cluster (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    partitions INTEGER NOT NULL
);

-- One lease per partition (rows made when the count is fixed). The epoch grows at every
-- change of owner; a commit checks it under a share lock (fencing). Times are the
-- database's, never a node's.
CREATE TABLE latch_partitions (
    partition  INTEGER PRIMARY KEY,
    owner      TEXT,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);

-- Registered nodes and where the others reach them.
CREATE TABLE latch_nodes (
    id           TEXT PRIMARY KEY,
    address      TEXT NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
