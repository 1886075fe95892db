-- A flapping contact (issue #72): a sensor's flap ({changes, window_s}); its count of
-- changes (the window's first change, how many, the last) and, while it flaps, the state
-- its `sensor.flapping` told; and the window a `sensor.flapping` notification carries.
ALTER TABLE sensors ADD COLUMN flap TEXT;
ALTER TABLE sensor_state ADD COLUMN flap_start INTEGER;
ALTER TABLE sensor_state ADD COLUMN flap_count INTEGER;
ALTER TABLE sensor_state ADD COLUMN flap_last INTEGER;
ALTER TABLE sensor_state ADD COLUMN flapping INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sensor_state ADD COLUMN flap_told INTEGER;
ALTER TABLE notifications ADD COLUMN window_s INTEGER;
