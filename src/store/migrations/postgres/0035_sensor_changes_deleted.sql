-- Which registry changes were deletions: a sensor deleted and made again under its id
-- between two reads of the log is then followed as two lives, the old one's memory
-- (lost, its reminders) dropped, not kept as the new one's (issue #68).
ALTER TABLE sensor_changes ADD COLUMN deleted BOOLEAN NOT NULL DEFAULT false;
