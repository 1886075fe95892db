"""The operator console in a real browser (issue #18), against a running latch.

Debian's chromium driven by Playwright for Python, never a downloaded browser:
opens the fleet page, creates a sensor and a client through the forms, links them,
posts readings through the API and waits for the page to show the change without a
reload, opens the notification and its attempts, makes the endpoint answer 500 and
replays the dead letter once it answers again, sends a test event from the client's page
and chooses the types it receives. Issue #41: a freshly opened fleet page shows the rates
of readings that flowed before it opened; a just-failed notification is at the top of the
notifications with its client's name, "Failed in the last hour" finds it and the filtered
view replays it; a search by a word of the address finds the sensor; the client's page
charts its failure rate and latency. Saves a screenshot of each page. Issue #49: each
rate card's big number is the rate its label names, computed from the rates the page was
given; the header stays in view (and focus moves to the page) after moving to a long page;
a client with one 5-minute slice of attempts has a point in each chart; times name their
zone. Issue #51: the client's receiver settings (headers, a bearer token, a client
certificate) are set through its page, shown without their secrets, carried by a test
event, kept when saved again, and a bad certificate is refused. Issue #50: a site goes down
and comes back in the live events, the sites page lists it first with its lost sensors,
its page makes a silence, the silences page extends and ends it, and a sensor's page
silences that sensor. Issue #73: a door held open opens an alarm, which the alarms page
lists open and acknowledges with a name and a note, once.

With LATCH_CLUSTER set (two node URLs, comma-separated, of one cluster), it checks
instead that the console served by the first node shows the live events of sensors
the second node owns.

    LATCH_URL=http://127.0.0.1:8080 python3 tests/ui/console.py

latch must run with short retries (scripts/ui sets them) so a failing notification
becomes a dead letter within seconds. Environment: LATCH_URL (required), CHROMIUM
(default /usr/bin/chromium), SCREENSHOTS (default docs/src/images).

With LATCH_TOKEN set, latch runs with that API token, and the script checks instead that
the console asks for it once: a wrong one is asked again, the right one is kept for the
tab's session (a reload does not ask), and the live stream runs with it.
"""

import http.server
import json
import os
import random
import re
import string
import sys
import threading
import time
import urllib.error
import urllib.request

from playwright.sync_api import expect, sync_playwright

BASE = os.environ["LATCH_URL"].rstrip("/")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("SCREENSHOTS", "docs/src/images")
WAIT_MS = 20_000


class Receiver(http.server.BaseHTTPRequestHandler):
    """A webhook endpoint that answers `status` (200, or 500 while failing)."""

    status = 200
    received = []
    headers = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        Receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
        Receiver.received.append((Receiver.status, json.loads(body)))
        self.send_response(Receiver.status)
        self.end_headers()

    def log_message(self, *args):
        pass


def post_reading(sensor, data):
    req = urllib.request.Request(
        f"{BASE}/v1/readings",
        data=json.dumps({"sensor_id": sensor, "data": data}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req) as r:
        answer = json.load(r)
    assert answer["accepted"] == 1, answer


def put(url):
    req = urllib.request.Request(url, method="PUT")
    with urllib.request.urlopen(req) as r:
        assert r.status == 204, r.status


def get_json(url):
    with urllib.request.urlopen(url) as r:
        return json.load(r)


def post_json(url, body):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def until(what, check, seconds=30):
    """Polls `check` (no browser involved) until it is true."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def certificate(cn):
    """A self-signed client certificate and its key (PEM), made with openssl."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", f"{d}/key.pem", "-out", f"{d}/cert.pem", "-subj", f"/CN={cn}",
             "-days", "2"],
            check=True, capture_output=True)
        return open(f"{d}/cert.pem").read(), open(f"{d}/key.pem").read()


def shot(page, name):
    os.makedirs(SHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SHOTS, f"console-{name}.png"), full_page=True)


def until_rows(page, n):
    """Filters the notifications list again until it shows `n` rows (it is not live)."""
    for _ in range(60):
        if page.locator("tbody tr").count() >= n:
            return
        page.wait_for_timeout(300)
        page.get_by_role("button", name="Filter", exact=True).click()
    raise AssertionError(f"the notifications list never showed {n} rows")


def token_flow(token):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        page.goto(f"{BASE}/ui/")
        dialog = page.get_by_role("dialog", name="API token")
        expect(dialog).to_be_visible()
        page.get_by_label("Bearer token").fill("not-the-token")
        page.get_by_label("Bearer token").press("Enter")
        expect(dialog).to_be_visible()
        page.get_by_label("Bearer token").fill(token)
        page.get_by_role("button", name="Use token").click()
        expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
        expect(page.locator("#live")).to_have_text("Live")
        page.reload()
        expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
        expect(dialog).to_be_hidden()
        browser.close()
    print("console: ok (asks for the token once)")


def cluster_flow(bases):
    """The console of node 0 shows the live events of sensors node 1 owns."""
    first, second = bases
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    sensors = [f"cl{suffix}{i}" for i in range(12)]
    for s in sensors:
        post_json(f"{first}/v1/sensors", {"id": s, "address": f"Cluster st. {s}"})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        page.goto(f"{first}/ui/#/fleet")
        expect(page.locator("#live")).to_have_text("Live")
        feed = page.locator(".feed")
        # Changes until every sensor's shows (the relay joins the other node's stream a
        # moment after the page's opens).
        for round in range(20):
            post_json(f"{first}/v1/readings", [{"sensor_id": s, "data": round % 2} for s in sensors])
            page.wait_for_timeout(1000)
            text = feed.inner_text()
            if all(s in text for s in sensors):
                break
        else:
            missing = [s for s in sensors if s not in feed.inner_text()]
            raise AssertionError(f"node 0's console never showed {missing}")
        with urllib.request.urlopen(f"{first}/metrics") as r:
            metrics = r.read().decode()
        forwarded = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("latch_cluster_forwarded_readings_total")
        )
        assert forwarded > 0, "every sensor was node 0's own"
        expect(page.get_by_role("region", name="Readings accepted")).to_be_visible()
        browser.close()
    print(f"console: ok (a 2-node cluster's events through {first})")


