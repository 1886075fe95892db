-- latch schema v3: a log of registry changes, so every node's engine follows sensors
-- created, changed or deleted through another node's API. Rows older than an hour are
-- pruned; a node that was away longer reloads everything at start anyway.
CREATE TABLE sensor_changes (
    seq       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sensor_id TEXT NOT NULL,
    at        BIGINT NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);
