-- Door alarms (issue #72): a sensor's battery threshold and the labels of its states; its
-- battery, tamper flag and fault as last reported, and whether a battery alarm is open;
-- and what a battery, tamper or fault notification carries.
ALTER TABLE sensors ADD COLUMN battery_low_pct INTEGER NOT NULL DEFAULT 20;
ALTER TABLE sensors ADD COLUMN labels TEXT;
ALTER TABLE sensor_state ADD COLUMN battery INTEGER;
ALTER TABLE sensor_state ADD COLUMN battery_low BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE sensor_state ADD COLUMN tamper BOOLEAN;
ALTER TABLE sensor_state ADD COLUMN fault TEXT;
ALTER TABLE notifications ADD COLUMN battery INTEGER;
ALTER TABLE notifications ADD COLUMN threshold INTEGER;
ALTER TABLE notifications ADD COLUMN fault TEXT;
