//! The audit trail (issue #73, part 4) as an operator reads it: every change made through
//! the API is there with its token, the resource before and after, secrets never; a change
//! refused leaves nothing; filters by resource, token and time; a read token may not look.
//! On SQLite, or PostgreSQL with `TEST_STORE=postgres`.

use reqwest::Method;
use serde_json::{Value, json};

use crate::utils::{TestServer, unique};

/// A request made with `token`: status and body.
async fn with(
    s: &TestServer,
    token: &str,
    m: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = s
        .http
        .request(m, format!("{}{path}", s.base))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Makes a token; its id and secret.
async fn token(s: &TestServer, name: &str, scopes: &[&str]) -> (String, String) {
    let (st, body) = s
        .post("/v1/tokens", json!({"name": name, "scopes": scopes}))
        .await;
    assert_eq!(st, 201, "{body}");
    (
        body["id"].as_str().unwrap().to_string(),
        body["token"].as_str().unwrap().to_string(),
    )
}

/// `GET /v1/audit?{query}` with `token`, asserted 200.
async fn audit_page(s: &TestServer, token: &str, query: &str) -> Value {
    let (st, body) = with(s, token, Method::GET, &format!("/v1/audit?{query}"), None).await;
    assert_eq!(st, 200, "{body}");
    body
}

/// The methods of a page of records, in its order.
fn methods_of(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["method"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn every_change_is_recorded_with_its_token_and_without_a_secret() {
    let bootstrap = unique("bootstrap-");
    let s = TestServer::start_with(|c| c.api_token = Some(bootstrap.clone())).await;
    let (admin_id, admin) = token(&s, "ops desk", &["admin"]).await;
    let (_, reader) = token(&s, "wallboard", &["read"]).await;
    let (site, sensor, schedule) = (unique("site"), unique("door"), unique("hours"));
    let (secret, header, bearer) = (
        {
            use base64::Engine;
            let raw = unique("signing-key-").into_bytes();
            format!(
                "whsec_{}",
                base64::engine::general_purpose::STANDARD.encode(raw)
            )
        },
        unique("hdr-secret-"),
        unique("bearer-secret-"),
    );

    let change = async |m: Method, path: String, body: Option<Value>, want: u16| {
        let (st, out) = with(&s, &admin, m.clone(), &path, body).await;
        assert_eq!(st, want, "{m} {path}: {out}");
        out
    };
    change(
        Method::POST,
        "/v1/sites".into(),
        Some(json!({"id": site, "name": "HQ"})),
        201,
    )
    .await;
    change(
        Method::POST,
        "/v1/schedules".into(),
        Some(
            json!({"id": schedule, "name": "office", "tz": "Europe/Berlin",
                    "weekly": [{"days": ["mon"], "from": "08:00", "to": "18:00"}]}),
        ),
        201,
    )
    .await;
    change(
        Method::POST,
        "/v1/sensors".into(),
        Some(json!({"id": sensor, "address": "back door", "site_id": site})),
        201,
    )
    .await;
    // A create refused (the id is taken) leaves no record.
    change(
        Method::POST,
        "/v1/sensors".into(),
        Some(json!({"id": sensor, "address": "again"})),
        409,
    )
    .await;
    change(
        Method::PATCH,
        format!("/v1/sensors/{sensor}"),
        Some(json!({"address": "back door, ground floor"})),
        200,
    )
    .await;
    let client = change(
        Method::POST,
        "/v1/clients".into(),
        Some(
            json!({"name": "guards", "url": "http://127.0.0.1:9/hook", "secret": secret,
                    "headers": {"X-Api-Key": header},
                    "auth": {"type": "bearer", "token": bearer}}),
        ),
        201,
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    change(
        Method::PUT,
        format!("/v1/clients/{client}/sensors/{sensor}"),
        None,
        204,
    )
    .await;
    // Linked again: nothing changes, nothing is recorded.
    change(
        Method::PUT,
        format!("/v1/clients/{client}/sensors/{sensor}"),
        None,
        204,
    )
    .await;
    // The path as the routes read it: an id spelled with an escape is the same sensor.
    change(
        Method::PATCH,
        format!("/v1/sensors/%{:02X}{}", sensor.as_bytes()[0], &sensor[1..]),
        Some(json!({"debounce_s": 2})),
        200,
    )
    .await;
    change(
        Method::POST,
        format!("/v1/clients/{client}/secret/rotate"),
        None,
        200,
    )
    .await;
    let silence = change(
        Method::POST,
        "/v1/silences".into(),
        Some(json!({"match": {"site_id": site}, "schedule_id": schedule, "comment": "office"})),
        201,
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    change(Method::DELETE, format!("/v1/silences/{silence}"), None, 204).await;
    change(
        Method::POST,
        "/v1/notifications/retry".into(),
        Some(json!({"client_id": client})),
        202,
    )
    .await;
    change(
        Method::DELETE,
        format!("/v1/clients/{client}/sensors/{sensor}"),
        None,
        204,
    )
    .await;
    change(Method::DELETE, format!("/v1/sensors/{sensor}"), None, 204).await;
    // A change of what does not exist leaves no record either.
    change(Method::DELETE, format!("/v1/sensors/{sensor}"), None, 404).await;

    let (st, trail) = with(
        &s,
        &admin,
        Method::GET,
        &format!("/v1/audit?token_id={admin_id}"),
        None,
    )
    .await;
    assert_eq!(st, 200, "{trail}");
    let items = trail["items"].as_array().unwrap();
    let seen: Vec<(String, String)> = items
        .iter()
        .map(|e| {
            (
                e["method"].as_str().unwrap().into(),
                e["resource"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("DELETE", format!("sensors/{sensor}")),
        ("DELETE", format!("clients/{client}/sensors/{sensor}")),
        ("POST", "notifications/retry".to_string()),
        ("DELETE", format!("silences/{silence}")),
        ("POST", format!("silences/{silence}")),
        ("POST", format!("clients/{client}/secret/rotate")),
        ("PATCH", format!("sensors/{sensor}")),
        ("PUT", format!("clients/{client}/sensors/{sensor}")),
        ("POST", format!("clients/{client}")),
        ("PATCH", format!("sensors/{sensor}")),
        ("POST", format!("sensors/{sensor}")),
        ("POST", format!("schedules/{schedule}")),
        ("POST", format!("sites/{site}")),
    ]
    .into_iter()
    .map(|(m, r)| (m.to_string(), r))
    .collect();
    assert_eq!(seen, want, "newest first, refused changes absent: {trail}");
    for e in items {
        assert_eq!(
            e["token"],
            json!({"id": admin_id, "name": "ops desk"}),
            "{e}"
        );
    }
    let text = trail.to_string();
    for leaked in [&secret, &header, &bearer] {
        assert!(
            !text.contains(leaked.as_str()),
            "a secret in the trail: {text}"
        );
    }
    let of = |m: &str, r: &str| {
        items
            .iter()
            .find(|e| e["method"] == m && e["resource"] == r)
            .unwrap()
            .clone()
    };
    // Before and after: the patch shows the old and the merged resource.
    // The older of the two patches: the address.
    let patch = items
        .iter()
        .rev()
        .find(|e| e["method"] == "PATCH")
        .unwrap()
        .clone();
    assert_eq!(patch["before"]["address"], "back door", "{patch}");
    assert_eq!(
        patch["after"]["address"], "back door, ground floor",
        "{patch}"
    );
    assert_eq!(
        patch["after"]["site_id"],
        json!(site),
        "kept by the merge: {patch}"
    );
    assert_eq!(patch["path"], json!(format!("/v1/sensors/{sensor}")));
    let made = of("POST", &format!("clients/{client}"));
    assert!(made["before"].is_null(), "{made}");
    assert_eq!(made["after"]["secret"], "[redacted]", "{made}");
    assert_eq!(
        made["after"]["headers"]["X-Api-Key"], "[redacted]",
        "{made}"
    );
    assert_eq!(made["after"]["auth"]["token"], "[redacted]", "{made}");
    let silence_made = of("POST", &format!("silences/{silence}"));
    assert_eq!(
        silence_made["after"]["id"],
        json!(silence),
        "the id latch chose: {silence_made}"
    );
    let gone = of("DELETE", &format!("sensors/{sensor}"));
    assert!(gone["after"].is_null(), "{gone}");
    assert_eq!(gone["before"]["id"], json!(sensor), "{gone}");
    assert!(
        gone["before"].get("status").is_none(),
        "settings, not readings: {gone}"
    );
    assert_eq!(of("POST", "notifications/retry")["after"]["replayed"], 0);

    // Filters: one resource and what is below it; a time range.
    let one = audit_page(&s, &admin, &format!("resource=sensors/{sensor}")).await;
    let methods = methods_of(&one);
    assert_eq!(methods, ["DELETE", "PATCH", "PATCH", "POST"], "{one}");
    let escaped = &one["items"][1];
    assert_eq!(escaped["after"]["debounce_s"], 2, "{escaped}");
    assert!(
        escaped["path"].as_str().unwrap().contains('%'),
        "the path as sent: {escaped}"
    );
    let (_, links) = with(
        &s,
        &admin,
        Method::GET,
        &format!("/v1/audit?resource=clients/{client}/sensors"),
        None,
    )
    .await;
    assert_eq!(links["items"].as_array().unwrap().len(), 2, "{links}");
    let (_, later) = with(
        &s,
        &admin,
        Method::GET,
        "/v1/audit?from=2999-01-01T00:00:00Z",
        None,
    )
    .await;
    assert_eq!(later["items"], json!([]), "{later}");
    let (_, paged) = with(
        &s,
        &admin,
        Method::GET,
        &format!("/v1/audit?token_id={admin_id}&limit=5"),
        None,
    )
    .await;
    let cursor = paged["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let (_, rest) = with(
        &s,
        &admin,
        Method::GET,
        &format!("/v1/audit?token_id={admin_id}&limit=5&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(
        rest["items"][0], items[5],
        "the next page goes on where the first ended"
    );

    // The bootstrap token's changes name it; a read token may not read the trail.
    let (st, _) = s.post("/v1/sites", json!({"id": unique("site")})).await;
    assert_eq!(st, 201);
    let (_, boot) = with(
        &s,
        &admin,
        Method::GET,
        "/v1/audit?token_id=bootstrap&resource=sites",
        None,
    )
    .await;
    assert_eq!(
        boot["items"][0]["token"]["name"], "LATCH_API_TOKEN",
        "{boot}"
    );
    let (st, body) = with(&s, &reader, Method::GET, "/v1/audit", None).await;
    assert_eq!(st, 403, "{body}");
    // A token's deletion names the token it deleted.
    let (temp, _) = token(&s, "temporary", &["read"]).await;
    let (st, _) = with(
        &s,
        &admin,
        Method::DELETE,
        &format!("/v1/tokens/{temp}"),
        None,
    )
    .await;
    assert_eq!(st, 204);
    let gone = audit_page(&s, &admin, &format!("resource=tokens/{temp}")).await;
    let methods = methods_of(&gone);
    assert_eq!(methods, ["DELETE", "POST"], "{gone}");
    assert_eq!(gone["items"][0]["before"]["name"], "temporary", "{gone}");
    // A bad filter is a 400, not a failure of the store.
    let (st, body) = with(
        &s,
        &admin,
        Method::GET,
        "/v1/audit?resource=sensors%00x",
        None,
    )
    .await;
    assert_eq!(st, 400, "{body}");
}

#[tokio::test]
async fn an_open_api_records_changes_without_a_token() {
    let s = TestServer::start().await;
    let id = unique("door");
    s.sensor(&id).await;
    let (st, trail) = s.get(&format!("/v1/audit?resource=sensors/{id}")).await;
    assert_eq!(st, 200, "{trail}");
    assert_eq!(trail["items"].as_array().unwrap().len(), 1, "{trail}");
    assert!(trail["items"][0]["token"].is_null(), "{trail}");
    let (st, body) = s.get("/v1/audit?colour=red").await;
    assert_eq!(st, 400, "an unknown parameter: {body}");
}
