-- Escalation (issue #73, part 2): a client's escalation ({after_s, to}) as JSON text; and
-- the timers, one per alarm and client it goes to: written with the outcome that starts
-- it, marked made by the round that sent the `alarm.escalated` (once, on any node), and
-- closed once the client reached was told of the alarm's resolution.
ALTER TABLE clients ADD COLUMN escalation TEXT;
CREATE TABLE escalations (
    alarm_id    TEXT NOT NULL,
    to_client   TEXT NOT NULL,
    from_client TEXT NOT NULL,
    level       INTEGER NOT NULL,
    sensor_id   TEXT NOT NULL,
    due_at      INTEGER NOT NULL,
    made_at     INTEGER,
    closed_at   INTEGER,
    PRIMARY KEY (alarm_id, to_client)
);
CREATE INDEX escalations_due ON escalations (due_at) WHERE made_at IS NULL;
CREATE INDEX escalations_open ON escalations (alarm_id) WHERE made_at IS NOT NULL AND closed_at IS NULL;