PANELS = ["Readings accepted", "State changes", "Webhooks delivered", "Webhooks failed",
          "Sensors lost", "Sensors restored"]
RATE_KEYS = ["readings", "changes", "delivered", "failed", "lost", "restored"]


def rate_cards_say_what_they_show(page, responses):
    """Each card's big number is the rate over the period its label names, computed from
    a `/v1/fleet/rates` answer the page was given, and its total is that hour's."""
    cards = []
    for name in PANELS:
        card = page.get_by_role("region", name=name, exact=True)
        label = card.locator(".k", has_text="over the last").inner_text()
        period = re.search(r"over the last (minute|hour)", label)
        assert period, f"{name}: the label names no period: {label!r}"
        cards.append((card.locator(".n").inner_text(), {"minute": 60, "hour": 3600}[period[1]],
                      card.locator(".total").inner_text()))
    answers = [r.json() for r in responses]
    assert answers, "the page read no rates"

    def shown_by(r):
        for (number, period, total), key in zip(cards, RATE_KEYS):
            counts, s = r[key], r["bucket_s"]
            n = max(1, round(period / s))
            rate = sum(counts[-n:]) / (n * s)
            if number != f"{rate:.{2 if rate < 10 else 1}f}/s" or total != f"{sum(counts)} in the last hour":
                return False
        return True

    got = [{k: (sum(r[k][-6:]), sum(r[k])) for k in RATE_KEYS} for r in answers]
    assert any(shown_by(r) for r in answers), \
        f"cards {cards} are not the rates the page got (last minute, hour): {got}"
    assert cards[0][0] != "0.00/s", f"the readings just posted are not shown: {cards[0]}"


def header_in_view(page, what):
    """After moving to a page taller than the window: the header is on screen and focus is
    on the page's content (for screen readers), the window not scrolled."""
    tall = "() => document.documentElement.scrollHeight - window.innerHeight"
    for _ in range(50):
        if page.evaluate(tall) > 0:
            break
        page.wait_for_timeout(100)
    assert page.evaluate(tall) > 0, f"{what}: the page is not taller than the window"
    top = page.evaluate("document.querySelector('header').getBoundingClientRect().top")
    assert top >= 0, f"{what}: the header is {-top}px above the window"
    assert page.evaluate("window.scrollY") == 0, f"{what}: scrolled to {page.evaluate('window.scrollY')}"
    assert page.evaluate("document.activeElement.id") == "main", f"{what}: focus not on the page"


def long_pages_keep_the_header(browser, hook, first_client):
    """Fleet, sensors, a sensor and notifications, long enough to scroll, reached through
    the header's links and a row's link at 1280x900."""
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    ids = [f"long{suffix}{i:02d}" for i in range(60)]
    client = post_json(f"{BASE}/v1/clients", {"name": "long receiver", "url": hook})["id"]
    for s in ids:
        post_json(f"{BASE}/v1/sensors", {"id": s, "address": f"Long st. {s}"})
        put(f"{BASE}/v1/clients/{client}/sensors/{s}")
    post_json(f"{BASE}/v1/readings", [{"sensor_id": s, "data": 1} for s in ids])
    post_json(f"{BASE}/v1/readings", [{"sensor_id": ids[0], "data": i % 2} for i in range(40)])
    until("the long receiver's notifications",
          lambda: len(get_json(f"{BASE}/v1/notifications?client_id={client}&limit=100")["items"]) >= 60)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{BASE}/ui/#/clients/{first_client}")
    expect(page.get_by_text("Endpoint health")).to_be_visible()
    for section, heading in [("Notifications", "Notifications"), ("Sensors", "Sensors"), ("Fleet", "Fleet")]:
        page.mouse.wheel(0, 5000)
        page.get_by_role("link", name=section, exact=True).click()
        expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        expect(page.locator("main")).not_to_contain_text("Loading")
        header_in_view(page, section)
    page.get_by_role("link", name="Sensors", exact=True).click()
    page.get_by_role("link", name=ids[0], exact=True).click()
    expect(page.get_by_role("heading", name=f"Sensor {ids[0]}")).to_be_visible()
    expect(page.get_by_role("region", name="Readings")).to_be_visible()
    header_in_view(page, "a sensor")
    page.close()


def one_slice_is_drawn(browser, hook):
    """A client whose one attempt is in one 5-minute slice: both charts show a point."""
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    sensor = f"one{suffix}"
    client = post_json(f"{BASE}/v1/clients", {"name": "one attempt", "url": hook})["id"]
    post_json(f"{BASE}/v1/sensors", {"id": sensor, "address": "One st. 1"})
    put(f"{BASE}/v1/clients/{client}/sensors/{sensor}")
    post_reading(sensor, 1)
    until("its one attempt", lambda: get_json(f"{BASE}/v1/clients/{client}")["health"]["last_success_at"])
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{BASE}/ui/#/clients/{client}")
    for name in ["Failed attempts, percent, last hour", "Median attempt duration, ms, last hour"]:
        chart = page.get_by_role("img", name=name)
        expect(chart).to_be_visible()
        box = chart.bounding_box()
        marks = chart.evaluate("""svg => {
            const line = svg.querySelector('polyline').getAttribute('points').trim();
            const dots = [...svg.querySelectorAll('circle')].map((c) => c.getBoundingClientRect())
              .filter((r) => r.width > 0 && r.height > 0);
            return { points: line ? line.split(' ').length : 0, dots: dots.map((r) => [r.x, r.y]) };
        }""")
        assert marks["points"] >= 2 or marks["dots"], f"{name}: nothing drawn for one slice: {marks}"
        for x, y in marks["dots"]:
            assert box["x"] <= x <= box["x"] + box["width"] and box["y"] <= y <= box["y"] + box["height"], (name, marks, box)
    page.close()


