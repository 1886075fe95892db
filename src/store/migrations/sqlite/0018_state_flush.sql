-- The last reading (journal id) whose times `sensor_state` holds: a reading that changes
-- nothing but its sensor's `last_ts` and `last_seen_at` is written into its row at the
-- next flush, at most a second later, and a start takes the readings past this mark into
-- `sensor_state` before anything reads it (store/sqlite/seen.rs). Every row is written
-- until now, so the mark starts at the last reading.
CREATE TABLE state_flush (
    one     INTEGER PRIMARY KEY CHECK (one = 1),
    through INTEGER NOT NULL
);
INSERT INTO state_flush (one, through)
SELECT 1, max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'readings'), 0),
              coalesce((SELECT max(id) FROM readings), 0));
