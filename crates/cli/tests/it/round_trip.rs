//! What an operator's script does with the API (issue #70 items 5 and 6): read a resource,
//! send it back (unchanged, or with one field changed), or `PATCH` only that field — and
//! every other setting, the write-only secrets included, stays as it was.

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use crate::utils::receivers::{Ca, MtlsReceiver};
use crate::utils::{TestServer, unique};

/// `v` without the fields that change by themselves (a client's endpoint health).
fn settled(mut v: Value) -> Value {
    v.as_object_mut().unwrap().remove("health");
    v
}

async fn patch(s: &TestServer, path: &str, body: Value) -> (StatusCode, Value) {
    s.request(Method::PATCH, path, Some(body)).await
}

#[tokio::test]
async fn a_client_read_and_sent_back_keeps_every_setting_and_a_patch_changes_one() {
    let s = TestServer::start().await;
    let clients_ca = Ca::new("Clients CA");
    let mtls = MtlsReceiver::start(&clients_ca).await;
    let cert = clients_ca.issue("latch client", &["client.test"]);
    let (st, created) = s
        .post(
            "/v1/clients",
            json!({"name": "round trip", "url": mtls.receiver.url, "rate_limit": 50,
                "events": ["sensor.state_changed"], "batch": null,
                "headers": {"X-Api-Key": "k-1"},
                "auth": {"type": "bearer", "token": "token-1"},
                "tls": {"client_cert_pem": cert.cert, "client_key_pem": cert.key,
                    "ca_pem": mtls.server_ca}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{created}");
    let client = created["id"].as_str().unwrap().to_string();
    let path = format!("/v1/clients/{client}");
    let sensor = unique("rt");
    s.sensor(&sensor).await;
    s.link(&client, &sensor).await;

    // Sent back exactly as read: accepted, and nothing changes.
    let (_, read) = s.get(&path).await;
    let (st, put) = s.put(&path, read.clone()).await;
    assert_eq!(st, StatusCode::OK, "{put}");
    let (_, again) = s.get(&path).await;
    assert_eq!(settled(again), settled(read.clone()));

    // The secrets it could not show were kept: header value, token, certificate and key.
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    let got = mtls.receiver.wait_for(1, 20).await;
    assert_eq!(got[0].headers["x-api-key"], "k-1");
    assert_eq!(got[0].headers["authorization"], "Bearer token-1");

    // A patch of the token alone: the rest stays.
    let (st, patched) = patch(&s, &path, json!({"auth": {"token": "token-2"}})).await;
    assert_eq!(st, StatusCode::OK, "{patched}");
    assert_eq!(patched["rate_limit"], 50);
    assert_eq!(patched["events"], json!(["sensor.state_changed"]));
    assert_eq!(patched["tls"], read["tls"]);
    s.readings(json!({"sensor_id": sensor, "data": 0})).await;
    let got = mtls.receiver.wait_for(2, 20).await;
    assert_eq!(got[1].headers["authorization"], "Bearer token-2");
    assert_eq!(got[1].headers["x-api-key"], "k-1");

    // null clears; a header patched alone leaves the others.
    let (st, patched) = patch(
        &s,
        &path,
        json!({"rate_limit": null, "headers": {"X-Tenant": "acme"}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{patched}");
    assert!(patched["rate_limit"].is_null());
    assert_eq!(
        patched["headers"],
        json!({"X-Api-Key": "[redacted]", "X-Tenant": "[redacted]"})
    );

    // Another auth type is taken whole, and its secret is required then.
    let (st, body) = patch(
        &s,
        &path,
        json!({"auth": {"type": "basic", "username": "u"}}),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("auth.password")
    );

    // A URL on another origin: the kept secrets would go there, so it is refused.
    let (st, body) = patch(&s, &path, json!({"url": "https://127.0.0.2:9/hook"})).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("headers and auth"), "{message}");

    // An array is no settings object (serde would read it as the fields in order).
    let mut arrays = read.clone();
    arrays["tls"] = json!([null, null]);
    let (st, _) = s.put(&path, arrays).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "tls as an array");

    // Read-only fields are ignored, but not another client's id.
    let mut other = read.clone();
    other["id"] = json!("someone-else");
    let (st, _) = s.put(&path, other).await;
    assert_eq!(st, StatusCode::CONFLICT);
    let (st, _) = s.post("/v1/clients", read).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "an id on create");
}

#[tokio::test]
async fn a_sensor_patch_keeps_its_site_timeout_and_window() {
    let s = TestServer::start().await;
    let site = unique("rt-site");
    let (st, _) = s.post("/v1/sites", json!({"id": site})).await;
    assert_eq!(st, StatusCode::CREATED);
    let id = unique("rt");
    let path = format!("/v1/sensors/{id}");
    let (st, _) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "Door 1", "heartbeat_timeout_s": 120,
                "debounce_s": 5, "site_id": site}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);

    // Sent back as read: the same sensor.
    let (_, read) = s.get(&path).await;
    let (st, put) = s.put(&path, read.clone()).await;
    assert_eq!(st, StatusCode::OK, "{put}");
    assert_eq!(s.get(&path).await.1, read);

    // A new address alone keeps the site, the timeout and the window.
    let (st, patched) = patch(&s, &path, json!({"address": "Door 1, east wing"})).await;
    assert_eq!(st, StatusCode::OK, "{patched}");
    assert_eq!(patched["address"], "Door 1, east wing");
    assert_eq!(patched["site_id"], site.as_str());
    assert_eq!(patched["heartbeat_timeout_s"], 120);
    assert_eq!(patched["debounce_s"], 5);

    // null clears one field: back to the default timeout, out of the site.
    let (_, patched) = patch(&s, &path, json!({"heartbeat_timeout_s": null})).await;
    assert!(patched["heartbeat_timeout_s"].is_null());
    assert_eq!(patched["site_id"], site.as_str());
    let (_, patched) = patch(&s, &path, json!({"site_id": null})).await;
    assert!(patched["site_id"].is_null());
    assert_eq!(patched["debounce_s"], 5);

    // What a patch cannot be: each a clear error, nothing changed.
    let (st, body) = patch(&s, &path, json!({"adress": "typo"})).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("adress")
    );
    let (st, _) = patch(&s, &path, json!(["address"])).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    let (st, _) = patch(&s, &path, json!({"heartbeat_timeout_s": 0})).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    let (st, _) = patch(&s, &path, json!({"id": "other"})).await;
    assert_eq!(st, StatusCode::CONFLICT);
    let (st, _) = patch(&s, "/v1/sensors/nosuchsensor", json!({"address": "x"})).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(s.get(&path).await.1["address"], "Door 1, east wing");

    // The media type RFC 7396 names is taken; a text body is not.
    let send = |content_type: &'static str| {
        s.http
            .patch(format!("{}{path}", s.base))
            .header("content-type", content_type)
            .body(r#"{"address": "Door 1, west wing"}"#)
            .send()
    };
    assert_eq!(
        send("application/merge-patch+json").await.unwrap().status(),
        200
    );
    assert_eq!(send("text/plain").await.unwrap().status(), 415);
    assert_eq!(s.get(&path).await.1["address"], "Door 1, west wing");
}

#[tokio::test]
async fn a_method_a_path_does_not_take_gets_405_in_the_error_format() {
    let s = TestServer::start().await;
    for (method, path, allowed) in [
        (Method::PUT, "/v1/sensors", "GET,HEAD,POST"),
        (Method::PATCH, "/v1/notifications", "GET,HEAD"),
        (Method::DELETE, "/v1/readings", "POST"),
    ] {
        let resp = s
            .http
            .request(method.clone(), format!("{}{path}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{method} {path}");
        let allow = resp.headers()["allow"].to_str().unwrap().to_string();
        let mut allow: Vec<&str> = allow.split(',').map(str::trim).collect();
        allow.sort();
        assert_eq!(allow.join(","), allowed, "{method} {path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(method.as_str())
        );
    }
}
