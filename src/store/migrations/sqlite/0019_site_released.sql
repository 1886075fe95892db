-- While a site is down: the last held event (its id in `site_held`) already released to
-- the clients the site's loss did not tell. The held rows stay for the site's return,
-- which owes them to the clients it told (domain/site/decide.rs).
ALTER TABLE sites ADD COLUMN released INTEGER NOT NULL DEFAULT 0;
