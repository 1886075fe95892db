-- latch schema v1 (SQLite). Times are INTEGER milliseconds since the Unix epoch, UTC.

CREATE TABLE sensors (
    id                  TEXT PRIMARY KEY,
    address             TEXT NOT NULL,
    heartbeat_timeout_s INTEGER,
    created_at          INTEGER NOT NULL
) WITHOUT ROWID;

-- Current state; a sensor that never reported has no row (connection 'unknown').
CREATE TABLE sensor_state (
    sensor_id    TEXT PRIMARY KEY,
    data         INTEGER,
    changed_at   INTEGER,
    last_ts      INTEGER,
    last_seen_at INTEGER,
    connection   TEXT NOT NULL DEFAULT 'unknown'
) WITHOUT ROWID;

CREATE TABLE clients (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    url        TEXT NOT NULL,
    secret     TEXT NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE links (
    client_id  TEXT NOT NULL,
    sensor_id  TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (client_id, sensor_id)
) WITHOUT ROWID;
CREATE INDEX links_by_sensor ON links (sensor_id, client_id);

CREATE TABLE readings (
    id          INTEGER PRIMARY KEY,
    sensor_id   TEXT NOT NULL,
    ts          INTEGER NOT NULL,
    received_at INTEGER NOT NULL,
    data        INTEGER NOT NULL,
    late        INTEGER NOT NULL
);
CREATE INDEX readings_by_sensor_ts ON readings (sensor_id, ts);

CREATE TABLE events (
    id           INTEGER PRIMARY KEY,
    sensor_id    TEXT NOT NULL,
    kind         TEXT NOT NULL,
    at           INTEGER NOT NULL,
    data         INTEGER,
    previous     INTEGER,
    last_seen_at INTEGER
);
CREATE INDEX events_by_sensor_at ON events (sensor_id, at);

-- The outbox. seq is the order lanes send in.
CREATE TABLE notifications (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    client_id       TEXT NOT NULL,
    sensor_id       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    data            INTEGER,
    previous        INTEGER,
    occurred_at     INTEGER NOT NULL,
    last_seen_at    INTEGER,
    status          TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    claimed_by      TEXT,
    lease_until     INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX notifications_pending_by_sensor ON notifications (sensor_id) WHERE status = 'pending';
CREATE INDEX notifications_pending_by_client ON notifications (client_id) WHERE status = 'pending';
CREATE INDEX notifications_by_client ON notifications (client_id, seq);
CREATE INDEX notifications_by_sensor ON notifications (sensor_id, seq);

CREATE TABLE attempts (
    id              INTEGER PRIMARY KEY,
    notification_id TEXT NOT NULL,
    at              INTEGER NOT NULL,
    status_code     INTEGER,
    error           TEXT,
    duration_ms     INTEGER NOT NULL
);
CREATE INDEX attempts_by_notification ON attempts (notification_id);
