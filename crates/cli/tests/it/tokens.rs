//! Scoped API tokens and request rate limits, as a user meets them: each scope allowed and
//! refused, a token's secret shown once, deleted tokens refused, the bootstrap token still
//! admin, 429 with `Retry-After` past the burst, and health endpoints open throughout.

use reqwest::Method;
use serde_json::{Value, json};

use crate::utils::{TestServer, unique};

/// A request with `token` as bearer (none: no header): status, `Retry-After`, body.
async fn call(
    s: &TestServer,
    http: &reqwest::Client,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Option<String>, Value) {
    let mut req = http.request(method, format!("{}{path}", s.base));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, retry_after, body)
}

async fn as_token(
    s: &TestServer,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let (st, _, body) = call(s, &s.http, Some(token), method, path, body).await;
    (st, body)
}

/// Makes a token with `scopes` through the server's own (bootstrap) token; its secret.
async fn make_token(s: &TestServer, scopes: &[&str]) -> (String, String) {
    let (st, body) = s
        .post(
            "/v1/tokens",
            json!({"name": unique("tok"), "scopes": scopes}),
        )
        .await;
    assert_eq!(st, 201, "{body}");
    (
        body["id"].as_str().unwrap().to_string(),
        body["token"].as_str().unwrap().to_string(),
    )
}

fn bootstrap() -> String {
    unique("bootstrap-token-")
}

fn assert_forbidden(st: u16, body: &Value) {
    assert_eq!(st, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden", "{body}");
}

#[tokio::test]
async fn each_scope_allows_its_requests_and_refuses_the_rest() {
    let token = bootstrap();
    let s = TestServer::start_with(|c| c.api_token = Some(token.clone())).await;
    let id = unique("sc");
    s.sensor(&id).await;
    let (_, ingest) = make_token(&s, &["ingest"]).await;
    let (_, read) = make_token(&s, &["read"]).await;
    let (_, admin) = make_token(&s, &["admin"]).await;
    let reading = json!([{"sensor_id": id, "data": 1}]);

    // ingest: readings in, nothing else.
    let (st, body) = as_token(&s, &ingest, Method::POST, "/v1/readings", Some(reading)).await;
    assert_eq!((st, &body["accepted"]), (202, &json!(1)), "{body}");
    let (st, body) = as_token(&s, &ingest, Method::GET, "/v1/sensors", None).await;
    assert_forbidden(st, &body);
    let sensor = json!({"id": unique("sc"), "address": "x"});
    let (st, body) = as_token(&s, &ingest, Method::POST, "/v1/sensors", Some(sensor)).await;
    assert_forbidden(st, &body);

    // read: every GET but the tokens, no change.
    let (st, body) = as_token(&s, &read, Method::GET, &format!("/v1/sensors/{id}"), None).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["status"]["data"], 1, "{body}");
    let (st, _) = as_token(&s, &read, Method::GET, "/v1/notifications", None).await;
    assert_eq!(st, 200);
    let again = json!({"sensor_id": id, "data": 0});
    let (st, body) = as_token(&s, &read, Method::POST, "/v1/readings", Some(again)).await;
    assert_forbidden(st, &body);
    let (st, body) = as_token(
        &s,
        &read,
        Method::DELETE,
        &format!("/v1/sensors/{id}"),
        None,
    )
    .await;
    assert_forbidden(st, &body);
    let (st, body) = as_token(&s, &read, Method::GET, "/v1/tokens", None).await;
    assert_forbidden(st, &body);
    // A client's signing secret is an admin's to see, not a reader's.
    let client = s.client("http://127.0.0.1:9/hook").await;
    let path = format!("/v1/clients/{client}");
    let (st, body) = as_token(&s, &read, Method::GET, &path, None).await;
    assert_eq!(st, 200, "{body}");
    assert!(body["secret"].is_null(), "hidden from a read token: {body}");
    let (st, body) = as_token(&s, &admin, Method::GET, &path, None).await;
    assert_eq!(st, 200, "{body}");
    assert!(
        body["secret"].as_str().unwrap().starts_with("whsec_"),
        "{body}"
    );
    assert_eq!(
        s.reading_count(&id).await,
        1,
        "the refused reading was not applied"
    );

    // admin: everything, tokens included.
    let new = json!({"name": "made by admin", "scopes": ["read"]});
    let (st, body) = as_token(&s, &admin, Method::POST, "/v1/tokens", Some(new)).await;
    assert_eq!(st, 201, "{body}");
    let (st, _) = as_token(&s, &admin, Method::GET, "/v1/tokens", None).await;
    assert_eq!(st, 200);

    // Unknown or missing tokens are 401, as before tokens existed.
    let (st, body) = as_token(&s, "latch_not-a-token", Method::GET, "/v1/sensors", None).await;
    assert_eq!((st, &body["error"]["code"]), (401, &json!("unauthorized")));
    let (st, _, _) = call(&s, &s.http, None, Method::GET, "/v1/sensors", None).await;
    assert_eq!(st, 401);
    s.stop().await;
}

