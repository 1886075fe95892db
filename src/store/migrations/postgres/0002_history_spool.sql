-- latch schema v2: history tables double as the ClickHouse spool.
--
-- With ClickHouse configured, readings and events leave these tables once shipped, oldest
-- id first (identity ids are never reused); attempts stay in the outbox and are marked.
CREATE INDEX readings_by_id ON readings (id);
CREATE INDEX events_by_id ON events (id);
ALTER TABLE attempts ADD COLUMN shipped BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX attempts_unshipped ON attempts (id) WHERE NOT shipped;