def times_name_their_zone(browser, sensor):
    """A time on a page says which zone it is in (here the browser's, Tokyo's)."""
    context = browser.new_context(timezone_id="Asia/Tokyo", locale="en-US")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{BASE}/ui/#/sensors/{sensor}")
    expect(page.get_by_role("heading", name=f"Sensor {sensor}")).to_be_visible()
    seen = page.locator("dl.props dt", has_text="Last seen").locator("xpath=following-sibling::dd[1]")
    expect(seen).to_contain_text("GMT+9")
    context.close()


def door_alarms_survive_a_save(browser):
    """A sensor's page shows its hold alarms, since when its door has been held open, its
    flap and whether it flaps, and saving the sensor's form (which does not edit them)
    keeps its alarms, flap and labels."""
    door = "held" + "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    alarms = [{"data": 1, "after_s": 1, "remind_every_s": 600}]
    flap = {"changes": 6, "window_s": 60}
    post_json(f"{BASE}/v1/sensors", {"id": door, "address": "Dock door", "heartbeat_timeout_s": 3600,
                                     "labels": {"0": "closed", "1": "open"}, "hold_alarms": alarms,
                                     "flap": flap})
    post_reading(door, 1)
    # A door like it, closed: not held.
    sensor_not_held = door + "c"
    post_json(f"{BASE}/v1/sensors", {"id": sensor_not_held, "address": "Dock door 2", "heartbeat_timeout_s": 3600,
                                     "hold_alarms": alarms})
    post_reading(sensor_not_held, 0)
    until("the door's state_held",
          lambda: get_json(f"{BASE}/v1/sensors/{door}")["status"]["held_since"] is not None)
    page = browser.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{BASE}/ui/#/sensors/{door}")
    expect(page.get_by_role("heading", name=f"Sensor {door}")).to_be_visible()
    dd = lambda name: page.locator("dl.props dt", has_text=name).locator("xpath=following-sibling::dd[1]")
    expect(dd("Hold alarms")).to_have_text("open for 1 s, then every 600 s")
    expect(dd("Held since")).not_to_have_text("—")
    expect(dd("Flapping at")).to_have_text("6 changes within 60 s")
    expect(dd("Flaps now")).to_have_text("no")
    page.get_by_label("Address", exact=True).fill("Dock door, north")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator("#notice")).to_contain_text("Saved.")
    # The fleet counts the doors held open.
    page.goto(f"{BASE}/ui/#/fleet")
    page.get_by_role("link", name=re.compile(r"^[1-9][0-9]* held open too long$")).click()
    expect(page.get_by_label("Door alarm")).to_have_value("held")
    expect(page.get_by_role("link", name=door, exact=True)).to_be_visible()
    expect(page.get_by_role("link", name=sensor_not_held, exact=True)).to_be_hidden()
    saved = get_json(f"{BASE}/v1/sensors/{door}")
    assert (saved["address"], saved["hold_alarms"], saved["labels"], saved["flap"]) == (
        "Dock door, north", alarms, {"0": "closed", "1": "open"}, flap), saved
    page.close()


