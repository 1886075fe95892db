-- latch schema v15: an attempt's id is never handed out again.
--
-- Attempts ship to ClickHouse past a mark of the last id shipped (v7), and since retention
-- (v9's health, #35) attempts are deleted. An `INTEGER PRIMARY KEY` without AUTOINCREMENT
-- takes the next id from the largest one in the table: once retention had deleted every
-- attempt, new ones got ids at or below the mark and were never shipped, while the spool
-- counted none waiting. AUTOINCREMENT never reuses an id; its counter starts above the
-- newest attempt and the mark both. SQLite cannot add AUTOINCREMENT to a table, so the
-- table is made again (its columns as v1, v2 and v9 left them).
CREATE TABLE attempts_next (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    notification_id TEXT NOT NULL,
    at              INTEGER NOT NULL,
    status_code     INTEGER,
    error           TEXT,
    duration_ms     INTEGER NOT NULL,
    shipped         INTEGER NOT NULL DEFAULT 0,
    client_id       TEXT
);
INSERT INTO attempts_next (id, notification_id, at, status_code, error, duration_ms, shipped, client_id)
    SELECT id, notification_id, at, status_code, error, duration_ms, shipped, client_id FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_next RENAME TO attempts;
CREATE INDEX attempts_by_notification ON attempts (notification_id);
CREATE INDEX attempts_by_client ON attempts (client_id, at);
-- The counter: above the mark too (the copy above set it to the newest id, if any).
UPDATE sqlite_sequence SET seq = MAX(seq, (SELECT last_id FROM ship_marks WHERE what = 'attempts'))
    WHERE name = 'attempts';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'attempts', (SELECT last_id FROM ship_marks WHERE what = 'attempts')
    WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'attempts');
