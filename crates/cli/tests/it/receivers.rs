//! Receivers that need more than a signature (issue #51), each a real server started here:
//! headers and static authentication as received, an HTTPS receiver that demands a client
//! certificate, a token endpoint that issues, expires and revokes OAuth2 tokens, and a
//! CONNECT proxy every webhook goes through while the SSRF guard still judges receivers.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::utils::receivers::{Ca, MtlsReceiver, OAUTH_CLIENT, OAUTH_SECRET, OAuth, Proxy};
use crate::utils::{Receiver, TestServer, eventually, unique};

/// A sensor linked to a new client made of `body` (with a name added); the client's id.
async fn linked(s: &TestServer, mut body: Value) -> (String, String) {
    body["name"] = json!("receiver test");
    let (st, created) = s.post("/v1/clients", body).await;
    assert_eq!(st, StatusCode::CREATED, "{created}");
    let client = created["id"].as_str().unwrap().to_string();
    let sensor = unique("rx");
    s.sensor(&sensor).await;
    s.link(&client, &sensor).await;
    (sensor, client)
}

/// A state change of `sensor` (each call flips it).
async fn change(s: &TestServer, sensor: &str, data: u8) {
    s.readings(json!({"sensor_id": sensor, "data": data})).await;
}

/// The client's notifications with this status.
async fn with_status(s: &TestServer, client: &str, status: &str) -> Vec<Value> {
    s.notifications(&format!("client_id={client}&status={status}"))
        .await
}

async fn delivered(s: &TestServer, client: &str, n: usize) -> Vec<Value> {
    eventually(20, &format!("{n} delivered"), || async {
        let got = with_status(s, client, "delivered").await;
        (got.len() >= n).then_some(got)
    })
    .await
}

#[tokio::test]
async fn headers_and_static_auth_arrive_as_set_and_read_back_redacted() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    let (sensor, client) = linked(
        &s,
        json!({"url": r.url, "headers": {"X-Api-Key": "k-123 456", "X-Tenant": "acme"},
               "auth": {"type": "bearer", "token": "static-token-1"}}),
    )
    .await;
    change(&s, &sensor, 1).await;
    let got = r.wait_for(1, 20).await;
    let h = &got[0].headers;
    assert_eq!(h["x-api-key"], "k-123 456");
    assert_eq!(h["x-tenant"], "acme");
    assert_eq!(h["authorization"], "Bearer static-token-1");
    assert!(h.get("webhook-signature").is_some(), "still signed");

    // Read back: names with "[redacted]", the auth without its token.
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    assert_eq!(
        c["headers"],
        json!({"X-Api-Key": "[redacted]", "X-Tenant": "[redacted]"})
    );
    assert_eq!(c["auth"], json!({"type": "bearer"}));
    assert!(c["tls"].is_null());
    let (_, list) = s.get("/v1/clients").await;
    assert!(!list.to_string().contains("k-123") && !list.to_string().contains("static-token"));

    // Sent back as read, with a new header and Basic auth: the redacted value is kept.
    let mut back = c.clone();
    for k in [
        "id",
        "created_at",
        "health",
        "previous_secret_expires_at",
        "disabled_at",
        "disabled_reason",
        "secret",
        "tls",
    ] {
        back.as_object_mut().unwrap().remove(k);
    }
    back["headers"]["X-New"] = json!("new");
    back["auth"] = json!({"type": "basic", "username": "hook-user", "password": "pa ss:wd"});
    let (st, body) = s.put(&format!("/v1/clients/{client}"), back).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(
        body["auth"],
        json!({"type": "basic", "username": "hook-user"})
    );
    change(&s, &sensor, 0).await;
    let got = r.wait_for(2, 20).await;
    let h = &got[1].headers;
    assert_eq!(h["x-api-key"], "k-123 456", "kept through \"[redacted]\"");
    assert_eq!(h["x-new"], "new");
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode("hook-user:pa ss:wd");
    assert_eq!(h["authorization"], format!("Basic {basic}").as_str());

    // A test event carries them too; absent on replace keeps them, null removes them.
    let (st, test) = s
        .post(&format!("/v1/clients/{client}/test"), json!({}))
        .await;
    assert_eq!(
        (st, &test["status"]),
        (StatusCode::OK, &json!(200)),
        "{test}"
    );
    assert_eq!(r.received()[2].headers["x-tenant"], "acme");
    let (st, body) = s
        .put(
            &format!("/v1/clients/{client}"),
            json!({"name": "n", "url": r.url, "headers": null}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["headers"], json!({}));
    assert_eq!(body["auth"]["type"], "basic", "absent: kept");
    s.stop().await;
}

