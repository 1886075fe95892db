-- A silence may follow a schedule (issue #73): `schedule_id` names it, and `starts_at` and
-- `ends_at` hold its current or next window, moved on by the round that reconciles each
-- window's end. `ended_at`: when a caller ended it (such a silence follows its schedule no
-- more). `silences_by_schedule` answers whether a schedule is in use, and which silences
-- a change to it moves.
ALTER TABLE silences ADD COLUMN schedule_id TEXT;
ALTER TABLE silences ADD COLUMN ended_at INTEGER;
CREATE INDEX silences_by_schedule ON silences (schedule_id) WHERE schedule_id IS NOT NULL;
