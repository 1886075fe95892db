-- latch schema v8: what a client receives, under its control (issue #36).
--
-- clients.events: the notification types it wants, joined by commas; NULL: all.
-- sensors.debounce_s: its own debounce window; NULL: the service default.
-- sensor_state: how the last reading came in (liveness follows that way's link), a change
-- waiting out the debounce window (debounce_since NULL: none), and while lost, since when
-- and how many reminders went out.
-- events and notifications: what only some kinds carry (still_lost: lost_since and
-- reminder; a debounced state_changed: flips_suppressed).
ALTER TABLE clients ADD COLUMN events TEXT;
ALTER TABLE sensors ADD COLUMN debounce_s INTEGER;
ALTER TABLE sensor_state ADD COLUMN last_source TEXT;
ALTER TABLE sensor_state ADD COLUMN debounce_from INTEGER;
ALTER TABLE sensor_state ADD COLUMN debounce_at INTEGER;
ALTER TABLE sensor_state ADD COLUMN debounce_since INTEGER;
ALTER TABLE sensor_state ADD COLUMN debounce_flips INTEGER;
ALTER TABLE sensor_state ADD COLUMN lost_since INTEGER;
ALTER TABLE sensor_state ADD COLUMN reminders INTEGER;
ALTER TABLE events ADD COLUMN lost_since INTEGER;
ALTER TABLE events ADD COLUMN reminder INTEGER;
ALTER TABLE events ADD COLUMN flips_suppressed INTEGER;
ALTER TABLE notifications ADD COLUMN lost_since INTEGER;
ALTER TABLE notifications ADD COLUMN reminder INTEGER;
ALTER TABLE notifications ADD COLUMN flips_suppressed INTEGER;
