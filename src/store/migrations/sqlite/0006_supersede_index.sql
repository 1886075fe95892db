-- latch schema v6: the index of pending notifications by sensor holds state changes only.
-- Its one hot reader is the commit's supersede, which looks for older pending state
-- changes of a sensor; connection lost/restored notifications are never superseded, and
-- keeping them out spares a fleet-wide outage one index write per lost sensor (and
-- another when each is delivered). Cancelling a deleted sensor's pending notifications
-- reads them through notifications_by_sensor instead.
DROP INDEX IF EXISTS notifications_pending_by_sensor;
CREATE INDEX notifications_pending_by_sensor ON notifications (sensor_id)
    WHERE status = 'pending' AND kind = 'sensor.state_changed';
