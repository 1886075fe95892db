-- latch schema v19: new events land in a journal without an index, as readings do (v3),
-- and a move every second takes them into `events`, sorted by sensor and time:
-- `events_by_sensor_at` then gets a second's events in key order, about a page once a
-- move, instead of one random leaf an event in every group commit (half of what a commit
-- wrote under load, #53).
-- A move is one transaction of the one writer, so an event is in exactly one of the two
-- tables; reads look at both. With ClickHouse, the journal is the spool.
--
-- An event's id is its for good: the journal hands it out, the move keeps it. Its counter
-- starts above every id `events` ever gave.
CREATE TABLE events_journal (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    sensor_id        TEXT NOT NULL,
    kind             TEXT NOT NULL,
    at               INTEGER NOT NULL,
    data             INTEGER,
    previous         INTEGER,
    last_seen_at     INTEGER,
    lost_since       INTEGER,
    reminder         INTEGER,
    flips_suppressed INTEGER
);
INSERT INTO sqlite_sequence (name, seq)
SELECT 'events_journal', max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0),
                             coalesce((SELECT max(id) FROM events), 0));
