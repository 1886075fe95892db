-- The audit trail (issue #73, part 4): one row per change made through the API, written in
-- the change's own transaction. `before` and `after` are JSON text with secrets redacted;
-- ids grow, so they order the trail and page it.
CREATE TABLE audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    token_id   TEXT,
    token_name TEXT,
    method     TEXT NOT NULL,
    path       TEXT NOT NULL,
    resource   TEXT NOT NULL,
    before     TEXT,
    after      TEXT
);
CREATE INDEX audit_at ON audit (at);
-- Shipped to ClickHouse as attempts are: the mark of the last record shipped (one writer
-- hands out ids in commit order, so a mark is exact).
INSERT INTO ship_marks (what, last_id) VALUES ('audit', 0);
