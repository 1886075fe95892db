-- latch schema v12: what a client receives, under its control (issue #36).
--
-- clients.events: the notification types it wants, joined by commas; NULL: all.
-- sensors.debounce_s: its own debounce window; NULL: the service default.
-- sensor_state: how the last reading came in (liveness follows that way's link), a change
-- waiting out the debounce window (debounce_since NULL: none), and while lost, since when
-- and how many reminders went out.
-- events and notifications: what only some kinds carry (still_lost: lost_since and
-- reminder; a debounced state_changed: flips_suppressed). Columns without a default are
-- added without rewriting a table.
-- latch_source_links: whether the node running the broker sources is connected to each
-- broker, so every node's engine holds back "lost" for sensors heard through one that is
-- down.
ALTER TABLE clients ADD COLUMN events TEXT;
ALTER TABLE sensors ADD COLUMN debounce_s INTEGER;
ALTER TABLE sensor_state
    ADD COLUMN last_source    TEXT,
    ADD COLUMN debounce_from  BOOLEAN,
    ADD COLUMN debounce_at    BIGINT,
    ADD COLUMN debounce_since BIGINT,
    ADD COLUMN debounce_flips INTEGER,
    ADD COLUMN lost_since     BIGINT,
    ADD COLUMN reminders      INTEGER;
ALTER TABLE events
    ADD COLUMN lost_since       BIGINT,
    ADD COLUMN reminder         INTEGER,
    ADD COLUMN flips_suppressed INTEGER;
ALTER TABLE notifications
    ADD COLUMN lost_since       BIGINT,
    ADD COLUMN reminder         INTEGER,
    ADD COLUMN flips_suppressed INTEGER;
CREATE TABLE latch_source_links (
    source TEXT PRIMARY KEY,
    up     BOOLEAN NOT NULL,
    at     BIGINT NOT NULL
);