#[tokio::test]
async fn a_token_is_shown_once_and_never_listed() {
    let token = bootstrap();
    let s = TestServer::start_with(|c| c.api_token = Some(token.clone())).await;
    let (st, made) = s
        .post(
            "/v1/tokens",
            json!({"name": "gateway 7", "scopes": ["ingest", "read", "ingest"]}),
        )
        .await;
    assert_eq!(st, 201, "{made}");
    let secret = made["token"].as_str().unwrap();
    assert!(secret.starts_with("latch_"), "{made}");
    assert_eq!(made["scopes"], json!(["ingest", "read"]), "{made}");
    let (st, list) = s.get("/v1/tokens").await;
    assert_eq!(st, 200, "{list}");
    let item = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == made["id"])
        .expect("the new token is listed")
        .clone();
    assert_eq!(item["name"], "gateway 7");
    assert!(item.get("token").is_none(), "{item}");
    assert!(!list.to_string().contains(&secret[6..]), "{list}");

    // A token needs a name and a known scope.
    for bad in [
        json!({"name": "x", "scopes": []}),
        json!({"name": " ", "scopes": ["read"]}),
        json!({"name": "x", "scopes": ["root"]}),
    ] {
        let (st, body) = s.post("/v1/tokens", bad.clone()).await;
        assert_eq!(st, 422, "{bad}: {body}");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_deleted_token_is_refused_and_the_bootstrap_token_stays_admin() {
    let token = bootstrap();
    let s = TestServer::start_with(|c| c.api_token = Some(token.clone())).await;
    let (id, secret) = make_token(&s, &["admin"]).await;
    let (st, _) = as_token(&s, &secret, Method::GET, "/v1/sensors", None).await;
    assert_eq!(st, 200);
    // Deleted with the bootstrap token, which also lists and makes tokens.
    let (st, body) = s.delete(&format!("/v1/tokens/{id}")).await;
    assert_eq!(st, 204, "{body}");
    let (st, body) = as_token(&s, &secret, Method::GET, "/v1/sensors", None).await;
    assert_eq!((st, &body["error"]["code"]), (401, &json!("unauthorized")));
    let (st, _) = s.delete(&format!("/v1/tokens/{id}")).await;
    assert_eq!(st, 404);
    let (st, list) = s.get("/v1/tokens").await;
    assert_eq!(st, 200);
    assert!(!list.to_string().contains(&id), "{list}");
    s.stop().await;
}

#[tokio::test]
async fn tokens_stay_enforced_without_the_bootstrap_token() {
    // An open API makes no tokens: anyone could lock everyone else out.
    let open = TestServer::start().await;
    let (st, body) = open
        .post("/v1/tokens", json!({"name": "n", "scopes": ["admin"]}))
        .await;
    assert_forbidden(st.as_u16(), &body);
    open.stop().await;

    let token = bootstrap();
    let s = TestServer::start_with(|c| c.api_token = Some(token.clone())).await;
    let (_, admin) = make_token(&s, &["admin"]).await;
    let (_, read) = make_token(&s, &["read"]).await;
    let dir = s.stop().await.unwrap();
    // The operator retires the bootstrap token: the tokens made stay required.
    let s = TestServer::start_in(dir.path(), |_| {}).await;
    let (st, _, body) = call(&s, &s.http, None, Method::GET, "/v1/sensors", None).await;
    assert_eq!(st, 401, "{body}");
    let (st, _) = as_token(&s, &token, Method::GET, "/v1/sensors", None).await;
    assert_eq!(st, 401, "the retired bootstrap token is refused");
    let (st, _) = as_token(&s, &read, Method::GET, "/v1/sensors", None).await;
    assert_eq!(st, 200);
    let new = json!({"name": "next", "scopes": ["ingest"]});
    let (st, body) = as_token(&s, &admin, Method::POST, "/v1/tokens", Some(new)).await;
    assert_eq!(st, 201, "{body}");
    // The document says a token is needed now.
    let (st, _, doc) = call(&s, &s.http, None, Method::GET, "/openapi.json", None).await;
    assert_eq!(st, 200);
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    s.stop().await;
    drop(dir);
}

#[tokio::test]
async fn health_readiness_and_metrics_stay_open() {
    let token = bootstrap();
    let s = TestServer::start_with(|c| {
        c.api_token = Some(token.clone());
        c.rate_limit = latch::config::RateLimit::parse("1/m burst 1").ok();
    })
    .await;
    make_token(&s, &["read"]).await;
    // Many times each: neither a token nor the rate limit applies to them.
    for _ in 0..3 {
        for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
            let (st, _, body) = call(&s, &s.http, None, Method::GET, path, None).await;
            assert_eq!(st, 200, "{path}: {body}");
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn past_the_burst_429_with_retry_after_and_a_batch_counts_once() {
    let token = bootstrap();
    let s = TestServer::start_with(|c| {
        c.api_token = Some(token.clone());
        // No refill within the test: exactly the burst gets through.
        c.rate_limit = latch::config::RateLimit::parse("1/m burst 4").ok();
    })
    .await;
    let id = unique("rl");
    s.sensor(&id).await; // 1
    let (_, read) = make_token(&s, &["read"]).await; // 2
    let batch: Vec<Value> = (0..50)
        .map(|i| json!({"sensor_id": id, "data": i % 2, "ts": format!("2026-01-01T00:00:{:02}Z", i)}))
        .collect();
    s.readings(Value::Array(batch)).await; // 3: fifty readings, one request
    let (st, _) = s.get(&format!("/v1/sensors/{id}")).await; // 4
    assert_eq!(st, 200);
    let (st, retry_after, body) =
        call(&s, &s.http, Some(&token), Method::GET, "/v1/sensors", None).await;
    assert_eq!(st, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let secs: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=60).contains(&secs), "{secs}");
    // Another token has its own bucket.
    let (st, body) = as_token(&s, &read, Method::GET, &format!("/v1/sensors/{id}"), None).await;
    assert_eq!(st, 200, "{body}");
    let (_, _, metrics) = call(&s, &s.http, None, Method::GET, "/metrics", None).await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains(r#"latch_http_rate_limit_total{outcome="limited"}"#),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn without_a_token_the_limit_is_per_peer_address() {
    let s = TestServer::start_with(|c| {
        c.rate_limit = latch::config::RateLimit::parse("1/m burst 2").ok();
    })
    .await;
    for _ in 0..2 {
        let (st, _) = s.get("/v1/sensors").await;
        assert_eq!(st, 200);
    }
    let (st, _, body) = call(&s, &s.http, None, Method::GET, "/v1/sensors", None).await;
    assert_eq!((st, &body["error"]["code"]), (429, &json!("rate_limited")));
    // Another loopback address is another peer.
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let (st, _, body) = call(&s, &other, None, Method::GET, "/v1/sensors", None).await;
    assert_eq!(st, 200, "{body}");
    s.stop().await;
}

#[tokio::test]
async fn nodes_on_one_database_follow_each_others_tokens() {
    let shared = tempfile::tempdir().unwrap();
    let url = match crate::utils::postgres_url(shared.path()).await {
        Ok(u) => u,
        Err(e) => {
            crate::utils::service_missing("PostgreSQL", e);
            return;
        }
    };
    let token = bootstrap();
    let start = || {
        let (token, url) = (token.clone(), url.clone());
        TestServer::start_with(move |c| {
            c.api_token = Some(token);
            c.database_url = Some(url);
        })
    };
    let a = start().await;
    let b = start().await;
    let (id, read) = make_token(&a, &["read"]).await;
    // Node B knows it within its refresh period (5 s), without a restart.
    crate::utils::eventually(15, "node B accepts a token node A made", || async {
        let (st, _) = as_token(&b, &read, Method::GET, "/v1/sensors", None).await;
        (st == 200).then_some(())
    })
    .await;
    let (st, _) = a.delete(&format!("/v1/tokens/{id}")).await;
    assert_eq!(st, 204);
    crate::utils::eventually(15, "node B refuses a token node A deleted", || async {
        let (st, _) = as_token(&b, &read, Method::GET, "/v1/sensors", None).await;
        (st == 401).then_some(())
    })
    .await;
    a.stop().await;
    b.stop().await;
}

/// A node that cannot read the token table cannot know a token was deleted through another
/// node: past the bound it refuses the tokens it holds (503, not 401: the token may be
/// good) rather than keep serving one deleted meanwhile; the bootstrap token, which no
/// node can delete, still works; and once the table is back the deletion is seen.
#[tokio::test]
async fn a_node_that_cannot_confirm_its_tokens_stops_taking_them() {
    let dir = tempfile::tempdir().unwrap();
    let url = match crate::utils::postgres_url(dir.path()).await {
        Ok(u) => u,
        Err(e) => {
            crate::utils::service_missing("PostgreSQL", e);
            return;
        }
    };
    let token = bootstrap();
    let s = TestServer::start_in(dir.path(), {
        let (token, url) = (token.clone(), url.clone());
        move |c| {
            c.api_token = Some(token);
            c.database_url = Some(url);
        }
    })
    .await;
    let (id, read) = make_token(&s, &["read"]).await;
    let (st, _) = as_token(&s, &read, Method::GET, "/v1/sensors", None).await;
    assert_eq!(st, 200);
    // A live stream it holds open ends too: no reload of the table comes to end it.
    let mut stream = s
        .http
        .get(format!("{}/v1/stream", s.base))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // The table out of this node's reach, and the token deleted as another node would.
    db.batch_execute("ALTER TABLE api_tokens RENAME TO api_tokens_away")
        .await
        .unwrap();
    db.execute("DELETE FROM api_tokens_away WHERE id = $1", &[&id])
        .await
        .unwrap();
    let refused = crate::utils::eventually(30, "the unconfirmed token refused", || async {
        let (st, body) = as_token(&s, &read, Method::GET, "/v1/sensors", None).await;
        (st != 200).then_some((st, body))
    })
    .await;
    assert_eq!(refused.0, 503, "{}", refused.1);
    assert_eq!(refused.1["error"]["code"], "unavailable", "{}", refused.1);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream of an unconfirmed token is still open"
    );
    let (st, body) = as_token(&s, &token, Method::GET, "/v1/cluster", None).await;
    assert_eq!(st, 200, "the bootstrap token: {body}");
    db.batch_execute("ALTER TABLE api_tokens_away RENAME TO api_tokens")
        .await
        .unwrap();
    crate::utils::eventually(30, "the deletion seen", || async {
        let (st, _) = as_token(&s, &read, Method::GET, "/v1/sensors", None).await;
        (st == 401).then_some(())
    })
    .await;
    s.stop().await;
}