def escalation_and_arming_are_set_from_the_console(browser):
    """Issue #73: a client's escalation is chosen on its page, which then shows the chain
    (two levels here); a sensor is armed on a schedule from its page, and saving the
    sensor's form afterwards keeps it armed."""
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    hook = "http://127.0.0.1:9/hook"
    desk = post_json(f"{BASE}/v1/clients", {"name": f"desk {suffix}", "url": hook})["id"]
    manager = post_json(f"{BASE}/v1/clients", {"name": f"manager {suffix}", "url": hook})["id"]
    director = post_json(f"{BASE}/v1/clients", {"name": f"director {suffix}", "url": hook,
                                                "escalation": None})["id"]
    request("PATCH", f"{BASE}/v1/clients/{manager}", {"escalation": {"after_s": 900, "to": director}})
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.set_default_timeout(WAIT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{BASE}/ui/#/clients/{desk}")
    expect(page.get_by_role("heading", name=f"Client desk {suffix}")).to_be_visible()
    dd = lambda name: page.locator("dl.props dt", has_text=name).locator("xpath=following-sibling::dd[1]")
    expect(dd("Escalation")).to_contain_text("none")
    page.get_by_label("Escalate an untaken alarm to").select_option(label=f"manager {suffix}")
    page.get_by_label("After (seconds)").fill("120")
    page.get_by_role("button", name="Save escalation").click()
    expect(page.locator("#notice")).to_contain_text(f"go on to manager {suffix} after 120 s")
    expect(dd("Escalation")).to_contain_text(
        f"desk {suffix} → after 120 s, level 1: manager {suffix} → after 900 s, level 2: director {suffix}")
    assert get_json(f"{BASE}/v1/clients/{desk}")["escalation"] == {"after_s": 120, "to": manager}

    # A schedule made on the schedules page: weekdays by default, in the zone typed.
    schedule = f"hours{suffix}"
    page.get_by_role("link", name="Schedules", exact=True).click()
    expect(page.get_by_role("heading", name="Schedules", exact=True)).to_be_visible()
    page.get_by_label("Id", exact=True).fill(schedule)
    page.get_by_label("Name", exact=True).fill(f"Office {suffix}")
    page.get_by_label("Time zone").fill("Europe/Prague")
    page.get_by_label("To (a time before From runs past midnight)").fill("17:30")
    page.get_by_role("button", name="Create schedule").click()
    expect(page.locator("#notice")).to_contain_text(f"Schedule Office {suffix} made")
    row = page.locator("tbody tr", has_text=schedule)
    expect(row).to_contain_text("mon, tue, wed, thu, fri 08:00–17:30")
    expect(row).to_contain_text("Europe/Prague")
    made = get_json(f"{BASE}/v1/schedules/{schedule}")
    assert made["weekly"] == [{"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00", "to": "17:30"}], made
    door = f"arm{suffix}"
    post_json(f"{BASE}/v1/sensors", {"id": door, "address": "Side door", "labels": {"0": "closed", "1": "open"}})
    page.goto(f"{BASE}/ui/#/sensors/{door}")
    expect(page.get_by_role("heading", name=f"Sensor {door}")).to_be_visible()
    expect(dd("Armed")).to_have_text("no")
    page.get_by_label("Schedule", exact=True).select_option(label=f"Office {suffix} (Europe/Prague)")
    page.get_by_label("Armed value").select_option("1")
    page.get_by_role("button", name="Save arming").click()
    expect(page.locator("#notice")).to_contain_text(f"Armed on {schedule}.")
    expect(dd("Armed")).to_contain_text(f"open outside the hours of schedule {schedule}")
    # The sensor's own form, saved after, keeps the arming it does not show.
    page.get_by_label("Address", exact=True).fill("Side door, east")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator("#notice")).to_contain_text("Saved.")
    saved = get_json(f"{BASE}/v1/sensors/{door}")
    assert (saved["address"], saved["armed"]) == (
        "Side door, east", {"schedule_id": schedule, "data": 1, "when": "outside"}), saved
    # A schedule a sensor is armed on stays: its delete is refused with the reason.
    page.goto(f"{BASE}/ui/#/schedules")
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name=f"Delete Office {suffix}").click()
    expect(page.locator("#notice")).to_contain_text("409")
    assert get_json(f"{BASE}/v1/schedules/{schedule}")["id"] == schedule
    assert not errors, f"errors in the page: {errors}"
    page.close()


