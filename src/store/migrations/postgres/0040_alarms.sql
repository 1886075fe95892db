-- Alarms as an operator works them (issue #73): one per sensor (or site) and kind while it
-- is not resolved; the notifications that open, remind of, clear or acknowledge one name it.
CREATE TABLE alarms (
    id              TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    sensor_id       TEXT,
    site_id         TEXT,
    state           TEXT NOT NULL,
    opened_at       BIGINT NOT NULL,
    acknowledged_at BIGINT,
    acknowledged_by TEXT,
    note            TEXT,
    resolved_at     BIGINT
);
CREATE UNIQUE INDEX alarms_unresolved_by_sensor ON alarms (sensor_id, kind)
    WHERE state <> 'resolved' AND sensor_id IS NOT NULL;
CREATE UNIQUE INDEX alarms_unresolved_by_site ON alarms (site_id, kind)
    WHERE state <> 'resolved' AND site_id IS NOT NULL;
CREATE INDEX alarms_by_state ON alarms (state, id);
CREATE INDEX alarms_unresolved ON alarms (kind, state, opened_at) WHERE state <> 'resolved';
ALTER TABLE notifications ADD COLUMN alarm_id TEXT;
CREATE INDEX notifications_by_alarm ON notifications (alarm_id) WHERE alarm_id IS NOT NULL;
