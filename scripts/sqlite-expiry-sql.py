#!/usr/bin/env python3
"""The SQL of a fleet-wide expiry on SQLite, alone: where the one writer's time goes.

`latch bench fleet` times the whole service (HTTP feed, engine, delivery) on a machine whose
speed drifts. This runs only the statements the SQLite group commit runs when sensors go
lost, one thread, on latch's own migrations: N sensors each linked to one client, then
batches of 5,000 sorted ids declared lost (state update, event, notifications). It prints
seconds per statement group, so schema or SQL variants can be compared in one sitting. Use
ratios between groups of the same run: the machine's speed varies between runs.

    scripts/sqlite-expiry-sql.py [variant ...]      # N=1000000 by default

Environment: N (sensors), BATCH (sensors per commit, latch's EXPIRE_BATCH by default),
PAGE_SIZE and CACHE (the `page_size` and `cache_size` pragmas, SQLite's defaults if unset),
SPREAD (k: the outage is worked off as k queues of every k-th id, each in id order, as a
shard whose due queue holds 1/k of its due sensors takes them; 1 by default).
Variants: base (latch's SQL), row_number (the notifications numbered by a window function,
as before #19's seventh pass), no-<index> (without one index: events_by_sensor_at,
notifications_by_sensor, notifications_pending_by_client, notifications_id), floor (without
any of the secondary indexes the expiry writes: a lower bound for these rows).
Python's sqlite3 is not latch's bundled SQLite; compare variants, not absolute figures.
"""

import glob
import os
import sqlite3
import sys
import tempfile
import time

N = int(os.environ.get("N", "1000000"))
BATCH = int(os.environ.get("BATCH", "5000"))
PAGE_SIZE = os.environ.get("PAGE_SIZE")
CACHE = os.environ.get("CACHE")
SPREAD = int(os.environ.get("SPREAD", "1"))
MIGRATIONS = os.path.join(os.path.dirname(__file__), "..", "src", "store", "migrations", "sqlite")
CLIENT = "01KAAAAAAAAAAAAAAAAAAAAAAA"
# Every secondary index the expiry writes: `floor` runs the same statements without them,
# the rows the contract needs (state, event, one notification per client) and nothing else.
FLOOR_DROPS = [
    "events_by_sensor_at",
    "notifications_by_sensor",
    "notifications_by_client",
    "notifications_pending_by_client",
    "notifications_pending_by_sensor",
]


def open_db(path, variant):
    c = sqlite3.connect(path, isolation_level=None)
    if PAGE_SIZE:
        c.execute(f"PRAGMA page_size={PAGE_SIZE}")
    if CACHE:
        c.execute(f"PRAGMA cache_size={CACHE}")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute("PRAGMA wal_autocheckpoint=10000")
    for f in sorted(glob.glob(os.path.join(MIGRATIONS, "*.sql"))):
        sql = open(f).read()
        if variant in ("no-notifications_id", "floor"):
            sql = sql.replace("TEXT NOT NULL UNIQUE,", "TEXT NOT NULL,")
        c.executescript("BEGIN;" + sql + ";COMMIT;")
    if variant.startswith("no-") and variant != "no-notifications_id":
        c.execute(f"DROP INDEX {variant[3:]}")
    if variant == "floor":
        for index in FLOOR_DROPS:
            c.execute(f"DROP INDEX {index}")
    c.executescript(
        "PRAGMA temp_store = MEMORY;"
        "CREATE TEMP TABLE stage_events (k INTEGER PRIMARY KEY, sensor_id TEXT, kind TEXT,"
        " at INTEGER, data INTEGER, previous INTEGER, last_seen_at INTEGER);"
        "CREATE TEMP TABLE stage_notifications (n INTEGER PRIMARY KEY, event INTEGER,"
        " id TEXT, client_id TEXT);"
    )
    return c


