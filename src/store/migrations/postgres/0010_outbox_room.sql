-- latch schema v10: fewer index writes per notification.
-- notifications_due (pending by next_attempt_at) is read by no query: due times are kept
-- in memory by the dispatcher, and the rows are found by seq or by lane. Every insert and
-- every result wrote it.
DROP INDEX IF EXISTS notifications_due;
-- Room for both updates a notification gets while pending (the claim's lease, then the
-- result): at fill factor 70 most leases found the page full of the neighbours' new
-- versions and were written as non-HOT updates, a new entry in every index each.
ALTER TABLE notifications SET (fillfactor = 50);
