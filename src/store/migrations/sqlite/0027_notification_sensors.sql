-- The sensors each site notification names, so that a sensor's notifications include the
-- site events that named it (issue #70) from an index, not a search through bodies. Filled
-- when a site notification is made; only site notifications have rows, so a sensor's own
-- notifications cost nothing more. Rows leave with their notification (retention).
CREATE TABLE notification_sensors (
    sensor_id TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    PRIMARY KEY (sensor_id, seq)
) WITHOUT ROWID;
CREATE INDEX notification_sensors_seq ON notification_sensors (seq);
INSERT OR IGNORE INTO notification_sensors (sensor_id, seq)
  SELECT json_extract(x.value, '$.id'), n.seq
  FROM notifications n, json_each(n.body) l, json_each(l.value) x
  WHERE n.site_id IS NOT NULL AND l.key IN ('sensors', 'restored', 'still_lost')
    AND json_type(l.value) = 'array' AND json_extract(x.value, '$.id') IS NOT NULL;
