-- latch schema v9: room in sensor_state's pages for the next state. Every commit rewrites
-- the state row of each sensor it holds (last_seen_at at least); with free space on the
-- row's page the new version stays there (a HOT update) and the primary key index is not
-- written. Partitions carry their own storage settings; pages written from now on keep
-- the room.
DO $$
DECLARE part regclass;
BEGIN
    FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'sensor_state'::regclass LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 70)', part);
    END LOOP;
END $$;
