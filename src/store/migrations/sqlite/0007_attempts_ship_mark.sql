-- latch schema v7: attempts ship past a mark, not by a flag.
--
-- `attempts_unshipped` indexed every attempt not yet copied to ClickHouse. Without
-- ClickHouse nothing copies them, so it held every attempt ever made, and each attempt
-- cost one more index write. Attempts are never deleted, and their ids come from the one
-- writer in commit order, so what waits is exactly what lies above the last id shipped.
-- The mark starts below the oldest unshipped attempt: anything shipped above it goes
-- again, which ClickHouse folds (see `history::clickhouse`).
--
-- `attempts.shipped` stays, unread: dropping a column rewrites the whole table.
CREATE TABLE ship_marks (
    what    TEXT PRIMARY KEY,
    last_id INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO ship_marks (what, last_id) VALUES ('attempts', COALESCE(
    (SELECT MIN(id) - 1 FROM attempts WHERE shipped = 0),
    (SELECT MAX(id) FROM attempts),
    0));
DROP INDEX attempts_unshipped;
