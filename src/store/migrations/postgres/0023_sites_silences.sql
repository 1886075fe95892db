-- latch schema v23 (PostgreSQL): sites, a sensor's site, and silences (maintenance windows).

-- A site and where its decision stands: `down` since `since`; `pending_since`, the first
-- loss not yet decided on (the decision waits the grace from it); `told`, the sensors its
-- `site.connection_lost` named (',a,b,'), whose own lost and restored are held, and
-- `told_clients` the clients it went to (those its return goes to).
CREATE TABLE sites (
    id                TEXT COLLATE "C" PRIMARY KEY,
    name              TEXT,
    address           TEXT,
    gateway_sensor_id TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    down              BOOLEAN NOT NULL DEFAULT false,
    since             BIGINT,
    pending_since     BIGINT,
    told              TEXT NOT NULL DEFAULT ',',
    told_clients      TEXT NOT NULL DEFAULT ','
);

ALTER TABLE sensors ADD COLUMN site_id TEXT COLLATE "C";
CREATE INDEX sensors_by_site ON sensors (site_id) WHERE site_id IS NOT NULL;

-- A silence's match: each column NULL (any) or what it names; `sensor_ids` and `types`
-- as ',a,b,' so one strpos() tests membership. `reconciled_at`: when its end was
-- reconciled (once, by whichever node took it first).
CREATE TABLE silences (
    id            TEXT COLLATE "C" PRIMARY KEY,
    site_id       TEXT,
    sensor_ids    TEXT,
    client_id     TEXT,
    types         TEXT,
    starts_at     BIGINT NOT NULL,
    ends_at       BIGINT NOT NULL,
    comment       TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    reconciled_at BIGINT
);
CREATE INDEX silences_by_end ON silences (ends_at);

-- The (client, sensor) pairs a silence kept a notification from: what a silence's end
-- reconciles. Kept until no silence that matches a pair waits for its reconciliation.
CREATE TABLE silenced_pairs (
    client_id TEXT COLLATE "C" NOT NULL,
    sensor_id TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (client_id, sensor_id)
);

-- A site's notification carries its own fields (the site, the client's sensors of it).
ALTER TABLE notifications ADD COLUMN body TEXT;

-- Liveness events of a site's sensors held for the site's decision: released as the
-- sensors' own notifications, or told by the site's.
CREATE TABLE site_held (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    site_id      TEXT NOT NULL,
    sensor_id    TEXT NOT NULL,
    kind         TEXT NOT NULL,
    at           BIGINT NOT NULL,
    data         BOOLEAN,
    previous     BOOLEAN,
    last_seen_at BIGINT,
    lost_since   BIGINT,
    reminder     INTEGER
);
CREATE INDEX site_held_by_site ON site_held (site_id, id);
