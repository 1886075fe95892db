-- latch schema v16: a client's health without reading all of its attempts (issue #35).
--
-- GET /v1/clients/{id} read every attempt the client ever had, to find its last success,
-- its last failure and the failures since: months of attempts made it slower by the day.
-- Those figures are now kept on the client's row, brought up to date in the transaction
-- that records attempts; the last hour's figures read the client's attempts of the last
-- hour by an index on (client_id, at), which takes the place of the one on `at` alone
-- (read by nothing else). Attempts carry their client from now on; those of the last hour
-- get it here, older ones are never read by client. (No partial index on failed
-- notifications here: a predicate on `status` would end the outbox's HOT updates, see
-- v11; retention bounds a client's notifications instead.)
ALTER TABLE clients
    ADD COLUMN last_success_at        BIGINT,
    ADD COLUMN last_failure_at        BIGINT,
    ADD COLUMN last_error             TEXT,
    ADD COLUMN failures_since_success BIGINT NOT NULL DEFAULT 0;
UPDATE clients c SET last_success_at = s.at FROM (
    SELECT n.client_id, MAX(a.at) AS at FROM attempts a
    JOIN notifications n ON n.id = a.notification_id
    WHERE a.status_code BETWEEN 200 AND 299 OR (a.status_code IS NULL AND a.error IS NULL)
    GROUP BY n.client_id) s
WHERE s.client_id = c.id;
UPDATE clients c SET last_failure_at = f.at, last_error = f.error FROM (
    SELECT DISTINCT ON (n.client_id) n.client_id, a.at, a.error FROM attempts a
    JOIN notifications n ON n.id = a.notification_id
    WHERE NOT COALESCE(a.status_code BETWEEN 200 AND 299
                       OR (a.status_code IS NULL AND a.error IS NULL), false)
    ORDER BY n.client_id, a.at DESC, a.id DESC) f
WHERE f.client_id = c.id;
UPDATE clients c SET failures_since_success = f.n FROM (
    SELECT n.client_id, COUNT(*) AS n FROM attempts a
    JOIN notifications n ON n.id = a.notification_id
    JOIN clients cl ON cl.id = n.client_id
    WHERE a.at > COALESCE(cl.last_success_at, -9223372036854775807)
    GROUP BY n.client_id) f
WHERE f.client_id = c.id;
ALTER TABLE attempts ADD COLUMN client_id TEXT;
UPDATE attempts a SET client_id = n.client_id FROM notifications n
WHERE n.id = a.notification_id
  AND a.at >= (SELECT COALESCE(MAX(at), 0) - 3600000 FROM attempts);
CREATE INDEX attempts_by_client ON attempts (client_id, at);
DROP INDEX IF EXISTS attempts_by_at;
