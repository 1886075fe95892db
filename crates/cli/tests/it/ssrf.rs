//! The SSRF guard, from outside: latch started *without* the tests' loopback allow list
//! refuses clients whose URL points inside the network, refuses at connect time what
//! resolves there when an attempt is made, and never follows a redirect there.

use std::sync::atomic::Ordering;

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::utils::{Receiver, TestServer, counting, eventually, redirecting, unique};

/// A latch with the guard as shipped: no network let through.
async fn guarded() -> TestServer {
    TestServer::start_with(|c| c.delivery_allow_nets.clear()).await
}

async fn create(s: &TestServer, url: &str) -> (StatusCode, Value) {
    s.post("/v1/clients", json!({"name": "guarded", "url": url}))
        .await
}

#[tokio::test]
async fn clients_on_blocked_literal_addresses_are_refused() {
    let s = guarded().await;
    for (url, why) in [
        ("http://127.0.0.1:9/hook", "127.0.0.1 is a loopback address"),
        ("http://10.1.2.3/hook", "10.1.2.3 is a private address"),
        ("http://192.168.0.10:8080/", "a private address"),
        ("http://100.64.0.1/", "carrier-grade NAT"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254 is a link-local address",
        ),
        ("http://0.0.0.0:9/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
    ] {
        let (st, body) = create(&s, url).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
        assert_eq!(body["error"]["code"], "invalid", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("url is not allowed"), "{url}: {message}");
        assert!(message.contains(why), "{url}: {message}");
        assert!(
            message.contains("LATCH_DELIVERY_ALLOW_NETS"),
            "says how to let it through: {message}"
        );
    }
    // IPv6 literals, the IPv4-mapped form included, never get in (the URL shape takes
    // no IPv6 literal; the guard would refuse these too, see delivery::guard's tests).
    for url in ["http://[::1]:9/hook", "http://[::ffff:127.0.0.1]/hook"] {
        let (st, body) = create(&s, url).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
    }

    // A replace is held to the same rule, and leaves the client as it was.
    let (st, body) = create(&s, "https://1.1.1.1/hook").await;
    assert_eq!(st, StatusCode::CREATED, "a global address passes: {body}");
    let id = body["id"].as_str().unwrap();
    let (st, body) = s
        .put(
            &format!("/v1/clients/{id}"),
            json!({"name": "moved", "url": "http://169.254.169.254/"}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (_, body) = s.get(&format!("/v1/clients/{id}")).await;
    assert_eq!(body["url"], "https://1.1.1.1/hook");
    s.stop().await;
}

#[tokio::test]
async fn a_name_that_resolves_only_to_blocked_addresses_is_refused() {
    let s = guarded().await;
    let (st, body) = create(&s, "http://localhost:9/hook").await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("localhost resolves only to addresses webhooks are not sent to"),
        "{message}"
    );
    assert!(message.contains("loopback"), "{message}");
    s.stop().await;

    // The allow list lets it through.
    let s = TestServer::start_with(|c| {
        c.delivery_allow_nets = vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]
    })
    .await;
    let (st, body) = create(&s, "http://localhost:9/hook").await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    s.stop().await;
}

#[tokio::test]
async fn https_only_refuses_http_urls() {
    // A client registered before https_only was turned on.
    let receiver = Receiver::start().await;
    let s = TestServer::start().await;
    let sensor = unique("hs");
    s.sensor(&sensor).await;
    let client = s.client(&receiver.url).await;
    s.link(&client, &sensor).await;
    let dir = s.dir.clone();
    let tmp = s.stop().await;

    let s = TestServer::start_in(&dir, |c| c.delivery_https_only = true).await;
    let (st, body) = create(&s, "http://127.0.0.1:9/hook").await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("url must use https"), "{message}");
    let (st, body) = create(&s, "https://127.0.0.1:9/hook").await;
    assert_eq!(st, StatusCode::CREATED, "{body}");

    // Its attempts are refused, not sent in plaintext.
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    let detail = failed_one(&s, &sensor).await;
    let attempts = detail["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{detail}");
    let error = attempts[0]["error"].as_str().unwrap();
    assert!(
        error.starts_with("destination_not_allowed: url must use https"),
        "{error}"
    );
    assert_eq!(receiver.count(), 0);
    s.stop().await;
    drop(tmp);
}

