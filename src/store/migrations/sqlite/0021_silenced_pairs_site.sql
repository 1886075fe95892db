-- latch schema v20: a (client, sensor) pair a silence kept something from remembers the
-- sensor's site then, so a silence that matched by site reconciles the pair at its end
-- even once the sensor has moved to another site or to none, and what the client knew of
-- the sensor before (`lost`, `data`: `domain::silence::kept`) with the seq of the first
-- notification kept (`since`): the silence's end reads what the client was told after it,
-- else that view, never the rows before it, which retention may have taken (issue #68).
ALTER TABLE silenced_pairs ADD COLUMN site_id TEXT;
ALTER TABLE silenced_pairs ADD COLUMN lost INTEGER;
ALTER TABLE silenced_pairs ADD COLUMN data INTEGER;
ALTER TABLE silenced_pairs ADD COLUMN since INTEGER NOT NULL DEFAULT 0;
