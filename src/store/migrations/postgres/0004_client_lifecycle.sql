-- latch schema v4: the client's lifecycle. A rotated secret keeps signing until
-- previous_secret_until; a disabled client (disabled_at) gets no attempts;
-- failing_since is the first failed attempt since the client's last delivery, which
-- auto-disable measures from; rate_limit caps its requests per second.
ALTER TABLE clients
    ADD COLUMN previous_secret       TEXT,
    ADD COLUMN previous_secret_until BIGINT,
    ADD COLUMN disabled_at           BIGINT,
    ADD COLUMN disabled_reason       TEXT,
    ADD COLUMN failing_since         BIGINT,
    ADD COLUMN rate_limit            INTEGER;
-- Endpoint health reads a client's recent attempts.
CREATE INDEX attempts_by_at ON attempts (at);