/// The notification of `sensor` once it failed, with its attempts.
async fn failed_one(s: &TestServer, sensor: &str) -> Value {
    let failed = eventually(15, "a failed notification", || async {
        s.notifications(&format!("sensor_id={sensor}&status=failed"))
            .await
            .pop()
    })
    .await;
    let (_, detail) = s
        .get(&format!(
            "/v1/notifications/{}",
            failed["id"].as_str().unwrap()
        ))
        .await;
    detail
}

/// Clients taken while the allow list let them in, and then attempted under a narrower
/// one: the guard judges the address each attempt connects to (which is what keeps a
/// name re-pointed to 127.0.0.1 after its check, DNS rebinding, from getting through),
/// so every attempt is refused, recorded as such and not retried.
#[tokio::test]
async fn an_address_refused_at_connect_time_fails_the_notification_without_retry() {
    let receiver = Receiver::start().await;
    let port = receiver.url.rsplit(':').next().unwrap().to_string();
    let by_name = format!("http://localhost:{port}");
    let literal = receiver.url.clone();
    let s = TestServer::start().await; // 127.0.0.0/8 allowed
    let mut sensors = Vec::new();
    for (url, why) in [
        (&by_name, "localhost resolves only to"),
        (&literal, "127.0.0.1 is a loopback address"),
    ] {
        let sensor = unique("sf");
        s.sensor(&sensor).await;
        let client = s.client(url).await;
        s.link(&client, &sensor).await;
        sensors.push((sensor, why));
    }
    let dir = s.dir.clone();
    let tmp = s.stop().await;

    // localhost resolves to 127.0.0.1 (and perhaps ::1); only 127.0.0.2 is let through.
    let s = TestServer::start_in(&dir, |c| {
        c.delivery_allow_nets = vec!["127.0.0.2/32".parse().unwrap()];
        c.retry_max_attempts = 10;
    })
    .await;
    for (sensor, why) in &sensors {
        s.readings(json!({"sensor_id": sensor, "data": 1})).await;
        let detail = failed_one(&s, sensor).await;
        let attempts = detail["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "refused once, never retried: {detail}");
        assert_eq!(attempts[0]["status_code"], Value::Null, "{detail}");
        let error = attempts[0]["error"].as_str().unwrap();
        assert!(
            error.starts_with("destination_not_allowed: "),
            "{sensor}: {error}"
        );
        assert!(error.contains(why), "{error}");
    }
    assert_eq!(receiver.count(), 0, "nothing reached the receiver");
    let metrics = s.http.get(format!("{}/metrics", s.base)).send().await;
    let metrics = metrics.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("latch_delivery_attempts_total{outcome=\"destination_not_allowed\"}"),
        "an outcome of its own"
    );
    s.stop().await;
    drop(tmp);
}

/// A receiver on an allowed address cannot bounce latch to the metadata service (or to
/// anything else) with a redirect: it is never followed.
#[tokio::test]
async fn a_redirect_to_the_metadata_address_is_not_followed() {
    let s = TestServer::start_with(|c| c.retry_max_attempts = 1).await;
    let (target, hits) = counting("/latest/meta-data/").await;
    for location in [
        "http://169.254.169.254/latest/meta-data/".to_string(),
        target,
    ] {
        let sensor = unique("rm");
        s.sensor(&sensor).await;
        let client = s.client(&redirecting(302, &location).await).await;
        s.link(&client, &sensor).await;
        s.readings(json!({"sensor_id": sensor, "data": 1})).await;
        let detail = failed_one(&s, &sensor).await;
        let attempts = detail["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{detail}");
        assert_eq!(attempts[0]["status_code"], 302, "{detail}");
        assert!(
            attempts[0]["error"]
                .as_str()
                .unwrap()
                .contains("redirects are not followed"),
            "{detail}"
        );
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "nothing reaches the redirect target"
    );
    s.stop().await;
}
