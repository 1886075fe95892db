"""Issue #70: the console thinks in buildings. The sensors list has a site column and a
site filter, a CSV import takes a `site_id` column, the fleet page says how many sites are
down and lists them, and a site's notification shows its site and the sensors it named
(found from any of them, not only the one whose lane it travels in).

    LATCH_URL=http://127.0.0.1:8080 python3 tests/ui/sites_view.py

Environment: LATCH_URL (required; latch with no API token and a short LATCH_SITE_GRACE, as
scripts/ui starts it), CHROMIUM (default /usr/bin/chromium).
"""

import json
import os
import random
import re
import string
import sys
import time
import urllib.request

from playwright.sync_api import expect, sync_playwright

BASE = os.environ["LATCH_URL"].rstrip("/")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
WAIT_MS = 20_000
# Nothing listens there: the notifications are made all the same, which is all this needs.
HOOK = "http://127.0.0.1:9/hook"


def call(method, path, body=None):
    req = urllib.request.Request(
        f"{BASE}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req) as r:
        text = r.read()
        return json.loads(text) if text else None


def until(what, check, seconds=40):
    deadline = time.time() + seconds
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def main():
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    dark, other = f"dark-{suffix}", f"imp-{suffix}"
    sensors = [f"sv{suffix}{i}" for i in range(3)]
    loose = f"sv{suffix}x"
    for site in [dark, other]:
        call("POST", "/v1/sites", {"id": site, "name": f"Building {site}"})
    client = call("POST", "/v1/clients", {"name": f"sites view {suffix}", "url": HOOK})["id"]
    for s in sensors:
        call("POST", "/v1/sensors", {"id": s, "address": f"Svobody 23, room {s}",
                                     "heartbeat_timeout_s": 1, "site_id": dark})
        call("PUT", f"/v1/clients/{client}/sensors/{s}")
    call("POST", "/v1/sensors", {"id": loose, "address": "Svobody 23, yard"})
    call("POST", "/v1/readings", [{"sensor_id": s, "data": 1} for s in sensors])

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        # The sensors list: a site column, and a filter that keeps one site's sensors.
        page.goto(f"{BASE}/ui/#/sensors?q=sv{suffix}")
        expect(page.get_by_role("columnheader", name="Site")).to_be_visible()
        row = page.locator("tbody tr", has_text=sensors[0])
        expect(row.get_by_role("link", name=dark)).to_be_visible()
        expect(page.locator("tbody tr", has_text=loose)).to_contain_text("—")
        page.get_by_label("Site", exact=True).select_option(dark)
        expect(page).to_have_url(re.compile(f"site_id={dark}"))
        expect(page.locator("tbody tr")).to_have_count(3)
        expect(page.locator("tbody")).not_to_contain_text(loose)

        # A CSV import with a site_id column, by a header line and without one.
        # Only the hash changes: wait for the page without a site chosen, or the form filled
        # could be the one about to be replaced.
        page.goto(f"{BASE}/ui/#/sensors")
        expect(page.get_by_label("Site", exact=True)).to_have_value("")
        imported = [f"ci{suffix}{i}" for i in range(3)]
        page.get_by_label("CSV:").fill(
            f"id,site_id,address\n{imported[0]},{other},Lenina 4\n{imported[1]},,Lenina 5\n")
        page.get_by_role("button", name="Import").click()
        expect(page.locator("#notice")).to_contain_text("Import: 2 of 2 row(s) created.")
        page.get_by_label("CSV:").fill(f"{imported[2]},Lenina 6,60,{other}\n")
        page.get_by_role("button", name="Import").click()
        expect(page.locator("#notice")).to_contain_text("Import: 1 of 1 row(s) created.")
        got = {s: call("GET", f"/v1/sensors/{s}") for s in imported}
        assert [got[s]["site_id"] for s in imported] == [other, None, other], got
        assert got[imported[2]]["heartbeat_timeout_s"] == 60, got[imported[2]]
        in_other = call("GET", f"/v1/sensors?site_id={other}")["items"]
        assert [s["id"] for s in in_other] == [imported[0], imported[2]], in_other
        page.get_by_label("CSV:").fill("id,address,floor\nzz1,Lenina 7,3\n")
        page.get_by_role("button", name="Import").click()
        expect(page.locator("#notice")).to_contain_text("unknown column(s) floor")

        # The building goes dark: the fleet page says how many sites are down, and which.
        until(f"{dark} down", lambda: call("GET", f"/v1/sites/{dark}")["status"]["state"] == "down")
        page.goto(f"{BASE}/ui/#/fleet")
        expect(page.get_by_role("heading", name="Fleet")).to_be_visible()
        n = call("GET", "/v1/fleet")["sites_down"]
        assert n >= 1, n
        card = page.get_by_role("link", name=f"{n} site{'' if n == 1 else 's'} down", exact=True)
        expect(card).to_be_visible()
        down = page.get_by_role("region", name="Sites down")
        expect(down.get_by_role("link", name=dark)).to_be_visible()
        expect(down.locator("tr", has_text=dark)).to_contain_text("3 of 3")

        # Its loss is one notification, in the lane of its first sensor, found by the others.
        def loss():
            got = call("GET", f"/v1/notifications?client_id={client}&sensor_id={sensors[2]}"
                              "&type=site.connection_lost")["items"]
            return got[0] if got else None
        n = until("the site's loss", loss)
        assert n["site_id"] == dark and n["sensor_ids"] == sensors and n["sensor_id"] == sensors[0], n
        page.goto(f"{BASE}/ui/#/notifications/{n['id']}")
        props = page.locator("dl.props")
        expect(props.get_by_role("link", name=dark)).to_be_visible()
        expect(props).to_contain_text("Sensors named")
        for s in sensors:
            expect(props.get_by_role("link", name=s)).to_be_visible()
        expect(props).not_to_contain_text("Sensor" + sensors[0])

        # The list filtered by a sensor the loss named but does not travel with.
        page.goto(f"{BASE}/ui/#/notifications?sensor_id={sensors[1]}")
        row = page.locator("tbody tr", has_text=n["id"])
        expect(row).to_contain_text(f"Site {dark}: {', '.join(sensors)}")
        expect(row.get_by_role("link", name=f"Site {dark}")).to_be_visible()

        assert not errors, f"errors in the page: {errors}"
        browser.close()
    print(f"sites view: ok ({dark} down: site column, filter, CSV site_id, fleet, named sensors)")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"sites view: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
