-- latch schema v20: a (client, sensor) pair a silence kept something from remembers the
-- sensor's site then, so a silence that matched by site reconciles the pair at its end
-- even once the sensor has moved to another site or to none, and what the client knew of
-- the sensor before (`lost`, `data`: `domain::silence::kept`), which the silence's end
-- reconciles from without reading the notification kept (issue #68).
ALTER TABLE silenced_pairs ADD COLUMN site_id TEXT;
ALTER TABLE silenced_pairs ADD COLUMN lost INTEGER;
ALTER TABLE silenced_pairs ADD COLUMN data INTEGER;