def fill(c, ids):
    c.execute("BEGIN")
    c.execute(
        "INSERT INTO clients (id, name, url, secret, created_at) VALUES (?, 'b', 'http://x/', 's', 1)",
        (CLIENT,),
    )
    c.executemany("INSERT INTO sensors VALUES (?, 'addr', NULL, 1)", ((i,) for i in ids))
    c.executemany("INSERT INTO sensor_state VALUES (?, 1, 1, 1, 1, 'online')", ((i,) for i in ids))
    c.executemany("INSERT INTO links VALUES (?, ?, 1)", ((CLIENT, i) for i in ids))
    c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def expire(c, ids, variant):
    spent = {}

    def lap(group, since):
        now = time.perf_counter()
        spent[group] = spent.get(group, 0.0) + now - since
        return now

    for b in range(0, len(ids), BATCH):
        chunk = ids[b : b + BATCH]
        t = time.perf_counter()
        c.execute("BEGIN")
        c.executemany(
            "UPDATE sensor_state SET data = ?2, changed_at = COALESCE(?3, changed_at), "
            "last_ts = ?4, last_seen_at = ?5, connection = ?6 WHERE sensor_id = ?1",
            ((i, 1, None, 1, 1, "lost") for i in chunk),
        )
        t = lap("state", t)
        c.executemany(
            "INSERT INTO temp.stage_events VALUES (?, ?, ?, ?, ?, ?, ?)",
            ((k, i, "sensor.connection_lost", 5, 1, None, 1) for k, i in enumerate(chunk)),
        )
        c.execute(
            "INSERT INTO events (sensor_id, kind, at, data, previous, last_seen_at) "
            "SELECT sensor_id, kind, at, data, previous, last_seen_at FROM temp.stage_events ORDER BY k"
        )
        t = lap("events", t)
        # A ULID-shaped id, made in SQL (latch calls a Rust function here).
        nid = "printf('01KB%010d%012d', ?1, e.k)"
        if variant == "row_number":
            c.execute(
                "INSERT INTO temp.stage_notifications (n, event, id, client_id) "
                f"SELECT row_number() OVER (ORDER BY e.k, l.client_id), e.k, {nid}, l.client_id "
                "FROM temp.stage_events e JOIN links l ON l.sensor_id = e.sensor_id",
                (b,),
            )
        else:
            c.execute(
                "INSERT INTO temp.stage_notifications (event, id, client_id) "
                f"SELECT e.k, {nid}, l.client_id "
                "FROM temp.stage_events e JOIN links l ON l.sensor_id = e.sensor_id ORDER BY e.k, l.client_id",
                (b,),
            )
        t = lap("links", t)
        base = c.execute(
            "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'notifications'), 0), "
            "COALESCE((SELECT MAX(seq) FROM notifications), 0))"
        ).fetchone()[0]
        c.execute(
            "INSERT INTO notifications (seq, id, client_id, sensor_id, kind, data, previous, "
            "occurred_at, last_seen_at, status, attempts, next_attempt_at, created_at, updated_at) "
            "SELECT ?1 + s.n, s.id, s.client_id, e.sensor_id, e.kind, e.data, e.previous, e.at, "
            "e.last_seen_at, 'pending', 0, ?2, ?2, ?2 "
            "FROM temp.stage_notifications s JOIN temp.stage_events e ON e.k = s.event ORDER BY s.n",
            (base, 7),
        )
        c.execute("SELECT n, event, id, client_id FROM temp.stage_notifications ORDER BY n").fetchall()
        c.execute("DELETE FROM temp.stage_notifications")
        c.execute("DELETE FROM temp.stage_events")
        t = lap("outbox", t)
        c.execute("COMMIT")
        lap("commit", t)
    return spent


def main():
    ids = [f"b{i:07d}" for i in range(N)]
    for variant in sys.argv[1:] or ["base"]:
        with tempfile.TemporaryDirectory() as d:
            c = open_db(os.path.join(d, "latch.db"), variant)
            fill(c, ids)
            t = time.perf_counter()
            order = [i for j in range(SPREAD) for i in ids[j::SPREAD]]
            spent = expire(c, order, variant)
            total = time.perf_counter() - t
            c.close()
        groups = " ".join(f"{k}={v:.2f}" for k, v in spent.items())
        print(f"{variant}: {N} lost in {total:.2f} s: {groups}", flush=True)


if __name__ == "__main__":
    main()
