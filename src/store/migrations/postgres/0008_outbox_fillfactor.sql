-- latch schema v8: room in the outbox's pages for a claim's lease. A claim sets
-- claimed_by and lease_until, which no index holds: with free space on the row's page the
-- new version stays there (a HOT update) and none of the outbox's seven indexes is
-- touched. Full pages (the default fill factor, 100) made every claim write every index.
-- Pages written from now on keep the room.
ALTER TABLE notifications SET (fillfactor = 70);
