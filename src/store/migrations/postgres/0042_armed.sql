-- A sensor armed by a schedule (issue #73, part 3): its armed ({schedule_id, data, when})
-- as JSON text, NULL when it is not armed. A `sensor.state_out_of_schedule` keeps its
-- schedule ({id, name}) in the notification's body.
ALTER TABLE sensors ADD COLUMN armed TEXT;
