-- latch schema: what the console finds and filters fast on a large store (issue #41).
--
-- The notification list's time range (`from`, `to`: when a notification was created),
-- newest first: a page bounded by `from` reads that range, not the outbox from its end.
-- created_at never changes, so the lease and the result stay HOT updates (no index of
-- `notifications` holds a column they change); the index is written once per row.
CREATE INDEX IF NOT EXISTS notifications_by_created ON notifications (created_at);
-- A sensor id prefix as an index range whatever the database's collation (`LIKE 'ab%'`;
-- the primary key serves it only under the C collation).
CREATE INDEX IF NOT EXISTS sensors_id_prefix ON sensors (id text_pattern_ops);
-- Words of the address: a full-text index of it, as the 'simple' configuration splits it
-- (no stemming, no stop words: street names and numbers are found as written).
CREATE INDEX IF NOT EXISTS sensors_address_words ON sensors
    USING gin (to_tsvector('simple', address));
