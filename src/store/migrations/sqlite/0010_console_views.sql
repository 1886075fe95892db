-- latch schema: what the console finds and filters fast on a large store (issue #41).
--
-- The notification list's time range (`from`, `to`: when a notification was created),
-- newest first: a page bounded by `from` reads that range, not the outbox from its end.
-- created_at never changes, so the index is written once per notification.
CREATE INDEX IF NOT EXISTS notifications_by_created ON notifications (created_at);

-- Search by words of a sensor's address: a full-text index of the addresses, kept by
-- triggers on `sensors` (so every way a sensor is written keeps it, imports included).
-- The id is a column too, only so that a sensor's row is found by it (`id : "…"`) when
-- the sensor changes or goes: `sensors` has no rowid to tie the two by.
CREATE VIRTUAL TABLE sensor_search USING fts5(id, address, tokenize = 'unicode61 remove_diacritics 2');
INSERT INTO sensor_search (id, address) SELECT id, address FROM sensors;
CREATE TRIGGER sensor_search_insert AFTER INSERT ON sensors BEGIN
    INSERT INTO sensor_search (id, address) VALUES (new.id, new.address);
END;
CREATE TRIGGER sensor_search_update AFTER UPDATE OF address ON sensors BEGIN
    DELETE FROM sensor_search WHERE rowid IN (SELECT rowid FROM sensor_search
        WHERE sensor_search MATCH 'id : "' || old.id || '"' AND id = old.id);
    INSERT INTO sensor_search (id, address) VALUES (new.id, new.address);
END;
CREATE TRIGGER sensor_search_delete AFTER DELETE ON sensors BEGIN
    DELETE FROM sensor_search WHERE rowid IN (SELECT rowid FROM sensor_search
        WHERE sensor_search MATCH 'id : "' || old.id || '"' AND id = old.id);
END;
