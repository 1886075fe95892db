//! The operator console and the API it adds: the embedded pages, `GET /v1/fleet`, and the
//! live stream `GET /v1/stream` (server-sent events as commits happen).

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{TestServer, unique};

/// An open `GET /v1/stream`, read event by event.
struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    async fn open(s: &TestServer, token: Option<&str>) -> reqwest::Response {
        let mut req = s.http.get(format!("{}/v1/stream", s.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send().await.unwrap()
    }

    async fn start(s: &TestServer) -> Self {
        let response = Self::open(s, None).await;
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event that is not a keep-alive: its name and data. The bound only keeps a
    /// broken stream from hanging the test.
    async fn next(&mut self) -> (String, Value) {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                while let Some(end) = self.buffer.find("\n\n") {
                    let block: String = self.buffer.drain(..end + 2).collect();
                    let mut name = None;
                    let mut data = String::new();
                    for line in block.lines() {
                        if let Some(n) = line.strip_prefix("event:") {
                            name = Some(n.trim().to_string());
                        } else if let Some(d) = line.strip_prefix("data:") {
                            data.push_str(d.trim());
                        }
                    }
                    if let Some(name) = name {
                        return (name, serde_json::from_str(&data).unwrap());
                    }
                }
                let chunk = self.response.chunk().await.unwrap().expect("stream ended");
                self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        })
        .await
        .expect("an event within 20 s")
    }

    /// The next event while `clock` moves on a quarter second at a time up to `limit`, as
    /// a real clock passes: a round still busy when a manual clock jumps sleeps a second
    /// past the jump, and one jump would leave it asleep. It moves only after a second
    /// without an event, so a slow machine's event is not overtaken by the clock.
    async fn next_ticking(&mut self, clock: &Clock, limit: i64) -> (String, Value) {
        loop {
            if let Ok(e) = tokio::time::timeout(Duration::from_secs(1), self.next()).await {
                return e;
            }
            assert!(clock.now() < limit, "no event by the clock's {limit}");
            clock.set((clock.now() + 250).min(limit));
        }
    }
}

#[tokio::test]
async fn the_stream_carries_committed_changes_lost_and_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(
        tmp.path(),
        |c| c.heartbeat_timeout = Duration::from_secs(2),
        clock.clone(),
    )
    .await;
    let id = unique("st");
    s.sensor(&id).await;
    let mut stream = Stream::start(&s).await;

    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    let (name, data) = stream.next().await;
    assert_eq!(name, "sensor.state_changed");
    assert_eq!(data["type"], "sensor.state_changed");
    assert_eq!(data["sensor_id"], id.as_str());
    assert_eq!(
        (data["data"].clone(), data["previous"].clone()),
        (json!(1), Value::Null)
    );

    s.readings(json!({"sensor_id": id, "data": 1})).await;
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let (_, data) = stream.next().await;
    assert_eq!(
        (data["data"].clone(), data["previous"].clone()),
        (json!(0), json!(1)),
        "a repeat is no event: the next one is the change to 0"
    );

    clock.set(t0 + 2_000);
    let (name, data) = stream.next().await;
    assert_eq!(name, "sensor.connection_lost");
    assert_eq!(data["sensor_id"], id.as_str());
    assert!(data["last_seen_at"].is_string());
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let (name, _) = stream.next().await;
    assert_eq!(name, "sensor.connection_restored");

    // Shutdown ends open streams (the graceful stop waits for every response to end).
    s.stop().await;
    let end = stream.response.chunk().await;
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}

