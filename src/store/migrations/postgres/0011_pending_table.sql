-- latch schema v11: the outbox's pending notifications are listed in a narrow table of
-- their own, and the partial indexes of pending rows leave `notifications`.
--
-- With `status` in those indexes' predicates, no result could be a HOT update: every one
-- wrote a new entry into each of the outbox's indexes. Now `notifications` has only
-- indexes on columns that never change (seq, id, by client, by sensor), so the lease and
-- the result are both HOT updates in the room its fill factor keeps, and a notification
-- joins this table when it becomes pending and leaves it when it stops being pending, in
-- the same statement that changes its status. Measured on the statements alone (insert,
-- claim, lease, result; 100,000 notifications over 1M delivered ones): 2.4–2.8 s of
-- PostgreSQL time against 5.8–11.0 s. A trigger keeping the table did worse than the
-- partial indexes (8.4–13.5 s), so the store's statements keep it.
--
-- Every node must run this version or later: an older one would write pending
-- notifications that this table does not list (`latch serve` refuses a schema newer than
-- it knows).
CREATE TABLE notifications_pending (
    seq       BIGINT PRIMARY KEY,
    sensor_id TEXT NOT NULL,
    client_id TEXT NOT NULL
);
INSERT INTO notifications_pending (seq, sensor_id, client_id)
    SELECT seq, sensor_id, client_id FROM notifications WHERE status = 'pending';
-- A lane's pending rows (the claim, the commit's supersede by its sensor_id), and a
-- client's (enable, delete, unlink).
CREATE INDEX notifications_pending_lane ON notifications_pending (sensor_id, client_id, seq);
CREATE INDEX notifications_pending_client ON notifications_pending (client_id, sensor_id, seq);
DROP INDEX IF EXISTS notifications_pending_by_lane;
DROP INDEX IF EXISTS notifications_pending_by_client;
