-- The audit trail (issue #73, part 4): one row per change made through the API, written in
-- the change's own transaction. `before` and `after` are JSON text with secrets redacted;
-- ids grow, so they order the trail and page it.
CREATE TABLE audit (
    id         BIGSERIAL PRIMARY KEY,
    at         BIGINT NOT NULL,
    token_id   TEXT,
    token_name TEXT,
    method     TEXT NOT NULL,
    path       TEXT NOT NULL,
    resource   TEXT NOT NULL,
    before     TEXT,
    after      TEXT,
    -- Shipped to ClickHouse (ids are not handed out in commit order here, so each row is
    -- marked, as attempts are).
    shipped    BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX audit_at ON audit (at);
CREATE INDEX audit_unshipped ON audit (id) WHERE NOT shipped;
