-- A claim on a shared store reads the rest of its notification's (client, sensor) lane
-- (older pending ones, a newer state delivered): one index walk per claimed notification.
-- Both indexes of pending notifications now lead with the lane, whichever the planner
-- picks: before, it walked a client's whole pending list for each claim (a client with
-- thousands pending: ~4 ms a notification). The commit's supersede uses the first by its
-- sensor_id; a client's pending list (enable, delete) the second by its client_id.
DROP INDEX IF EXISTS notifications_pending_by_sensor;
CREATE INDEX IF NOT EXISTS notifications_pending_by_lane
    ON notifications (sensor_id, client_id, seq) WHERE status = 'pending';
DROP INDEX IF EXISTS notifications_pending_by_client;
CREATE INDEX IF NOT EXISTS notifications_pending_by_client
    ON notifications (client_id, sensor_id, seq) WHERE status = 'pending';
