-- latch schema v12: node-to-node requests are always authenticated.

-- The secret nodes authenticate each other with when `cluster_secret` is not configured:
-- made by the first node that needs it, read by every other, so nodes that share this
-- database agree on it without configuration.
ALTER TABLE latch_cluster ADD COLUMN secret TEXT;

-- A fingerprint of the secret each node uses (never the secret), so a node whose secret
-- differs from a live node's is refused at start instead of failing every forward.
ALTER TABLE latch_nodes ADD COLUMN secret_fingerprint TEXT;
