-- Idempotency-Key: a keyed request's fingerprint (a hash of method, path and body), when
-- its current holder took the key (0: released), and its answer once given; and, written
-- by the group commits themselves, the positions of its readings each one applied.
CREATE TABLE idempotency_keys (
    key         TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    taken_at    INTEGER NOT NULL,
    status      INTEGER,
    body        TEXT
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);

CREATE TABLE idempotency_applied (
    key        TEXT NOT NULL,
    positions  TEXT NOT NULL,   -- comma-separated, ascending
    applied_at INTEGER NOT NULL
);
CREATE INDEX idempotency_applied_key ON idempotency_applied (key);
CREATE INDEX idempotency_applied_at ON idempotency_applied (applied_at);
