-- latch schema v13: a client's `rate_limit` holds for the whole cluster.

-- One schedule of request slots per rate-limited client, shared by every node: `end_us`
-- (microseconds since the epoch, the database's clock) is where the slots leased so far
-- end. A node leases the next few by moving it on (`grant_rate`). A row stays after its
-- client is deleted (a few bytes; a client made again under a new id gets a new row).
CREATE TABLE latch_rate_schedule (
    client_id TEXT PRIMARY KEY,
    end_us    BIGINT NOT NULL
);
