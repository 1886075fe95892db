-- MQTT publishes that committed and were never acknowledged, kept from a stop to the next
-- start (on this node or another) so that the broker's resends are recognised
-- (`store::Sessions`). Written only at a stop that leaves some, taken (deleted) at the
-- next start.
CREATE TABLE mqtt_unacked (
    session TEXT NOT NULL,
    pkid INT NOT NULL,
    topic BYTEA NOT NULL,
    payload BYTEA NOT NULL,
    PRIMARY KEY (session, pkid)
);
