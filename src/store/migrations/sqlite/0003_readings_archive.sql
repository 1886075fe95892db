-- latch schema v3: readings land in an append-only journal and move to an archive in bulk.
--
-- An index on (sensor_id, ts) over every reading made each group commit touch one index
-- page per sensor in it, and that page went to the WAL whole: the history index, not the
-- readings, bounded ingest. `readings` now has no per-sensor index; without ClickHouse,
-- latch moves its rows every second into `readings_archive`, sorted, so a page of the
-- archive is written once per move for all of a sensor's new readings. With ClickHouse,
-- `readings` is the spool and the archive stays empty. Reads look at both.
--
-- What `readings` holds at the upgrade moves to the archive now, so reads never scan a
-- large journal (with ClickHouse those few unshipped rows stay local, still readable).
DROP INDEX readings_by_sensor_ts;
CREATE TABLE readings_archive (
    sensor_id   TEXT NOT NULL,
    ts          INTEGER NOT NULL,
    id          INTEGER NOT NULL,
    received_at INTEGER NOT NULL,
    data        INTEGER NOT NULL,
    late        INTEGER NOT NULL,
    PRIMARY KEY (sensor_id, ts, id)
) WITHOUT ROWID;
INSERT INTO readings_archive (sensor_id, ts, id, received_at, data, late)
    SELECT sensor_id, ts, id, received_at, data, late FROM readings
    ORDER BY sensor_id, ts, id;
DELETE FROM readings;
