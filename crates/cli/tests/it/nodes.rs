//! Two latch nodes on one PostgreSQL: a burst of notifications is delivered once each, no
//! notification is ever sent by both at the same time, and when one node dies mid-burst
//! the other finishes its work once the dead node's leases run out.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::utils::Process;
use crate::utils::cluster::post_until_accepted;
use crate::utils::{Answer, Receiver, TestServer, eventually, service_missing, unique};

/// The PostgreSQL database both nodes share; `None` when the test does not run here: in
/// the PostgreSQL pass (it always uses PostgreSQL, so it runs once, in the first pass), or
/// without PostgreSQL outside CI.
pub(crate) async fn shared_database(dir: &std::path::Path) -> Option<String> {
    if std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") {
        return None;
    }
    match crate::utils::postgres_url(dir).await {
        Ok(u) => Some(u),
        Err(e) => {
            service_missing("PostgreSQL", e);
            None
        }
    }
}

#[tokio::test]
async fn a_second_node_finishes_what_a_killed_node_left() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir_a.path()).await else {
        return;
    };
    let http = reqwest::Client::new();
    let r = Receiver::start().await;
    // Slow answers: the burst is still going when node A dies.
    r.always(Answer {
        status: 200,
        delay: Duration::from_millis(150),
        retry_after: None,
    });
    let a = Process::start(dir_a.path(), Some(url.clone()));
    a.ready(&http).await;
    let post = |path: &str, body: Value| {
        let req = http.post(format!("{}{path}", a.base)).json(&body);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let client = post("/v1/clients", json!({"name": "c", "url": r.url})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let sensors: Vec<String> = (0..60).map(|_| unique("n")).collect();
    for id in &sensors {
        post("/v1/sensors", json!({"id": id, "address": "a"})).await;
        http.put(format!("{}/v1/clients/{client}/sensors/{id}", a.base))
            .send()
            .await
            .unwrap();
    }
    let u = url.clone();
    let b = TestServer::start_in(dir_b.path(), move |c| {
        c.database_url = Some(u);
        c.delivery_timeout = Duration::from_secs(1);
    })
    .await;
    let batch: Vec<Value> = sensors
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    // B has just joined: readings of a partition still moving from A to B are refused
    // as "send it again", and a sender does so.
    post_until_accepted(&http, std::slice::from_ref(&a.base), batch, 30).await;
    r.wait_for(10, 10).await;
    a.kill9();

    // Node B delivers everything: its own share at once, A's after A's leases expire.
    let delivered = eventually(40, "all 60 delivered", || async {
        let n = b
            .notifications(&format!("client_id={client}&status=delivered"))
            .await;
        (n.len() == 60).then_some(n)
    })
    .await;
    let mut by_sensor: HashMap<&str, usize> = HashMap::new();
    for n in &delivered {
        *by_sensor
            .entry(n["sensor_id"].as_str().unwrap())
            .or_default() += 1;
    }
    assert_eq!(
        by_sensor.len(),
        60,
        "one notification per sensor, each delivered"
    );
    assert!(
        r.max_inflight_per_sensor() <= 1,
        "never two requests for one sensor at once, across nodes"
    );
    // At-least-once: only a request A sent but could not record may come twice.
    let got = r.received();
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for g in &got {
        *per_id
            .entry(g.body["id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(per_id.len(), 60, "every notification reached the receiver");
    let repeated = per_id.values().filter(|&&n| n > 1).count();
    assert!(
        repeated <= 32,
        "only A's in-flight ones may repeat: {repeated}"
    );
    b.stop().await;
}

#[tokio::test]
async fn a_sensor_registered_through_one_node_is_known_to_the_other() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir_a.path()).await else {
        return;
    };
    let u = url.clone();
    let a = TestServer::start_in(dir_a.path(), move |c| c.database_url = Some(u)).await;
    let b = TestServer::start_in(dir_b.path(), move |c| c.database_url = Some(url)).await;
    let id = unique("x");
    let reading = json!({"sensor_id": id, "data": 1});

    // Registered on A after B started: B takes its readings within a few seconds.
    a.sensor(&id).await;
    eventually(10, "node B accepts the new sensor's readings", || async {
        let (_, body) = b.post("/v1/readings", reading.clone()).await;
        (body["accepted"] == 1).then_some(())
    })
    .await;
    // A reading B applied is the state A's API shows (one store).
    let (_, sensor) = a.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(sensor["status"]["data"], 1, "{sensor}");

    // Deleted on A: B refuses its readings again.
    let (status, _) = a.delete(&format!("/v1/sensors/{id}")).await;
    assert_eq!(status, 204);
    eventually(10, "node B refuses the deleted sensor", || async {
        let (_, body) = b.post("/v1/readings", reading.clone()).await;
        (body["rejected"][0]["code"] == "unknown_sensor").then_some(())
    })
    .await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn two_nodes_starting_together_on_a_new_database_both_start() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir_a.path()).await else {
        return;
    };
    let u = url.clone();
    // What the nodes log (both run on this test's thread).
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    // Both prepare the empty schema at the same moment: migrations and the monthly
    // partitions of the history tables are made once, by whichever node comes first.
    let (a, b) = tokio::join!(
        TestServer::start_in(dir_a.path(), move |c| c.database_url = Some(u)),
        TestServer::start_in(dir_b.path(), move |c| c.database_url = Some(url.clone())),
    );
    let id = unique("j");
    a.sensor(&id).await;
    let reading = json!({"sensor_id": id, "data": 1});
    eventually(10, "node B accepts a sensor registered on A", || async {
        let (_, body) = b.post("/v1/readings", reading.clone()).await;
        (body["accepted"] == 1).then_some(())
    })
    .await;
    let (status, hist) = a.get(&format!("/v1/sensors/{id}/readings")).await;
    assert_eq!(status, 200, "{hist}");
    assert_eq!(hist["items"].as_array().map(Vec::len), Some(1), "{hist}");
    let logged = logs.text();
    assert!(
        !logged.contains("partition"),
        "no node failed on a history partition:\n{logged}"
    );
    a.stop().await;
    b.stop().await;
}

/// Log lines written by a test's subscriber.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn the_embedded_store_is_one_node_and_has_no_node_to_node_endpoints() {
    if std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") {
        return;
    }
    let s = TestServer::start().await;
    let r = s
        .http
        .post(format!("{}/internal/v1/readings", s.base))
        .json(&json!({"batches": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let (status, cluster) = s.get("/v1/cluster").await;
    assert_eq!(status, 200);
    assert_eq!(cluster["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(cluster["nodes"][0]["partitions"], cluster["partitions"]);
    s.stop().await;
}
