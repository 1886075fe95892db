-- latch schema v1 (PostgreSQL). Times are BIGINT milliseconds since the Unix epoch, UTC.
-- Ids collate bytewise ("C"), so pages and cursors order them as SQLite does.

CREATE TABLE sensors (
    id                  TEXT COLLATE "C" PRIMARY KEY,
    address             TEXT NOT NULL,
    heartbeat_timeout_s INTEGER,
    created_at          BIGINT NOT NULL
);

-- Current state, hash-partitioned by sensor so the hottest table spreads over several heaps
-- and indexes (and vacuums in parts). A sensor that never reported has no row.
CREATE TABLE sensor_state (
    sensor_id    TEXT NOT NULL,
    data         BOOLEAN,
    changed_at   BIGINT,
    last_ts      BIGINT,
    last_seen_at BIGINT,
    connection   TEXT NOT NULL DEFAULT 'unknown',
    PRIMARY KEY (sensor_id)
) PARTITION BY HASH (sensor_id);
CREATE TABLE sensor_state_p0 PARTITION OF sensor_state FOR VALUES WITH (MODULUS 8, REMAINDER 0);
CREATE TABLE sensor_state_p1 PARTITION OF sensor_state FOR VALUES WITH (MODULUS 8, REMAINDER 1);
CREATE TABLE sensor_state_p2 PARTITION OF sensor_state FOR VALUES WITH (MODULUS 8, REMAINDER 2);
CREATE TABLE sensor_state_p3 PARTITION OF sensor_state FOR VALUES WITH (MODULUS 8, REMAINDER 3);
CREATE TABLE sensor_state_p4 PARTITION OF sensor_state FOR VALUES WITH (MODULUS 8, REMAINDER 4);
CREATE TABLE sensor_state_p5 PARTITION OF sensor_state FOR VALUES WITH (MODULUS 8, REMAINDER 5);
CREATE TABLE sensor_state_p6 PARTITION OF sensor_state FOR VALUES WITH (MODULUS 8, REMAINDER 6);
CREATE TABLE sensor_state_p7 PARTITION OF sensor_state FOR VALUES WITH (MODULUS 8, REMAINDER 7);

CREATE TABLE clients (
    id         TEXT COLLATE "C" PRIMARY KEY,
    name       TEXT NOT NULL,
    url        TEXT NOT NULL,
    secret     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE links (
    client_id  TEXT NOT NULL,
    sensor_id  TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (client_id, sensor_id)
);
CREATE INDEX links_by_sensor ON links (sensor_id, client_id);

-- History, range-partitioned by time: monthly partitions are created ahead by latch (see
-- ensure_partitions); rows outside them land in the default partition.
CREATE TABLE readings (
    id          BIGINT GENERATED ALWAYS AS IDENTITY,
    sensor_id   TEXT NOT NULL,
    ts          BIGINT NOT NULL,
    received_at BIGINT NOT NULL,
    data        BOOLEAN NOT NULL,
    late        BOOLEAN NOT NULL
) PARTITION BY RANGE (ts);
CREATE TABLE readings_default PARTITION OF readings DEFAULT;
CREATE INDEX readings_by_sensor_ts ON readings (sensor_id, ts, id);

CREATE TABLE events (
    id           BIGINT GENERATED ALWAYS AS IDENTITY,
    sensor_id    TEXT NOT NULL,
    kind         TEXT NOT NULL,
    at           BIGINT NOT NULL,
    data         BOOLEAN,
    previous     BOOLEAN,
    last_seen_at BIGINT
) PARTITION BY RANGE (at);
CREATE TABLE events_default PARTITION OF events DEFAULT;
CREATE INDEX events_by_sensor_at ON events (sensor_id, at, id);

-- The outbox. seq is the order lanes send in.
CREATE TABLE notifications (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    client_id       TEXT NOT NULL,
    sensor_id       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    data            BOOLEAN,
    previous        BOOLEAN,
    occurred_at     BIGINT NOT NULL,
    last_seen_at    BIGINT,
    status          TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    claimed_by      TEXT,
    lease_until     BIGINT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE status = 'pending';
CREATE INDEX notifications_pending_by_sensor ON notifications (sensor_id, seq) WHERE status = 'pending';
CREATE INDEX notifications_pending_by_client ON notifications (client_id) WHERE status = 'pending';
CREATE INDEX notifications_by_client ON notifications (client_id, seq);
CREATE INDEX notifications_by_sensor ON notifications (sensor_id, seq);

CREATE TABLE attempts (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    notification_id TEXT NOT NULL,
    at              BIGINT NOT NULL,
    status_code     INTEGER,
    error           TEXT,
    duration_ms     BIGINT NOT NULL
);
CREATE INDEX attempts_by_notification ON attempts (notification_id, id);
