"""Issue #70: a client's page offers every notification type the API lists, and saving it
unchanged changes nothing. The page kept its own list of four `sensor.*` types, so
unticking one saved the three left and silently dropped `site.connection_lost` and
`site.connection_restored`, and saving a client subscribed to a site type without touching
anything unsubscribed it.

    LATCH_URL=http://127.0.0.1:8080 python3 tests/ui/client_types.py

Environment: LATCH_URL (required; latch with no API token, loopback receivers allowed),
CHROMIUM (default /usr/bin/chromium).
"""

import json
import os
import sys
import urllib.request

from playwright.sync_api import expect, sync_playwright

BASE = os.environ["LATCH_URL"].rstrip("/")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
WAIT_MS = 20_000
HOOK = "http://127.0.0.1:9/hook"


def call(method, path, body=None):
    req = urllib.request.Request(
        f"{BASE}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def client(name, events):
    body = {"name": name, "url": HOOK}
    if events is not None:
        body["events"] = events
    return call("POST", "/v1/clients", body)["id"]


def events_of(client_id):
    return call("GET", f"/v1/clients/{client_id}")["events"]


def save(page, says):
    """Saves the types and waits for that save's own answer: the notice of an earlier
    save stays up across pages, so it cannot tell that this one landed."""
    with page.expect_response(lambda r: r.request.method == "PUT" and "/v1/clients/" in r.url):
        page.get_by_role("button", name="Save types").click()
    expect(page.locator("#notice")).to_contain_text(says)


def main():
    # Every body latch sends is listed (issue #75); a client chooses among the notifications,
    # not the envelope of a batch nor the test sent on request.
    listed = [t["type"] for t in call("GET", "/v1/event-types")["items"]]
    assert "batch" in listed and "client.test" in listed, listed
    types = [t for t in listed if t not in ("batch", "client.test")]
    assert "site.connection_lost" in types and "site.connection_restored" in types, types
    everything = client("types-all", None)
    some = ["sensor.state_changed", "site.connection_lost"]
    chosen = client("types-some", some)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        # Every type the API lists is offered, each with what it means.
        page.goto(f"{BASE}/ui/#/clients/{everything}")
        boxes = page.locator("input[name=events]")
        expect(boxes).to_have_count(len(types))
        assert [boxes.nth(i).get_attribute("value") for i in range(len(types))] == types
        for t in types:
            expect(page.get_by_label(t, exact=True)).to_be_checked()
        expect(page.get_by_text("A site went down")).to_be_visible()

        # Saved unchanged: still every type, those added later included.
        save(page, "Saved: nothing changed")
        got = events_of(everything)
        assert got is None, f"saved unchanged, every type became {got}"

        # A client with a site type: saved unchanged, it keeps exactly what it had.
        page.goto(f"{BASE}/ui/#/clients/{chosen}")
        expect(page.get_by_role("heading", name="Client types-some")).to_be_visible()
        for t in types:
            box = expect(page.get_by_label(t, exact=True))
            box.to_be_checked() if t in some else box.not_to_be_checked()
        save(page, "Saved: nothing changed")
        got = events_of(chosen)
        assert got == some, f"saved unchanged, {some} became {got}"

        # Unticking one type drops that one only: the site alarms stay.
        # (The page before stays up until this one is drawn: wait for this one's.)
        page.goto(f"{BASE}/ui/#/clients/{everything}")
        expect(page.get_by_role("heading", name="Client types-all")).to_be_visible()
        expect(page.get_by_label("sensor.still_lost", exact=True)).to_be_checked()
        page.get_by_label("sensor.still_lost", exact=True).uncheck()
        save(page, "receives only what is ticked")
        left = events_of(everything)
        assert left == [t for t in types if t != "sensor.still_lost"], left
        expect(page.locator("dl.props").first).to_contain_text("site.connection_restored")

        assert not errors, f"errors in the page: {errors}"
        browser.close()
    print(f"client types: ok ({len(types)} types offered; saved unchanged, nothing changed)")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"client types: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
