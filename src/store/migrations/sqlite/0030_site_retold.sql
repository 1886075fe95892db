-- The clients a silence's end told of a site's loss (`site::retell`), each with the last
-- held event already released to them then: what was held up to it is not owed to them
-- again when a sensor leaves the site (issue #68, simulation seed 2189). `,client@id,`.
ALTER TABLE sites ADD COLUMN retold TEXT NOT NULL DEFAULT ',';
