-- A state held too long (issue #72): a sensor's hold alarms, and how far its current state
-- has held (since when, by latch's clock, and how many of its alarms were made).
ALTER TABLE sensors ADD COLUMN hold_alarms TEXT;
ALTER TABLE sensor_state ADD COLUMN held_since INTEGER;
ALTER TABLE sensor_state ADD COLUMN held_sent INTEGER;
