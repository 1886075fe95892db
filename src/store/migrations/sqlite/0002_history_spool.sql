-- latch schema v2: history tables double as the ClickHouse spool.
--
-- With ClickHouse configured, readings and events leave these tables once shipped. Their
-- ids must then never be reused (a plain rowid restarts after the table empties), or a new
-- row would share its id with a shipped one: AUTOINCREMENT guarantees that.
CREATE TABLE readings_v2 (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    sensor_id   TEXT NOT NULL,
    ts          INTEGER NOT NULL,
    received_at INTEGER NOT NULL,
    data        INTEGER NOT NULL,
    late        INTEGER NOT NULL
);
INSERT INTO readings_v2 (id, sensor_id, ts, received_at, data, late)
    SELECT id, sensor_id, ts, received_at, data, late FROM readings;
DROP TABLE readings;
ALTER TABLE readings_v2 RENAME TO readings;
CREATE INDEX readings_by_sensor_ts ON readings (sensor_id, ts);

CREATE TABLE events_v2 (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    sensor_id    TEXT NOT NULL,
    kind         TEXT NOT NULL,
    at           INTEGER NOT NULL,
    data         INTEGER,
    previous     INTEGER,
    last_seen_at INTEGER
);
INSERT INTO events_v2 (id, sensor_id, kind, at, data, previous, last_seen_at)
    SELECT id, sensor_id, kind, at, data, previous, last_seen_at FROM events;
DROP TABLE events;
ALTER TABLE events_v2 RENAME TO events;
CREATE INDEX events_by_sensor_at ON events (sensor_id, at);

-- Attempts stay in the outbox (the API shows them with their notification) and are copied
-- to ClickHouse; this marks the copied ones.
ALTER TABLE attempts ADD COLUMN shipped INTEGER NOT NULL DEFAULT 0;
CREATE INDEX attempts_unshipped ON attempts (id) WHERE shipped = 0;
