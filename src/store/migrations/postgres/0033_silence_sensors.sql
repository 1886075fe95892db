-- The sensors a silence's match names, one row each in the order given (`pos`), so that a
-- notification's match is an index lookup by its sensor, not a search through the list of
-- every active silence inside the writer's commit, and a silence's creation one insert
-- (issue #69). `silences.named_sensors`: how many it names, NULL when it names none (any
-- sensor matches); `silences_any_sensor` finds those without reading the others.
CREATE TABLE silence_sensors (
    silence_id TEXT COLLATE "C" NOT NULL,
    pos        INTEGER NOT NULL,
    sensor_id  TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (silence_id, pos)
);
CREATE INDEX silence_sensors_by_sensor ON silence_sensors (sensor_id, silence_id);
INSERT INTO silence_sensors (silence_id, pos, sensor_id)
  SELECT s.id, u.o, u.x
  FROM silences s,
    unnest(string_to_array(trim(both ',' from s.sensor_ids), ',')) WITH ORDINALITY u(x, o)
  WHERE s.sensor_ids IS NOT NULL AND u.x <> '';
ALTER TABLE silences ADD COLUMN named_sensors INTEGER;
UPDATE silences s SET named_sensors =
    (SELECT count(*) FROM silence_sensors x WHERE x.silence_id = s.id)
  WHERE s.sensor_ids IS NOT NULL;
ALTER TABLE silences DROP COLUMN sensor_ids;
CREATE INDEX silences_any_sensor ON silences (ends_at) WHERE named_sensors IS NULL;
