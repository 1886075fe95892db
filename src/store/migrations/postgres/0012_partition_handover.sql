-- latch schema v12: a partition handed over by a live node keeps its sensors' deadlines.
--
-- `deadline_floor` is the time a partition's deadlines count from while it is served
-- (`max(last_seen, floor) + timeout`, in milliseconds of the serving node's clock);
-- `released_by` and `released_at` (the database's clock) say who gave it up, and when. The
-- next owner carries the floor on when another node released the partition within a lease
-- (a handover from a live node), and counts from its takeover otherwise: after a crash,
-- or after nobody served the partition for longer.
ALTER TABLE latch_partitions
    ADD COLUMN deadline_floor BIGINT,
    ADD COLUMN released_by TEXT,
    ADD COLUMN released_at TIMESTAMPTZ;
