-- latch schema: scoped API tokens. Only the SHA-256 of each secret is kept; `scopes` is a
-- comma-separated list of admin, ingest, read.
CREATE TABLE api_tokens (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    scopes     TEXT NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);
