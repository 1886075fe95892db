-- latch schema: a client's batching (issue #36).
--
-- clients.batch_max_events, batch_max_wait_ms: several notifications in one request; both
-- NULL: one request each.
-- notifications.batch_id: the batch a notification was last sent in; a retry of that
-- batch carries the same id. Columns without a default: no table rewrite.
ALTER TABLE clients
    ADD COLUMN batch_max_events  INTEGER,
    ADD COLUMN batch_max_wait_ms INTEGER;
ALTER TABLE notifications ADD COLUMN batch_id TEXT;