/// Issue #69: a replace that moves the client to another origin (scheme, host, port) must
/// give its headers and auth again: kept ones would go to the new host, and a test event
/// sends them at once. The refused replace changes nothing; a new path on the same origin
/// keeps them as before.
#[tokio::test]
async fn a_new_origin_needs_headers_and_auth_given_again() {
    let s = TestServer::start().await;
    let (first, other) = (Receiver::start().await, Receiver::start().await);
    let (_, client) = linked(
        &s,
        json!({"url": first.url, "headers": {"X-Api-Key": "header-secret-1"},
               "auth": {"type": "bearer", "token": "bearer-secret-1"}}),
    )
    .await;
    let path = format!("/v1/clients/{client}");
    for body in [
        json!({"name": "n", "url": other.url}),
        json!({"name": "n", "url": other.url, "headers": {"X-Api-Key": "[redacted]"},
               "auth": {"type": "bearer", "token": "new-token"}}),
        json!({"name": "n", "url": other.url, "headers": {"X-Api-Key": "new-value"}}),
    ] {
        let (st, e) = s.put(&path, body.clone()).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {e}");
        let message = e["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("origin"), "{e}");
    }
    // Nothing changed: a test event still goes to the first receiver, with its secrets.
    let (st, test) = s.post(&format!("{path}/test"), json!({})).await;
    assert_eq!(
        (st, &test["status"]),
        (StatusCode::OK, &json!(200)),
        "{test}"
    );
    assert!(other.received().is_empty(), "nothing reached the new host");
    assert_eq!(first.received()[0].headers["x-api-key"], "header-secret-1");

    // Another path of the same origin keeps them; a new origin with both given anew (or
    // removed) is taken.
    let (st, body) = s
        .put(
            &path,
            json!({"name": "n", "url": format!("{}/elsewhere", first.url)}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["auth"]["type"], "bearer");
    let (st, body) = s
        .put(
            &path,
            json!({"name": "n", "url": other.url, "headers": {"X-Api-Key": "header-secret-2"},
                   "auth": null}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let (st, test) = s.post(&format!("{path}/test"), json!({})).await;
    assert_eq!(
        (st, &test["status"]),
        (StatusCode::OK, &json!(200)),
        "{test}"
    );
    let got = &other.received()[0].headers;
    assert_eq!(got["x-api-key"], "header-secret-2");
    assert!(got.get("authorization").is_none(), "{got:?}");
    s.stop().await;
}

#[tokio::test]
async fn bad_receiver_settings_are_refused_with_a_reason() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    let ca = Ca::new("Clients CA");
    let good = ca.issue("latch", &["client.test"]);
    let other = ca.issue("other", &["client.test"]);
    for (body, says) in [
        (json!({"headers": {"Host": "x"}}), "latch sets this header"),
        (json!({"headers": {"Webhook-Id": "x"}}), "webhook-*"),
        (json!({"headers": {"X-A": "new\nline"}}), "printable ASCII"),
        (
            json!({"headers": {"X-A": "[redacted]"}}),
            "keeps a header's value",
        ),
        (
            json!({"headers": {"Authorization": "x"}, "auth": {"type": "bearer", "token": "t"}}),
            "use one or the other",
        ),
        (
            json!({"auth": {"type": "basic", "username": "a:b", "password": ""}}),
            "auth.username",
        ),
        (
            json!({"auth": {"type": "oauth2_client_credentials", "token_url": "ftp://x/t",
                "client_id": "c", "client_secret": "s"}}),
            "auth.token_url",
        ),
        (
            json!({"tls": {"client_cert_pem": "nope", "client_key_pem": good.key}}),
            "tls.client_cert_pem",
        ),
        (
            json!({"tls": {"client_cert_pem": good.cert, "client_key_pem": other.key}}),
            "not the certificate's",
        ),
        (
            json!({"tls": {"client_cert_pem": good.cert, "client_key_pem": good.key,
                "ca_pem": "not a CA"}}),
            "tls.ca_pem",
        ),
        // #69: a key pasted beside the certificate would be stored unsealed.
        (
            json!({"tls": {"client_cert_pem": format!("{}{}", good.cert, good.key),
                "client_key_pem": good.key}}),
            "tls.client_cert_pem: holds a private key",
        ),
    ] {
        let mut body = body;
        body["name"] = json!("bad");
        body["url"] = json!(r.url);
        let (st, answer) = s.post("/v1/clients", body.clone()).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
        for pem in [&good.cert, &good.key, &other.key] {
            assert!(
                !message.contains(&pem[40..80]),
                "no PEM quoted back: {message}"
            );
        }
    }
    let (_, list) = s.get("/v1/clients").await;
    assert_eq!(list["items"], json!([]), "nothing was made");
    s.stop().await;
}

#[tokio::test]
async fn a_receiver_that_demands_a_client_certificate_gets_it() {
    let s = TestServer::start().await;
    let clients_ca = Ca::new("Clients CA");
    let mtls = MtlsReceiver::start(&clients_ca).await;
    let url = mtls.receiver.url.clone();

    // Without a certificate, it refuses (the handshake fails).
    let plain = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(mtls.server_ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    assert!(plain.post(&url).body("{}").send().await.is_err());
    assert_eq!(mtls.refused.load(Ordering::SeqCst), 1);

    // latch with the certificate its CA issued, and the receiver's CA instead of the
    // system's roots.
    let cert = clients_ca.issue("latch client", &["client.test"]);
    let (sensor, client) = linked(
        &s,
        json!({"url": url, "tls": {"client_cert_pem": cert.cert, "client_key_pem": cert.key,
            "ca_pem": mtls.server_ca}}),
    )
    .await;
    change(&s, &sensor, 1).await;
    let got = mtls.receiver.wait_for(1, 20).await;
    assert_eq!(got[0].body["sensor"]["id"], sensor);
    delivered(&s, &client, 1).await;
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    assert_eq!(c["tls"]["subject"], "CN=latch client");
    assert_eq!(c["tls"]["ca_subject"], "CN=Receiver CA");
    assert!(c["tls"]["expires_at"].as_str().is_some());
    assert!(!c.to_string().contains("PRIVATE KEY"));

    // A certificate of a CA the receiver does not trust is refused, and so is a receiver
    // verified with the system's roots (its CA is no public one).
    let stranger = Ca::new("Stranger CA").issue("stranger", &["client.test"]);
    let (other_sensor, other) = linked(
        &s,
        json!({"url": url, "tls": {"client_cert_pem": stranger.cert,
            "client_key_pem": stranger.key, "ca_pem": mtls.server_ca}}),
    )
    .await;
    let (roots_sensor, roots) = linked(
        &s,
        json!({"url": url, "tls": {"client_cert_pem": cert.cert, "client_key_pem": cert.key}}),
    )
    .await;
    change(&s, &other_sensor, 1).await;
    change(&s, &roots_sensor, 1).await;
    for c in [&other, &roots] {
        let (_, attempts) = eventually(20, "a failed attempt", || async {
            let n = s.notifications(&format!("client_id={c}")).await;
            let id = n.first()?["id"].as_str()?.to_string();
            let (_, one) = s.get(&format!("/v1/notifications/{id}")).await;
            let attempts = one["attempts"].as_array()?.clone();
            (!attempts.is_empty()).then_some((id, attempts))
        })
        .await;
        // The TLS alert comes at the connect, or (TLS 1.3) at the request's first read.
        let error = attempts[0]["error"].as_str().unwrap();
        assert!(
            error.starts_with("connection failed") || error.starts_with("request failed"),
            "{error}"
        );
        assert!(attempts[0]["status_code"].is_null());
    }
    assert_eq!(
        mtls.receiver.count(),
        1,
        "only latch's own certificate got through"
    );
    assert!(mtls.refused.load(Ordering::SeqCst) >= 2);
    s.stop().await;
}

fn oauth_body(o: &OAuth) -> Value {
    json!({"url": o.hook_url, "auth": {"type": "oauth2_client_credentials",
        "token_url": o.token_url, "client_id": OAUTH_CLIENT, "client_secret": OAUTH_SECRET,
        "scope": "hooks.write"}})
}

#[tokio::test]
async fn oauth2_tokens_are_kept_renewed_before_expiry_and_refreshed_once_on_a_401() {
    let s = TestServer::start().await;
    // Long-lived tokens until the revoke, so the deliveries before it share one however
    // slow the machine; the one fetched after it lasts 2 s, for the expiry below.
    let o = OAuth::start(3600).await;
    let (sensor, client) = linked(&s, oauth_body(&o)).await;
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    assert_eq!(
        c["auth"],
        json!({"type": "oauth2_client_credentials", "token_url": o.token_url,
            "client_id": OAUTH_CLIENT, "scope": "hooks.write", "audience": null})
    );
    // Two deliveries on one token.
    change(&s, &sensor, 1).await;
    delivered(&s, &client, 1).await;
    change(&s, &sensor, 0).await;
    delivered(&s, &client, 2).await;
    assert_eq!(o.fetches(), 1);
    let taken = o.taken();
    assert_eq!(taken[0], taken[1]);

    // Revoked: the receiver answers 401, latch fetches a new token once and the same
    // attempt goes through.
    o.lifetime(2);
    o.revoke_all();
    change(&s, &sensor, 1).await;
    let n = delivered(&s, &client, 3).await;
    assert_eq!(o.refused(), 1);
    assert_eq!(o.fetches(), 2);
    let (_, one) = s
        .get(&format!(
            "/v1/notifications/{}",
            n[0]["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(one["attempts"].as_array().unwrap().len(), 1, "{one}");

    // Expired (2 s tokens, renewed shortly before): a new one, with no 401 on the way.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    change(&s, &sensor, 0).await;
    delivered(&s, &client, 4).await;
    assert_eq!(o.fetches(), 3);
    assert_eq!(o.refused(), 1);
    let taken = o.taken();
    assert_ne!(taken[taken.len() - 1], taken[taken.len() - 2]);
    s.stop().await;
}

#[tokio::test]
async fn a_clients_requests_share_one_token_fetch() {
    let s = TestServer::start_with(|c| c.delivery_client_concurrency = 8).await;
    let o = OAuth::start(3600).await;
    o.slow_tokens(Duration::from_millis(300));
    let (first, client) = linked(&s, oauth_body(&o)).await;
    let mut sensors = vec![first];
    for _ in 0..7 {
        let sensor = unique("rx");
        s.sensor(&sensor).await;
        s.link(&client, &sensor).await;
        sensors.push(sensor);
    }
    let readings: Vec<Value> = sensors
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    s.readings(Value::Array(readings)).await;
    delivered(&s, &client, 8).await;
    assert_eq!(o.fetches(), 1, "eight requests at once, one token request");
    assert_eq!(o.taken().len(), 8);
    s.stop().await;
}

#[tokio::test]
async fn a_dead_token_endpoint_fails_attempts_with_auth_failed() {
    let s = TestServer::start().await;
    let o = OAuth::start(3600).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/token", l.local_addr().unwrap())
    };
    let mut body = oauth_body(&o);
    body["auth"]["token_url"] = json!(dead);
    let (sensor, client) = linked(&s, body).await;
    let (bad_secret_sensor, bad_secret) = {
        let mut body = oauth_body(&o);
        body["auth"]["client_secret"] = json!("wrong");
        linked(&s, body).await
    };
    change(&s, &sensor, 1).await;
    change(&s, &bad_secret_sensor, 1).await;
    for (c, says) in [
        (
            &client,
            "auth_failed: the token endpoint could not be reached",
        ),
        (
            &bad_secret,
            "auth_failed: the token endpoint answered HTTP 401 (invalid_client)",
        ),
    ] {
        // Retried like any failure: two attempts, each failing the same way.
        let attempts = eventually(20, "two failed attempts", || async {
            let n = s.notifications(&format!("client_id={c}")).await;
            let id = n.first()?["id"].as_str()?.to_string();
            let (_, one) = s.get(&format!("/v1/notifications/{id}")).await;
            let attempts = one["attempts"].as_array()?.clone();
            (attempts.len() >= 2).then_some(attempts)
        })
        .await;
        for a in &attempts {
            let error = a["error"].as_str().unwrap();
            assert!(error.starts_with(says), "{error}");
            assert!(
                !error.contains(OAUTH_SECRET) && !error.contains("wrong"),
                "{error}"
            );
        }
        let (_, c) = s.get(&format!("/v1/clients/{c}")).await;
        let last = c["health"]["last_error"].as_str().unwrap();
        assert!(last.starts_with("auth_failed"), "{last}");
    }
    assert_eq!(
        o.taken().len(),
        0,
        "nothing reached the receiver without a token"
    );
    let (_, metrics) = s.get("/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(metrics.contains("outcome=\"auth_failed\""), "{metrics}");
    s.stop().await;
}

#[tokio::test]
async fn webhooks_go_through_the_proxy_and_the_guard_still_judges_receivers() {
    let tmp = tempfile::tempdir().unwrap();
    let proxy = Proxy::start().await;
    let with_proxy = |c: &mut latch::config::Config| {
        c.delivery_proxy = Some(proxy.url.clone());
    };
    let s = TestServer::start_in(tmp.path(), with_proxy).await;
    let plain = Receiver::start().await;
    let clients_ca = Ca::new("Clients CA");
    let mtls = MtlsReceiver::start(&clients_ca).await;
    let cert = clients_ca.issue("latch client", &["client.test"]);
    let (plain_sensor, plain_client) = linked(&s, json!({"url": plain.url})).await;
    let (tls_sensor, tls_client) = linked(
        &s,
        json!({"url": mtls.receiver.url, "tls": {"client_cert_pem": cert.cert,
            "client_key_pem": cert.key, "ca_pem": mtls.server_ca}}),
    )
    .await;
    let named = plain.url.replace("127.0.0.1", "localhost");
    let (named_sensor, named_client) = linked(&s, json!({"url": named})).await;
    change(&s, &plain_sensor, 1).await;
    change(&s, &tls_sensor, 1).await;
    delivered(&s, &plain_client, 1).await;
    delivered(&s, &tls_client, 1).await;
    let authority = |url: &str| url.split('/').nth(2).unwrap().to_string();
    let passed = proxy.passed();
    assert!(
        passed.contains(&format!("FORWARD {}", authority(&plain.url))),
        "{passed:?}"
    );
    assert!(
        passed.contains(&format!("CONNECT {}", authority(&mtls.receiver.url))),
        "{passed:?}"
    );
    s.stop().await;

    // The same clients with the guard as shipped (no network let through): through the
    // proxy, the receivers' own addresses are still refused — the literal and the name —
    // and nothing reaches the proxy for them.
    let before = proxy.passed().len();
    let s = TestServer::start_in(tmp.path(), |c| {
        with_proxy(c);
        c.delivery_allow_nets.clear();
    })
    .await;
    change(&s, &plain_sensor, 0).await;
    change(&s, &named_sensor, 1).await;
    for (c, says) in [
        (&plain_client, "127.0.0.1 is a loopback address"),
        (&named_client, "localhost resolves to"),
    ] {
        let failed = eventually(20, "a refused attempt", || async {
            let n = s
                .notifications(&format!("client_id={c}&status=failed"))
                .await;
            n.into_iter().next()
        })
        .await;
        let (_, one) = s
            .get(&format!(
                "/v1/notifications/{}",
                failed["id"].as_str().unwrap()
            ))
            .await;
        let error = one["attempts"][0]["error"].as_str().unwrap();
        assert!(error.starts_with("destination_not_allowed"), "{error}");
        assert!(error.contains(says), "{error}");
    }
    assert_eq!(proxy.passed().len(), before, "{:?}", proxy.passed());
    assert_eq!(plain.count(), 1);
    s.stop().await;
}
