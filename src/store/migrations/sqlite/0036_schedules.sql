-- Weekly schedules in an IANA zone (issue #73): the schedule as the API writes it (JSON),
-- for silences and sensors' arming to name.
CREATE TABLE schedules (
    id         TEXT PRIMARY KEY,
    body       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