def request(method, url, body=None):
    """A call with a JSON body whose answer may be empty (PATCH answers the silence,
    DELETE nothing)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode() if body is not None else None,
        headers={"content-type": "application/json"}, method=method)
    with urllib.request.urlopen(req) as r:
        text = r.read()
        return json.loads(text) if text else None


def metric(name):
    """The value of one series of latch's /metrics (0 when it is not there)."""
    with urllib.request.urlopen(f"{BASE}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def sites_and_silences(browser, hook):
    """Issue #50: a site made through its form goes down when its sensors fall silent; the
    live stream says so, the sites page lists it first with its lost sensors, its page
    shows it down (and latch_sites_down says 1); a silence made from its page is extended
    and ended from the silences page; a sensor's page silences that sensor; the site's
    return shows live, and what that silence kept is counted as silenced."""
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    site, quiet = f"bldg-{suffix}", f"quiet-{suffix}"
    sensors = [f"st{suffix}{i}" for i in range(3)]
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.set_default_timeout(WAIT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{BASE}/ui/#/sites")
    expect(page.get_by_role("heading", name="Sites", exact=True)).to_be_visible()
    expect(page.locator("#live")).to_have_text("Live")
    for name in [site, quiet]:
        page.get_by_label("Site id").fill(name)
        page.get_by_label("Name", exact=True).fill(f"Svobody 23 ({name})")
        page.get_by_role("button", name="Create site").click()
        expect(page.get_by_role("heading", name=f"Site {name}")).to_be_visible()
        expect(page.locator("dl.props")).to_contain_text("Stateup")
        page.get_by_role("link", name="All sites").click()
    # Both listed, neither down.
    all_sites = page.get_by_role("region", name="All sites")
    expect(all_sites.get_by_role("link", name=site)).to_be_visible()
    expect(all_sites.get_by_role("link", name=quiet)).to_be_visible()
    expect(page.get_by_role("region", name="Sites down")).to_contain_text("No site is down.")

    client = post_json(f"{BASE}/v1/clients", {"name": f"site receiver {suffix}", "url": hook})["id"]
    for s in sensors:
        post_json(f"{BASE}/v1/sensors", {"id": s, "address": f"Svobody 23, room {s}",
                                         "heartbeat_timeout_s": 1, "site_id": site})
        put(f"{BASE}/v1/clients/{client}/sensors/{s}")
    post_json(f"{BASE}/v1/readings", [{"sensor_id": s, "data": 1} for s in sensors])

    # Silent past their timeout and the site's grace: the fleet's live events say the site
    # is down, linked to its page.
    page.get_by_role("link", name="Fleet", exact=True).click()
    feed = page.get_by_role("list", name="Live events")
    down_item = feed.locator("li", has_text=f"Site {site}").filter(has_text="site down")
    expect(down_item).to_contain_text("site down: 3 of 3 sensors lost")
    # The sites page, opened after: the site first, under Down, with its lost sensors.
    page.get_by_role("link", name="Sites", exact=True).click()
    down = page.get_by_role("region", name="Sites down")
    expect(down.get_by_role("link", name=site)).to_be_visible()
    for s in sensors:
        expect(down.get_by_role("link", name=s)).to_be_visible()
    expect(down).not_to_contain_text(quiet)
    expect(down).to_contain_text("3 of 3")
    until("latch_sites_down at 1", lambda: metric("latch_sites_down") == 1)
    shot(page, "sites")

    # Its page: down, its lost sensors; a silence for it, made here.
    down.get_by_role("link", name=site).click()
    expect(page.get_by_role("heading", name=f"Site {site}")).to_be_visible()
    expect(page.locator("dl.props")).to_contain_text("Statedown")
    lost = page.get_by_role("region", name="Lost sensors")
    for s in sensors:
        expect(lost.get_by_role("link", name=s)).to_be_visible()
    mine = page.get_by_role("region", name="Silences of this site")
    expect(mine).to_contain_text("No silence holds this site's notifications.")
    mine.get_by_label("For").select_option("2h")
    mine.get_by_label("Comment (who is doing what)").fill(f"gateway swap {suffix}")
    mine.get_by_role("button", name="Silence this site").click()
    expect(page.locator("#notice")).to_contain_text(f'Silence "gateway swap {suffix}" made')
    expect(mine.locator("tbody tr")).to_have_count(1)
    expect(mine).to_contain_text("active")
    made = [x for x in get_json(f"{BASE}/v1/silences?state=active&limit=1000")["items"]
            if x["comment"] == f"gateway swap {suffix}"]
    assert len(made) == 1 and {k: v for k, v in made[0]["match"].items() if v} == {"site_id": site}, made
    ends = time.mktime(time.strptime(made[0]["ends_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    assert 2 * 3600 - 120 < ends - time.mktime(time.gmtime()) <= 2 * 3600 + 5, made[0]
    shot(page, "site")

    # The silences page: extended by an hour, then ended.
    page.get_by_role("link", name="Silences", exact=True).click()
    expect(page.get_by_role("heading", name="Silences", exact=True)).to_be_visible()
    row = page.locator("tbody tr", has_text=f"gateway swap {suffix}")
    expect(row.get_by_role("link", name=site)).to_be_visible()
    row.get_by_label(f'Extend "gateway swap {suffix}" by').select_option("1h")
    row.get_by_role("button", name="Extend").click()
    expect(page.locator("#notice")).to_contain_text(f'Silence "gateway swap {suffix}" extended to')
    extended = get_json(f"{BASE}/v1/silences/{made[0]['id']}")
    later = time.mktime(time.strptime(extended["ends_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    assert later - ends == 3600, (made[0]["ends_at"], extended["ends_at"])
    shot(page, "silences")
    page.locator("tbody tr", has_text=f"gateway swap {suffix}").get_by_role(
        "button", name=f'End "gateway swap {suffix}" now').click()
    expect(page.locator("#notice")).to_contain_text(f'Silence "gateway swap {suffix}" ended.')
    expect(page.locator("tbody tr", has_text=f"gateway swap {suffix}")).to_have_count(0)
    assert get_json(f"{BASE}/v1/silences/{made[0]['id']}")["state"] == "ended"
    page.get_by_label("State", exact=True).select_option("ended")
    expect(page.locator("tbody tr", has_text=f"gateway swap {suffix}")).to_contain_text("ended")

    # A sensor's page: its site named, a silence for it alone.
    page.goto(f"{BASE}/ui/#/sensors/{sensors[0]}")
    expect(page.get_by_role("heading", name=f"Sensor {sensors[0]}")).to_be_visible()
    expect(page.locator("dl.props").get_by_role("link", name=site)).to_be_visible()
    own = page.get_by_role("region", name="Silences of this sensor")
    own.get_by_label("Comment (who is doing what)").fill(f"battery {suffix}")
    own.get_by_role("button", name="Silence this sensor").click()
    expect(own.locator("tbody tr", has_text=f"battery {suffix}")).to_contain_text("active")
    ids = [x["match"].get("sensor_ids") for x in get_json(f"{BASE}/v1/silences?state=active&limit=1000")["items"]
           if x["comment"] == f"battery {suffix}"]
    assert ids == [[sensors[0]]], ids

    # Back: their readings again (a long timeout now), and the site's page shows it up
    # without a reload; the live events say so.
    page.goto(f"{BASE}/ui/#/sites/{site}")
    expect(page.locator("dl.props")).to_contain_text("Statedown")
    for s in sensors:
        request("PUT", f"{BASE}/v1/sensors/{s}", {"address": f"Svobody 23, room {s}",
                                                   "heartbeat_timeout_s": 3600, "site_id": site})
    post_json(f"{BASE}/v1/readings", [{"sensor_id": s, "data": 0} for s in sensors])
    expect(page.locator("dl.props")).to_contain_text("Stateup")
    expect(page.get_by_role("region", name="Lost sensors")).to_contain_text("No sensor of this site is lost.")
    page.get_by_role("link", name="Fleet", exact=True).click()
    expect(page.get_by_role("list", name="Live events").locator("li", has_text=f"Site {site}")
           .filter(has_text="site back up")).to_contain_text("site back up: 0 of 3 sensors still lost")
    until("latch_sites_down at 0", lambda: metric("latch_sites_down") == 0)
    # The site's return to the client went in the lane of the first sensor it names, which
    # the sensor's silence holds: kept, not sent.
    assert metric('latch_notifications_total{status="silenced"}') >= 1, "nothing counted silenced"
    assert not errors, f"errors in the page: {errors}"
    page.close()


def alarms_are_acknowledged_from_the_console(browser, hook):
    """Issue #73: a door held open past its hold alarm opens an alarm; the alarms page lists
    it open, refuses a blank name with the server's reason, acknowledges it with a name and
    a note and shows who took it, as the API and the sensor's page do; a second
    acknowledgement through the API is refused (409 already_acknowledged)."""
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    door, by, note = f"ack{suffix}", f"night desk {suffix}", "guard sent to check the door"
    client = post_json(f"{BASE}/v1/clients", {"name": f"alarm receiver {suffix}", "url": hook})["id"]
    post_json(f"{BASE}/v1/sensors", {"id": door, "address": "Back door", "heartbeat_timeout_s": 3600,
                                     "hold_alarms": [{"data": 1, "after_s": 1}]})
    put(f"{BASE}/v1/clients/{client}/sensors/{door}")
    post_reading(door, 1)
    opened = []

    def is_open():
        opened[:] = get_json(f"{BASE}/v1/alarms?state=open&sensor_id={door}")["items"]
        return bool(opened)

    until("the door's alarm open", is_open, seconds=15)
    alarm = opened[0]
    assert alarm["kind"] == "state_held", alarm

    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.set_default_timeout(WAIT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{BASE}/ui/")
    page.get_by_role("link", name="Alarms", exact=True).click()
    expect(page.get_by_role("heading", name="Alarms", exact=True)).to_be_visible()
    live = page.get_by_role("region", name="Open and acknowledged alarms")
    row = live.locator("tbody tr", has=page.get_by_role("link", name=door, exact=True))
    expect(row.locator(".badge")).to_have_text("open")
    expect(row).to_contain_text("state_held")
    # A blank name: the server's reason, and the alarm still open.
    row.locator("summary", has_text="Acknowledge").click()
    row.get_by_label("By (who takes it)").fill("   ")
    row.get_by_role("button", name="Acknowledge").click()
    expect(page.locator("#notice")).to_contain_text("422 by must be 1 to 200 characters")
    assert get_json(f"{BASE}/v1/alarms/{alarm['id']}")["state"] == "open"
    row.get_by_label("By (who takes it)").fill(by)
    row.get_by_label("Note").fill(note)
    row.get_by_role("button", name="Acknowledge").click()
    expect(page.locator("#notice")).to_contain_text(f"acknowledged by {by}")
    expect(row.locator(".badge")).to_have_text("acknowledged")
    expect(row).to_contain_text(f"by {by}")
    expect(row).to_contain_text(note)
    expect(row.locator("summary", has_text="Acknowledge")).to_have_count(0)
    # Who was told: the hold alarm to the receiver, then who took it.
    row.locator("summary", has_text="Who was told").click()
    told = row.locator("ol.chain li")
    expect(told.first).to_contain_text(f"sensor.state_held to alarm receiver {suffix}")
    expect(row.locator("ol.chain")).to_contain_text("alarm.acknowledged")
    got = get_json(f"{BASE}/v1/alarms/{alarm['id']}")
    assert (got["state"], got["acknowledged_by"], got["note"]) == ("acknowledged", by, note), got

    # Once only: a second acknowledgement changes nothing and says who took it.
    try:
        post_json(f"{BASE}/v1/alarms/{alarm['id']}/ack", {"by": "day desk"})
        raise AssertionError("a second acknowledgement was accepted")
    except urllib.error.HTTPError as e:
        answer = json.load(e)
        assert e.code == 409 and answer["error"]["code"] == "already_acknowledged", (e.code, answer)
        assert by in answer["error"]["message"], answer

    # The kind filter keeps it; another kind leaves it out.
    page.get_by_label("Kind").select_option("battery_low")
    expect(page.get_by_role("heading", name="Alarms", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name=door, exact=True)).to_have_count(0)
    page.get_by_label("Kind").select_option("state_held")
    expect(row.locator(".badge")).to_have_text("acknowledged")

    # The sensor's page lists it too.
    row.get_by_role("link", name=door, exact=True).click()
    expect(page.get_by_role("heading", name=f"Sensor {door}")).to_be_visible()
    own = page.get_by_role("region", name="Alarms of this sensor")
    expect(own.locator("tbody tr")).to_have_count(1)
    expect(own).to_contain_text(f"by {by}")

    # The audit trail shows the acknowledgement taken, with the alarm as it was before.
    page.get_by_role("link", name="Audit", exact=True).click()
    expect(page.get_by_role("heading", name="Audit trail", exact=True)).to_be_visible()
    page.get_by_label("Resource (and what is below it)").fill(f"alarms/{alarm['id']}")
    page.get_by_role("button", name="Show").click()
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"POST /v1/alarms/{alarm['id']}/ack")
    after = rows.first.locator("td").nth(5)
    after.locator("summary").click()
    expect(after.locator("pre")).to_contain_text(by)
    assert not errors, f"errors in the page: {errors}"
    page.close()


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    sensor = f"door{suffix}"

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        # Fleet, reached from / (a redirect to /ui/).
        page.goto(f"{BASE}/")
        expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
        expect(page.locator("#live")).to_have_text("Live")

        # A sensor, through the form on the sensors page (keyboard only).
        page.get_by_role("link", name="Sensors", exact=True).click()
        expect(page.get_by_role("heading", name="Sensors", exact=True)).to_be_visible()
        page.get_by_label("Sensor id").fill(sensor)
        page.get_by_label("Address", exact=True).fill("Svobody st. 23, back door")
        page.get_by_label("Address", exact=True).press("Enter")
        expect(page.get_by_role("heading", name=f"Sensor {sensor}")).to_be_visible()

        # A CSV import with a per-row report: a new sensor, and one that exists.
        page.get_by_role("link", name="Sensors", exact=True).click()
        expect(page.get_by_role("heading", name="Sensors", exact=True)).to_be_visible()
        page.get_by_label("CSV").fill(f"id,address\nimp{suffix},\"Import st. 1, hall\",60\n{sensor},again\n")
        page.get_by_role("button", name="Import").click()
        expect(page.locator("#notice")).to_contain_text("1 of 2 row(s) created")
        expect(page.get_by_role("cell", name="created")).to_be_visible()
        expect(page.get_by_role("cell", name="already exists")).to_be_visible()
        expect(page.get_by_role("link", name=f"imp{suffix}")).to_be_visible()

        # Search: a word of the address finds the sensor, and not the other one.
        page.get_by_label("Search sensors").fill("svobody")
        page.get_by_label("Search sensors").press("Enter")
        expect(page.get_by_role("link", name=sensor, exact=True)).to_be_visible()
        expect(page.get_by_role("link", name=f"imp{suffix}")).to_be_hidden()
        page.get_by_label("Search sensors").fill(f"imp{suffix}")
        page.get_by_label("Search sensors").press("Enter")
        expect(page.get_by_role("link", name=f"imp{suffix}")).to_be_visible()
        expect(page.get_by_role("link", name=sensor, exact=True)).to_be_hidden()

        # A client, then the link, from the client's page.
        # The page shown before (the sensors) stays until the clients page has loaded: a
        # field filled before then is filled on the page that goes.
        page.get_by_role("link", name="Clients", exact=True).click()
        expect(page.get_by_role("heading", name="Clients", exact=True)).to_be_visible()
        page.get_by_label("Name", exact=True).fill("ops receiver")
        page.get_by_label("Webhook URL").fill(hook)
        page.get_by_role("button", name="Create client").click()
        expect(page.get_by_role("heading", name="Client ops receiver")).to_be_visible()
        client = page.url.rsplit("/", 1)[1]
        page.get_by_label("Sensor id").fill(sensor)
        page.get_by_role("button", name="Link sensor").click()
        expect(page.get_by_role("link", name=sensor)).to_be_visible()

        # The sensor page follows readings live: no reload between them.
        page.get_by_role("link", name=sensor).click()
        expect(page.get_by_role("heading", name=f"Sensor {sensor}")).to_be_visible()
        expect(page.locator("dl.props")).to_contain_text("unknown")
        post_reading(sensor, 1)
        expect(page.locator("dl.props")).to_contain_text("online")
        expect(page.get_by_text("state — → 1")).to_be_visible()
        expect(page.get_by_role("link", name="ops receiver")).to_be_visible()
        expect(page.get_by_role("img", name=f"Readings of {sensor}")).to_be_visible()

        # The fleet page too: counts and the feed.
        page.get_by_role("link", name="Fleet", exact=True).click()
        expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
        post_reading(sensor, 0)
        expect(page.locator(".feed")).to_contain_text(f"{sensor} state 1 → 0")
        expect(page.get_by_role("img", name="Readings accepted per second")).to_be_visible()

        # Rates at first paint: once the readings' 10-second bucket is complete, a page
        # opened now shows them at once, without sampling anything itself.
        until("the readings in /v1/fleet/rates", lambda: sum(get_json(f"{BASE}/v1/fleet/rates")["readings"]) > 0)
        fresh = browser.new_page(viewport={"width": 1280, "height": 1000})
        given = []
        fresh.on("response", lambda r: given.append(r) if r.url.endswith("/v1/fleet/rates") else None)
        fresh.goto(f"{BASE}/ui/#/fleet")
        expect(fresh.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
        first = fresh.get_by_role("region", name="Readings accepted").locator(".total").inner_text()
        assert not first.startswith("0 "), f"the fresh fleet page showed {first!r}"
        rate_cards_say_what_they_show(fresh, given)
        expect(fresh.get_by_role("img", name="Webhooks delivered per second")).to_be_visible()
        shot(fresh, "fleet")
        fresh.close()

        # The notification of the first change, delivered, and its attempt.
        page.goto(f"{BASE}/ui/#/notifications?client_id={client}&sensor_id={sensor}&status=delivered")
        expect(page.get_by_role("heading", name="Notifications")).to_be_visible()
        until_rows(page, 2)
        page.locator("tbody tr").first.get_by_role("link").last.click()
        expect(page.get_by_role("heading", name="Notification")).to_be_visible()
        expect(page.locator("dl.props")).to_contain_text("delivered")
        expect(page.get_by_role("cell", name="200", exact=True)).to_be_visible()

        # The endpoint fails: the next change becomes a dead letter.
        Receiver.status = 500
        post_reading(sensor, 1)
        page.goto(f"{BASE}/ui/#/notifications?client_id={client}&status=failed")
        expect(page.get_by_role("heading", name="Notifications")).to_be_visible()
        until_rows(page, 1)
        # Unfiltered, newest first: the dead letter is at the top, with its client's name.
        page.goto(f"{BASE}/ui/#/notifications")
        top = page.locator("tbody tr").first
        expect(top).to_contain_text("ops receiver")
        expect(top).to_contain_text("failed")
        page.get_by_role("link", name="Failed in the last hour").click()
        expect(page.get_by_label("Status")).to_have_value("failed")
        expect(page.locator("tbody tr").first).to_contain_text("ops receiver")
        shot(page, "notifications")
        page.locator("tbody tr").first.get_by_role("link").last.click()
        expect(page.locator("dl.props")).to_contain_text("failed")
        expect(page.locator("dl.props")).to_contain_text("ops receiver")
        expect(page.get_by_role("cell", name="500", exact=True).first).to_be_visible()
        shot(page, "notification")

        # It answers again: replay the dead letter from its page.
        Receiver.status = 200
        page.get_by_role("button", name="Replay").click()
        expect(page.locator("#notice")).to_contain_text("Sent again")
        for _ in range(60):
            page.get_by_role("button", name="Refresh").click()
            if "delivered" in page.locator("dl.props").inner_text():
                break
            page.wait_for_timeout(300)
        expect(page.locator("dl.props")).to_contain_text("delivered")
        assert any(s == 200 and b["data"] == 1 for s, b in Receiver.received), Receiver.received

        # Another dead letter, replayed from the filtered view.
        Receiver.status = 500
        post_reading(sensor, 0)
        until(
            "the second dead letter",
            lambda: get_json(f"{BASE}/v1/notifications?client_id={client}&status=failed")["items"],
        )
        page.goto(f"{BASE}/ui/#/notifications?status=failed&since=1h&client_id={client}")
        expect(page.locator("tbody tr").first).to_contain_text("ops receiver")
        Receiver.status = 200
        page.get_by_role("button", name="Replay the failed ones").click()
        expect(page.locator("#notice")).to_contain_text("1 failed notification(s) sent again")
        until(
            "the replayed one delivered",
            lambda: any(s == 200 and b.get("data") == 0 for s, b in list(Receiver.received)),
        )

        # The remaining pages, for the screenshots.
        page.goto(f"{BASE}/ui/#/sensors/{sensor}")
        expect(page.get_by_role("heading", name=f"Sensor {sensor}")).to_be_visible()
        shot(page, "sensor")
        page.goto(f"{BASE}/ui/#/sensors")
        expect(page.get_by_role("link", name=sensor)).to_be_visible()
        shot(page, "sensors")
        page.goto(f"{BASE}/ui/#/clients/{client}")
        expect(page.get_by_text("Endpoint health")).to_be_visible()
        expect(page.locator("dl.props").nth(1)).to_contain_text("%")
        expect(page.get_by_role("img", name="Failed attempts, percent, last hour")).to_be_visible()
        expect(page.get_by_text("Failure rate, last hour:")).to_contain_text("% of")
        expect(page.get_by_role("img", name="Median attempt duration, ms, last hour")).to_be_visible()

        # A test event from the client's page: sent at once, its answer shown.
        page.get_by_role("button", name="Send test").click()
        expect(page.locator("output.test-result")).to_contain_text("Test delivered: HTTP 200")
        assert any(b.get("type") == "client.test" for _, b in Receiver.received), Receiver.received
        # The types it receives: all but reminders.
        page.get_by_label("sensor.still_lost").uncheck()
        page.get_by_role("button", name="Save types").click()
        expect(page.locator("dl.props").first).to_contain_text(
            "sensor.state_changed, sensor.connection_lost, sensor.connection_restored")

        # Issue #51: what the receiver needs beyond a signature, set on the client's page;
        # the values are never shown again, and a test event carries them.
        props = page.locator("dl.props").first
        page.get_by_label("Headers (one Name: value a line; [redacted] keeps a value)").fill(
            "X-Console: yes\nX-Other: two words")
        page.get_by_label("Authentication").select_option("bearer")
        page.get_by_label("Token", exact=True).fill("console-token")
        cert, key = certificate("console client")
        page.get_by_label("Client certificate (PEM; leave empty to keep the current one)").fill(cert)
        page.get_by_label("Its private key (PEM)").fill(key)
        page.get_by_role("button", name="Save receiver settings").click()
        expect(props).to_contain_text("X-Console: [redacted], X-Other: [redacted]")
        expect(props).to_contain_text("bearer token")
        expect(props).to_contain_text("CN=console client, expires")
        assert "console-token" not in page.content() and "PRIVATE KEY" not in page.content()

        def tested():
            before = len(Receiver.headers)
            page.get_by_role("button", name="Send test").click()
            until("the test event", lambda: len(Receiver.headers) > before)
            return Receiver.headers[-1]

        got = tested()
        assert got.get("x-console") == "yes" and got.get("x-other") == "two words", got
        assert got.get("authorization") == "Bearer console-token", got
        # Saved again untouched: "[redacted]" keeps each value, the auth and certificate stay.
        page.get_by_role("button", name="Save receiver settings").click()
        expect(page.locator("#notice")).to_contain_text("Saved: its next requests")
        got = tested()
        assert got.get("x-console") == "yes" and got.get("authorization") == "Bearer console-token", got
        # A wrong certificate is refused with the reason; then the certificate is removed.
        page.get_by_label("Client certificate (PEM; leave empty to keep the current one)").fill("not a certificate")
        page.get_by_role("button", name="Save receiver settings").click()
        expect(page.locator("#notice")).to_contain_text("tls.client_cert_pem")
        page.get_by_label("Client certificate (PEM; leave empty to keep the current one)").fill("")
        page.get_by_label("remove the certificate").check()
        page.get_by_role("button", name="Save receiver settings").click()
        expect(props).to_contain_text("Client certificatenone")
        shot(page, "client")

        long_pages_keep_the_header(browser, hook, client)
        one_slice_is_drawn(browser, hook)
        times_name_their_zone(browser, sensor)
        door_alarms_survive_a_save(browser)
        sites_and_silences(browser, hook)
        alarms_are_acknowledged_from_the_console(browser, hook)
        escalation_and_arming_are_set_from_the_console(browser)

        assert not errors, f"errors in the page: {errors}"
        browser.close()
    server.shutdown()
    print(f"console: ok (sensor {sensor}, client {client}); screenshots in {SHOTS}/")


if __name__ == "__main__":
    try:
        if os.environ.get("LATCH_CLUSTER"):
            cluster_flow(os.environ["LATCH_CLUSTER"].split(","))
        elif os.environ.get("LATCH_TOKEN"):
            token_flow(os.environ["LATCH_TOKEN"])
        else:
            main()
    except AssertionError as e:
        print(f"console: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
