-- latch schema: every node's own broker links (issue #37).
--
-- In a cluster each node consumes its partitions' queues of the AMQP exchange over its own
-- connection, so a broker link is a node's, not the cluster's: latch_source_links keeps one
-- row per node and source. A sensor's readings may come through any node's connection, so
-- every engine takes a link as down while any live node's is (`source_links`).
-- Rows from before this version (the one node that ran the sources) belong to no node and
-- are never read again.
ALTER TABLE latch_source_links ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE latch_source_links DROP CONSTRAINT latch_source_links_pkey;
ALTER TABLE latch_source_links ADD PRIMARY KEY (source, node);