/// Issue #50: a site that goes down and comes back is one stream event each, with its
/// sensors counted, and the console's lists show it: down first, its lost sensors.
#[tokio::test]
async fn the_stream_carries_a_site_going_down_and_coming_back() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(
        tmp.path(),
        |c| {
            c.heartbeat_timeout = Duration::from_secs(2);
            c.site_grace = Duration::from_secs(1);
        },
        clock.clone(),
    )
    .await;
    let site = unique("bldg");
    let (status, _) = s.post("/v1/sites", json!({"id": site})).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = s
        .post("/v1/sites", json!({"id": format!("{site}-b")}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let ids: Vec<String> = (0..4).map(|i| unique(&format!("ss{i}"))).collect();
    for id in &ids {
        let (status, _) = s
            .post(
                "/v1/sensors",
                json!({"id": id, "address": "Svobody 23", "site_id": site}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let t0 = clock.now();
    // Three of four report, then fall silent; the fourth never reported.
    s.readings(json!(
        ids[..3]
            .iter()
            .map(|id| json!({"sensor_id": id, "data": 1}))
            .collect::<Vec<_>>()
    ))
    .await;
    let mut stream = Stream::start(&s).await;
    clock.set(t0 + 2_000);
    let mut lost = 0;
    while lost < 3 {
        let (name, _) = stream.next().await;
        assert_eq!(name, "sensor.connection_lost", "the sensors' own first");
        lost += 1;
    }
    // The grace (1 s) runs out on the next rounds; the fourth sensor has no deadline.
    let (name, data) = stream.next_ticking(&clock, t0 + 6_000).await;
    assert_eq!(name, "site.connection_lost");
    assert_eq!(data["type"], "site.connection_lost");
    assert_eq!(data["site_id"], site.as_str());
    assert_eq!(
        (data["sensors"].clone(), data["lost"].clone()),
        (json!(4), json!(3))
    );
    assert!(data["at"].is_string());

    let (_, down) = s.get("/v1/sites?state=down").await;
    let named: Vec<&str> = down["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(named, [site.as_str()], "the other site is up");
    let (_, up) = s.get("/v1/sites?state=up").await;
    assert_eq!(up["items"][0]["id"], format!("{site}-b"));
    let (status, _) = s.get("/v1/sites?state=sideways").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (_, lost) = s
        .get(&format!("/v1/sites/{site}/sensors?connection=lost&limit=2"))
        .await;
    assert_eq!(lost["items"].as_array().unwrap().len(), 2);
    assert_eq!(lost["items"][0]["status"]["connection"], "lost");
    assert!(lost["next_cursor"].is_string(), "a third lost one: {lost}");
    let (_, all) = s.get(&format!("/v1/sites/{site}/sensors")).await;
    assert_eq!(all["items"].as_array().unwrap().len(), 4);
    let (status, _) = s.get("/v1/sites/nowhere/sensors").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let back = clock.now();
    s.readings(json!(
        ids[..3]
            .iter()
            .map(|id| json!({"sensor_id": id, "data": 0}))
            .collect::<Vec<_>>()
    ))
    .await;
    // The next round decides the return; the clock stops short of the three sensors' next
    // deadline (2 s on), past which they are lost again and the site rightly stays down.
    let mut names = Vec::new();
    loop {
        let (name, data) = stream.next_ticking(&clock, back + 1_750).await;
        if name == "site.connection_restored" {
            assert_eq!(
                (data["site_id"].as_str(), data["lost"].clone()),
                (Some(site.as_str()), json!(0))
            );
            break;
        }
        names.push(name);
    }
    assert!(
        names.iter().all(|n| n.starts_with("sensor.")),
        "the sensors' own events before the site's: {names:?}"
    );
    s.stop().await;
}

#[tokio::test]
async fn the_stream_asks_for_the_token() {
    let token = format!("t-{}", unique("tok"));
    let s = TestServer::start_with(|c| c.api_token = Some(token.clone())).await;
    assert_eq!(Stream::open(&s, None).await.status().as_u16(), 401);
    assert_eq!(Stream::open(&s, Some("wrong")).await.status().as_u16(), 401);
    assert_eq!(Stream::open(&s, Some(&token)).await.status().as_u16(), 200);
    s.stop().await;
}

impl Stream {
    /// Waits until the server ends the stream; `false` if it was still open after `secs`
    /// (events and keep-alives are read past meanwhile).
    async fn ends_within(&mut self, secs: u64) -> bool {
        tokio::time::timeout(Duration::from_secs(secs), async {
            while let Ok(Some(_)) = self.response.chunk().await {}
        })
        .await
        .is_ok()
    }
}

/// A stream is the whole fleet's events: it lasts only while its caller may read them. A
/// deleted token is refused from the next request on, and its open streams end.
#[tokio::test]
async fn a_deleted_tokens_stream_ends() {
    let bootstrap = format!("t-{}", unique("tok"));
    let s = TestServer::start_with(|c| c.api_token = Some(bootstrap.clone())).await;
    let id = unique("rv");
    s.sensor(&id).await;
    let (st, body) = s
        .post(
            "/v1/tokens",
            json!({"name": "dashboard", "scopes": ["read"]}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let (token_id, token) = (
        body["id"].as_str().unwrap(),
        body["token"].as_str().unwrap(),
    );
    let response = Stream::open(&s, Some(token)).await;
    assert_eq!(response.status().as_u16(), 200);
    let mut stream = Stream {
        response,
        buffer: String::new(),
    };
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    assert_eq!(stream.next().await.0, "sensor.state_changed", "it streams");

    let (st, _) = s.delete(&format!("/v1/tokens/{token_id}")).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    // Events go on; the deleted token's stream must not carry them.
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    assert!(
        stream.ends_within(10).await,
        "the stream of a deleted token still open"
    );
    s.stop().await;
}

#[tokio::test]
async fn fleet_counts_sensors_by_connection() {
    let s = TestServer::start().await;
    let (st, body) = s.get("/v1/fleet").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        body,
        json!({"sensors": 0, "online": 0, "lost": 0, "unknown": 0, "notifications_pending": 0,
            "sites_down": 0, "held": 0, "battery_low": 0, "flapping": 0, "history_from": null})
    );
    let (a, b) = (unique("fa"), unique("fb"));
    s.sensor(&a).await;
    s.sensor(&b).await;
    s.readings(json!({"sensor_id": a, "data": 1})).await;
    let (_, body) = s.get("/v1/fleet").await;
    assert_eq!(
        (&body["sensors"], &body["online"], &body["unknown"]),
        (&json!(2), &json!(1), &json!(1))
    );
    s.stop().await;
}

#[tokio::test]
async fn the_console_is_served_from_the_binary() {
    let s = TestServer::start().await;
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for from in ["/", "/ui"] {
        let r = plain.get(format!("{}{from}", s.base)).send().await.unwrap();
        assert!(r.status().is_redirection(), "{from}: {}", r.status());
        assert_eq!(r.headers()["location"], "/ui/");
    }
    for (path, media, needle) in [
        (
            "/ui/",
            "text/html",
            "<script type=\"module\" src=\"/ui/app.js\">",
        ),
        ("/ui/app.js", "text/javascript", "/v1/stream"),
        ("/ui/audit.js", "text/javascript", "/v1/audit"),
        ("/ui/style.css", "text/css", ":root"),
    ] {
        let r = plain.get(format!("{}{path}", s.base)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(media), "{path}: {ct}");
        assert!(
            r.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .starts_with("default-src 'self'")
        );
        assert!(r.text().await.unwrap().contains(needle), "{path}");
    }
    let r = plain
        .get(format!("{}/ui/secret.txt", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    s.stop().await;
}

#[tokio::test]
async fn the_book_is_served_from_the_binary_beside_the_console_without_a_token() {
    // A token is required for the API; the book, like the console's files, is open.
    let s = TestServer::start_with(|c| c.api_token = Some("book-token".into())).await;
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = plain.get(format!("{}/docs", s.base)).send().await.unwrap();
    assert_eq!(r.headers()["location"], "/docs/");
    for (path, media, needle) in [
        ("/docs/", "text/html", "<nav>"),
        (
            "/docs/reference/settings.html",
            "text/html",
            "<h2 id=\"heartbeat_timeout\">",
        ),
        (
            "/docs/reference/events.html",
            "text/html",
            "sensor.connection_lost",
        ),
        (
            "/docs/find.html",
            "text/html",
            "settings.html#heartbeat_timeout",
        ),
    ] {
        let r = plain.get(format!("{}{path}", s.base)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(media), "{path}: {ct}");
        assert!(
            r.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .starts_with("default-src 'none'"),
            "{path}"
        );
        let text = r.text().await.unwrap();
        assert!(text.contains(needle), "{path}: no {needle} in\n{text}");
    }
    let r = plain
        .get(format!("{}/docs/images/console-fleet.png", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "image/png");
    assert!(r.bytes().await.unwrap().starts_with(b"\x89PNG"));
    for missing in ["/docs/nothing.html", "/docs/../Cargo.toml"] {
        let r = plain
            .get(format!("{}{missing}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404, "{missing}");
    }
    let r = plain
        .get(format!("{}/v1/sensors", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "the API still wants its token");
    s.stop().await;
}
