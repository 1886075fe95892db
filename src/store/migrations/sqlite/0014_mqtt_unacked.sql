-- MQTT publishes that committed and were never acknowledged, kept from a stop to the next
-- start so that the broker's resends are recognised (`store::Sessions`). Written only at a
-- stop that leaves some, taken (deleted) at the next start.
CREATE TABLE mqtt_unacked (
    session TEXT NOT NULL,
    pkid INTEGER NOT NULL,
    topic BLOB NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (session, pkid)
);
