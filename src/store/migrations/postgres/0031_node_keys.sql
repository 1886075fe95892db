-- The ids of the secret keys each node holds, reported with its heartbeat, so that
-- `latch rotate-key` refuses to seal under a key a live node cannot open (issue #69 item
-- 9). NULL: a node of a version that does not report them.
ALTER TABLE latch_nodes ADD COLUMN key_ids TEXT;
