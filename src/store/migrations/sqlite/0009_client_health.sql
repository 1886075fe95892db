-- latch schema v9: a client's health without reading all of its attempts (issue #35).
--
-- GET /v1/clients/{id} read every attempt the client ever had, to find its last success,
-- its last failure and the failures since: months of attempts made it slower by the day.
-- Those figures are now kept on the client's row, brought up to date in the transaction
-- that records attempts; the last hour's figures read the client's attempts of the last
-- hour by an index on (client_id, at), which takes the place of the one on `at` alone
-- (read by nothing else). Attempts carry their client from now on; those of the last hour
-- get it here, older ones are never read by client.
ALTER TABLE clients ADD COLUMN last_success_at INTEGER;
ALTER TABLE clients ADD COLUMN last_failure_at INTEGER;
ALTER TABLE clients ADD COLUMN last_error TEXT;
ALTER TABLE clients ADD COLUMN failures_since_success INTEGER NOT NULL DEFAULT 0;
UPDATE clients SET last_success_at = (
    SELECT MAX(a.at) FROM attempts a JOIN notifications n ON n.id = a.notification_id
    WHERE n.client_id = clients.id
      AND (a.status_code BETWEEN 200 AND 299 OR (a.status_code IS NULL AND a.error IS NULL)));
UPDATE clients SET
    last_failure_at = (
        SELECT a.at FROM attempts a JOIN notifications n ON n.id = a.notification_id
        WHERE n.client_id = clients.id AND NOT COALESCE(
          (a.status_code BETWEEN 200 AND 299 OR (a.status_code IS NULL AND a.error IS NULL)), 0)
        ORDER BY a.at DESC, a.id DESC LIMIT 1),
    last_error = (
        SELECT a.error FROM attempts a JOIN notifications n ON n.id = a.notification_id
        WHERE n.client_id = clients.id AND NOT COALESCE(
          (a.status_code BETWEEN 200 AND 299 OR (a.status_code IS NULL AND a.error IS NULL)), 0)
        ORDER BY a.at DESC, a.id DESC LIMIT 1),
    failures_since_success = (
        SELECT COUNT(*) FROM attempts a JOIN notifications n ON n.id = a.notification_id
        WHERE n.client_id = clients.id AND a.at > COALESCE(clients.last_success_at, -9e18));
ALTER TABLE attempts ADD COLUMN client_id TEXT;
UPDATE attempts SET client_id = (
    SELECT n.client_id FROM notifications n WHERE n.id = attempts.notification_id)
WHERE at >= (SELECT COALESCE(MAX(at), 0) - 3600000 FROM attempts);
CREATE INDEX attempts_by_client ON attempts (client_id, at);
DROP INDEX IF EXISTS attempts_by_at;
-- Dead letters counted by client without reading its delivered ones.
CREATE INDEX notifications_failed_by_client ON notifications (client_id) WHERE status = 'failed';
