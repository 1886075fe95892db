"""One full flow through a client generated from latch's own OpenAPI document.

Run by scripts/contract: `python3 tests/sdk/flow.py BASE_URL [TOKEN]`, with the package that
`openapi-python-client` generated from `BASE_URL/openapi.json` on the import path as
`latch_client`. It registers a sensor and a client whose webhook is a receiver in this
process, links them, posts readings, reads back state, notifications, attempts and
history, and sends a test event — only through the generated, typed functions. Prints `N passed, N failed`.
The receiver is on 127.0.0.1, so the latch under test must let loopback through its SSRF
guard (`LATCH_DELIVERY_ALLOW_NETS`; scripts/contract starts it so).
"""

import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from latch_client import AuthenticatedClient, Client
from latch_client.api.clients import create_client, get_client, test_client
from latch_client.api.history import sensor_events, sensor_readings
from latch_client.api.links import link, sensor_clients
from latch_client.api.notifications import get_notification, list_notifications
from latch_client.api.readings import post_readings
from latch_client.api.sensors import create_sensor, get_sensor
from latch_client.models import ClientIn, ReadingIn, ReadingInData, SensorCreate

received = []


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        received.append((self.headers["webhook-id"], json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


results = {"passed": 0, "failed": 0}


def check(what, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {what}{'' if ok else ': ' + str(detail)}")


def wait_for(what, fn, secs=30):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    check(what, False, "timed out")
    return None


def main():
    base = sys.argv[1]
    token = sys.argv[2] if len(sys.argv) > 2 else None
    api = (
        AuthenticatedClient(base_url=base, token=token)
        if token
        else Client(base_url=base)
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}/hook"

    sensor_id = "sdk" + uuid.uuid4().hex[:10]
    created = create_sensor.sync(
        client=api, body=SensorCreate(id=sensor_id, address="Svobody st. 23")
    )
    check("create a sensor", getattr(created, "id", None) == sensor_id, created)

    c = create_client.sync(client=api, body=ClientIn(name="sdk", url=hook))
    check("create a client with a generated secret", c.secret.startswith("whsec_"), c)
    check("read the client back", get_client.sync(c.id, client=api).url == hook)

    r = link.sync_detailed(c.id, sensor_id, client=api)
    check("link them", r.status_code == 204, r.status_code)
    linked = sensor_clients.sync(sensor_id, client=api)
    check("the sensor lists its client", [i.id for i in linked.items] == [c.id], linked)

    readings = [
        ReadingIn(sensor_id=sensor_id, data=ReadingInData.VALUE_1),
        ReadingIn(sensor_id=sensor_id, data=ReadingInData.VALUE_0),
    ]
    accepted = post_readings.sync(
        client=api, body=[x.to_dict() for x in readings]
    )
    check("post readings", accepted.accepted == 2 and not accepted.rejected, accepted)

    sensor = get_sensor.sync(sensor_id, client=api)
    check("state follows the last reading", sensor.status.data == 0, sensor)

    def settled():
        items = list_notifications.sync(client=api, sensor_id=sensor_id).items
        statuses = [n.status.value for n in items]
        done = statuses and statuses[-1] == "delivered"
        return items if done and set(statuses) <= {"delivered", "superseded"} else None

    # The newer state supersedes the older one if it had not gone out yet.
    notes = wait_for("the newest state delivered", settled)
    if notes:
        check("newest state last", notes[-1].data == 0 and notes[-1].previous == 1, notes)
        detail = get_notification.sync(notes[-1].id, client=api)
        check(
            "a notification carries its attempts",
            len(detail.attempts) == 1 and detail.attempts[0].status_code == 204,
            detail,
        )
        sent = [n.id for n in notes if n.status.value == "delivered"]
        ids = [wid for wid, _ in received]
        check("the receiver got them, by webhook-id", ids == sent, (ids, sent))

    history = sensor_readings.sync(sensor_id, client=api)
    check("reading history", [x.data for x in history.items] == [1, 0], history)
    events = sensor_events.sync(sensor_id, client=api)
    check("event history", [e.data for e in events.items] == [1, 0], events)

    t = test_client.sync(c.id, client=api)
    check("a test event, answered", t is not None and t.status == 204 and not t.error, t)
    check("the receiver got it", received and received[-1][1]["type"] == "client.test", received[-1:])

    server.shutdown()
    print(f"sdk: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
