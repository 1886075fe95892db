//! The edges of the HTTP surface a browser or a careless client reaches: content types,
//! oversize bodies, the auth header's spelling, and what a failed start prints.

use serde_json::{Value, json};

use crate::utils::{TestServer, unique};

/// Sends `body` raw with the given content type (or none).
async fn raw_post(
    s: &TestServer,
    path: &str,
    content_type: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> (u16, Value) {
    let mut req = s.http.post(format!("{}{path}", s.base)).body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

#[tokio::test]
async fn a_form_post_from_a_web_page_cannot_forge_readings() {
    let s = TestServer::start().await;
    let id = unique("ct");
    s.sensor(&id).await;
    let reading = json!({"sensor_id": id, "data": 1}).to_string();
    // What a cross-site form can send without a CORS preflight.
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let (st, body) = raw_post(&s, "/v1/readings", ct, reading.clone()).await;
        assert_eq!(st, 415, "{ct:?}: {body}");
        assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
    }
    assert_eq!(s.reading_count(&id).await, 0, "nothing was applied");
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(sensor["status"]["data"], Value::Null, "{sensor}");

    let (st, body) = raw_post(
        &s,
        "/v1/readings",
        Some("application/json; charset=utf-8"),
        reading.clone(),
    )
    .await;
    assert_eq!(st, 202, "{body}");
    assert_eq!(s.reading_count(&id).await, 1);

    // Every other endpoint that takes a JSON body says the same.
    let sensor = json!({"id": unique("ct"), "address": "x"}).to_string();
    let (st, body) = raw_post(&s, "/v1/sensors", Some("text/plain"), sensor).await;
    assert_eq!(
        (st, &body["error"]["code"]),
        (415, &json!("unsupported_media_type"))
    );
    let client = json!({"name": "n", "url": "http://127.0.0.1:9/"}).to_string();
    let (st, body) = raw_post(&s, "/v1/clients", Some("text/plain"), client).await;
    assert_eq!(
        (st, &body["error"]["code"]),
        (415, &json!("unsupported_media_type"))
    );
    s.stop().await;
}

#[tokio::test]
async fn a_body_that_is_not_an_object_is_refused_not_read_as_fields() {
    let s = TestServer::start().await;
    let id = unique("arr");
    // serde alone would read this array as `{"id": …, "address": …}`.
    let (status, body) = raw_post(
        &s,
        "/v1/sensors",
        Some("application/json"),
        json!([id, "hall"]).to_string(),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("JSON object"),
        "{body}"
    );
    let (status, _) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(status, 404, "nothing was created");
    for (path, bad) in [
        ("/v1/clients", json!(["c", "http://127.0.0.1:9/"])),
        ("/v1/tokens", json!(["t", ["admin"]])),
        ("/v1/sensors", json!("hall")),
        ("/v1/sensors", json!(null)),
    ] {
        let (status, body) = raw_post(&s, path, Some("application/json"), bad.to_string()).await;
        assert_eq!(status, 422, "{path} {bad}: {body}");
    }
    // An object still goes through, and its field errors read as before.
    let (status, body) = raw_post(
        &s,
        "/v1/sensors",
        Some("application/json"),
        json!({"id": id}).to_string(),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("address"),
        "{body}"
    );
    s.stop().await;
}

#[tokio::test]
async fn oversize_bodies_get_the_contracts_json_413() {
    let s = TestServer::start().await;
    // Over the byte limit, on the readings endpoint and on one with a typed body.
    let huge = format!(
        "[{}]",
        vec![r#"{"sensor_id":"aaaaaaaaaaaaaaaa","data":1}"#; 450_000].join(",")
    );
    for path in ["/v1/readings", "/v1/sensors", "/v1/clients"] {
        let (st, body) = raw_post(&s, path, Some("application/json"), huge.clone()).await;
        assert_eq!(st, 413, "{path}: {body}");
        assert_eq!(body["error"]["code"], "payload_too_large", "{path}: {body}");
    }
    // Under the byte limit but over 10,000 readings (422: the array breaks `maxItems`), with garbage after the 10,001st:
    // the cap is found before the rest of the body is read.
    let id = unique("big");
    let mut many = vec![format!(r#"{{"sensor_id":"{id}","data":1}}"#); 10_001].join(",");
    many.push_str(", this is not JSON at all");
    let (st, body) = raw_post(
        &s,
        "/v1/readings",
        Some("application/json"),
        format!("[{many}"),
    )
    .await;
    assert_eq!(st, 422, "{body}");
    assert_eq!(body["error"]["code"], "too_many_readings", "{body}");
    s.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let s = TestServer::start_with(|c| c.api_token = Some("s3cret-token".into())).await;
    for (header, expected) in [
        ("Bearer s3cret-token", 200),
        ("bearer s3cret-token", 200),
        ("BEARER s3cret-token", 200),
        ("Basic s3cret-token", 401),
        ("Bearer wrong", 401),
    ] {
        let r = s
            .http
            .get(format!("{}/v1/sensors", s.base))
            .header("authorization", header)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), expected, "{header}");
    }
    s.stop().await;
}

/// Runs `latch migrate` with `env` and returns everything it printed; it must fail.
fn failed_start(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_latch"))
        .arg("migrate")
        .env("LATCH_DATA_DIR", dir.path())
        .env("LATCH_API_TOKEN", "tok-very-secret")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the start must fail");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Error"), "{text}");
    text
}

#[test]
fn a_failed_start_does_not_print_passwords() {
    // A setting refused at validation, quoted in the message.
    let text = failed_start(&[("LATCH_CLICKHOUSE_URL", "ftp://u:hunter2secret@127.0.0.1:1")]);
    assert!(text.contains("clickhouse_url"), "names the setting: {text}");
    assert!(text.contains("u:***@127.0.0.1"), "{text}");
    // A database that cannot be reached (port 1 refuses at once).
    let key = crate::utils::test_secret_key();
    let text = failed_start(&[
        (
            "LATCH_DATABASE_URL",
            "postgres://latch:hunter2secret@127.0.0.1:1/latch?connect_timeout=2",
        ),
        ("LATCH_SECRET_KEY", &key),
    ]);
    assert!(
        !text.contains("secret_key"),
        "the connection failed: {text}"
    );
    for secret in ["hunter2secret", "tok-very-secret"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
}

/// A client that sends its whole oversize body before reading (as most do) reads the 413:
/// latch reads and drops the rest instead of closing on it, which resets the connection.
#[tokio::test]
async fn a_client_still_sending_an_oversize_body_reads_the_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::start().await;
    let addr = s.base.trim_start_matches("http://").to_string();
    for (path, size) in [
        ("/v1/clients", 20 << 20),
        ("/v1/readings", 40 << 20),
        ("/v1/clients", 20 << 20),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: latch\r\ncontent-type: application/json\r\n\
             content-length: {size}\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b' '; 1 << 16];
        for _ in 0..size / chunk.len() {
            tcp.write_all(&chunk)
                .await
                .unwrap_or_else(|e| panic!("{path}: the body could not be sent: {e}"));
        }
        let mut answer = Vec::new();
        let mut buf = [0; 4096];
        while !String::from_utf8_lossy(&answer).contains("}}") {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "{path}: closed after {answer:?}");
            answer.extend_from_slice(&buf[..n]);
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(answer.contains("payload_too_large"), "{path}: {answer}");
    }
    s.stop().await;
}
