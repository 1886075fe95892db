-- A site's notification keeps the site it is about, so a newer event of the same site for
-- the same client supersedes one still waiting (issue #68: the owner's decision), found
-- through the client's site notifications only.
ALTER TABLE notifications ADD COLUMN site_id TEXT;
UPDATE notifications SET site_id = (body::jsonb) -> 'site' ->> 'id'
  WHERE kind IN ('site.connection_lost', 'site.connection_restored');
CREATE INDEX notifications_site ON notifications (client_id, site_id, seq)
  WHERE site_id IS NOT NULL;
