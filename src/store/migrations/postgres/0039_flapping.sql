-- A flapping contact (issue #72): a sensor's flap ({changes, window_s}); its count of
-- changes (the window's first change, how many, the last) and, while it flaps, the state
-- its `sensor.flapping` told; and the window a `sensor.flapping` notification carries.
ALTER TABLE sensors ADD COLUMN flap TEXT;
ALTER TABLE sensor_state ADD COLUMN flap_start BIGINT;
ALTER TABLE sensor_state ADD COLUMN flap_count INTEGER;
ALTER TABLE sensor_state ADD COLUMN flap_last BIGINT;
ALTER TABLE sensor_state ADD COLUMN flapping BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE sensor_state ADD COLUMN flap_told BOOLEAN;
ALTER TABLE notifications ADD COLUMN window_s INTEGER;
