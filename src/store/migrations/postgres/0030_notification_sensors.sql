-- The sensors each site notification names, so that a sensor's notifications include the
-- site events that named it (issue #70) from an index, not a search through bodies. Filled
-- when a site notification is made; only site notifications have rows, so a sensor's own
-- notifications cost nothing more. Rows leave with their notification (retention).
CREATE TABLE notification_sensors (
    sensor_id TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    PRIMARY KEY (sensor_id, seq)
);
CREATE INDEX notification_sensors_seq ON notification_sensors (seq);
INSERT INTO notification_sensors (sensor_id, seq)
  SELECT DISTINCT x ->> 'id', n.seq
  FROM notifications n,
    LATERAL jsonb_array_elements(COALESCE((n.body::jsonb) -> 'sensors', '[]'::jsonb)
      || COALESCE((n.body::jsonb) -> 'restored', '[]'::jsonb)
      || COALESCE((n.body::jsonb) -> 'still_lost', '[]'::jsonb)) x
  WHERE n.site_id IS NOT NULL AND x ->> 'id' IS NOT NULL;
