//! A fleet in sites at the size issue #50 asks for (10,000 sensors in 50 sites), beside a
//! site where one sensor of ten goes silent and one whose gateway does; clients each
//! linked to a different share of it, so a site's event can be checked to name exactly
//! the receiving client's sensors.

use std::collections::{BTreeMap, BTreeSet};

use latch::config::Config;
use latch::domain::{Client, Sensor, SensorId, time};
use serde_json::{Value, json};

use super::{Received, Receiver};

/// The dark sites and their sensors: all of them go silent at once.
const DARK_SITES: usize = 50;
const PER_SITE: usize = 200;
/// The two small sites' sensors.
const SMALL: usize = 10;

/// The types the fleet's clients take: everything but state changes, so the readings that
/// start every sensor make no webhooks, and what arrives is what the sites decided.
const LIVENESS: [&str; 4] = [
    "sensor.connection_lost",
    "sensor.connection_restored",
    "site.connection_lost",
    "site.connection_restored",
];

/// Which of the fleet's sites a sensor is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Dark(usize),
    /// One of its sensors (the first) goes silent; the site stays up.
    Lone,
    /// Its gateway (the first sensor) goes silent; the site goes down.
    Gate,
}

/// One site of the fleet.
#[derive(Debug, Clone)]
pub struct Site {
    pub id: String,
    pub place: Place,
    pub sensors: Vec<String>,
}

/// The fleet: its sites, and each client's sensors.
pub struct Fleet {
    pub sites: Vec<Site>,
    /// Per client (`c` in [`linked`]), its id and its sensors.
    pub clients: Vec<(String, BTreeSet<String>)>,
}

/// Whether client `c` is linked to sensor `i` of a site at `place`: every client a
/// different share, one of them not linked to the gateway of a site it has sensors in.
fn linked(c: usize, place: Place, i: usize) -> bool {
    match (c, place) {
        (0, _) => true,
        (1, Place::Dark(s)) => s.is_multiple_of(2),
        (1, _) => true,
        (2, _) => i.is_multiple_of(3),
        (3, Place::Dark(s)) => s < 10 && !i.is_multiple_of(2),
        (3, Place::Gate) => i != 0,
        _ => false,
    }
}

/// Clients of the fleet.
pub const CLIENTS: usize = 4;

impl Fleet {
    /// The fleet's ids under a fresh `tag` (sensor ids stay within 16 characters).
    pub fn plan() -> Self {
        let u = ulid::Ulid::new().to_string();
        let tag = &u[u.len() - 5..];
        let mut sites = Vec::new();
        let mut site = |place: Place, name: String, n: usize, letter: char| {
            let sensors = (0..n)
                .map(|i| format!("{tag}{letter}{}x{i:03}", sites.len()))
                .collect();
            sites.push(Site {
                id: format!("{tag}-{name}"),
                place,
                sensors,
            });
        };
        for s in 0..DARK_SITES {
            site(Place::Dark(s), format!("dark-{s:02}"), PER_SITE, 'd');
        }
        site(Place::Lone, "lone".into(), SMALL, 'l');
        site(Place::Gate, "gate".into(), SMALL, 'g');
        Self {
            sites,
            clients: Vec::new(),
        }
    }

    /// Registers the sites, their sensors (each with `timeout_s` of its own when given),
    /// a client for each of `urls` ([`CLIENTS`] of them, each taking [`LIVENESS`]) and
    /// their links in the store `config` names, in bulk, before latch starts on it: 30,000
    /// API requests, one a sensor or link, would take most of a test's time (registration
    /// over the API is tested on its own).
    pub async fn import(&mut self, config: &Config, urls: &[String], timeout_s: Option<u32>) {
        assert_eq!(urls.len(), CLIENTS);
        let store = latch::store::connect(config)
            .await
            .expect("the store opens");
        let now = time::now_ms();
        let site = |s: &Site, gateway: Option<&String>| latch::domain::site::Site {
            id: s.id.clone(),
            name: Some(format!("{:?}", s.place)),
            address: Some(format!("{} street", s.id)),
            gateway_sensor_id: gateway.map(|g| SensorId::parse(g).unwrap()),
            created_at: now,
            updated_at: now,
        };
        for s in &self.sites {
            store.create_site(site(s, None)).await.unwrap();
        }
        for url in urls {
            let client = Client {
                id: latch::domain::client::new_client_id(),
                name: "site fleet".into(),
                url: url.clone(),
                secret: latch::domain::client::generate_secret(),
                created_at: now,
                events: Some(LIVENESS.iter().map(|t| t.to_string()).collect()),
                ..Client::default()
            };
            store.create_client(client.clone()).await.unwrap();
            self.clients.push((client.id, BTreeSet::new()));
        }
        let mut sensors = Vec::new();
        let mut links = Vec::new();
        for s in &self.sites {
            for (i, id) in s.sensors.iter().enumerate() {
                let sensor_id = SensorId::parse(id).unwrap();
                sensors.push(Sensor {
                    id: sensor_id,
                    address: format!("{} room {i}", s.id),
                    heartbeat_timeout_s: timeout_s,
                    debounce_s: None,
                    site_id: Some(s.id.clone()),
                    created_at: now,
                    battery_low_pct: latch::domain::signals::DEFAULT_BATTERY_LOW_PCT,
                    labels: Default::default(),
                    hold_alarms: Default::default(),
                    flap: None,
                    armed: None,
                });
                for (c, (client, mine)) in self.clients.iter_mut().enumerate() {
                    if linked(c, s.place, i) {
                        mine.insert(id.clone());
                        links.push((client.clone(), sensor_id));
                    }
                }
            }
        }
        store.import(sensors, links, now).await.unwrap();
        let gate = self.site(Place::Gate);
        assert!(
            store
                .replace_site(site(gate, Some(&gate.sensors[0])))
                .await
                .unwrap()
        );
    }

    pub fn site(&self, place: Place) -> &Site {
        self.sites.iter().find(|s| s.place == place).unwrap()
    }

    pub fn dark(&self) -> impl Iterator<Item = &Site> {
        self.sites
            .iter()
            .filter(|s| matches!(s.place, Place::Dark(_)))
    }

    /// Client `c`'s sensors of `site`, sorted.
    pub fn mine(&self, c: usize, site: &Site) -> Vec<String> {
        let mine = &self.clients[c].1;
        let mut v: Vec<String> = site
            .sensors
            .iter()
            .filter(|s| mine.contains(*s))
            .cloned()
            .collect();
        v.sort();
        v
    }
}

/// Readings of `data` for `ids`, in requests of up to 10,000.
pub fn readings<'a>(ids: impl IntoIterator<Item = &'a String>, data: u8) -> Vec<Value> {
    let all: Vec<Value> = ids
        .into_iter()
        .map(|id| json!({"sensor_id": id, "data": data}))
        .collect();
    all.chunks(10_000)
        .map(|c| Value::Array(c.to_vec()))
        .collect()
}

/// What a client received, each notification once (a repeat after a node was killed
/// carries the same `webhook-id` and body), by type.
pub fn by_type(r: &Receiver) -> BTreeMap<String, Vec<Value>> {
    by_type_of(&r.received())
}

fn by_type_of(got: &[Received]) -> BTreeMap<String, Vec<Value>> {
    let mut seen: BTreeMap<String, Value> = BTreeMap::new();
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for g in got {
        let id = g.body["id"].as_str().unwrap_or_default().to_string();
        if let Some(first) = seen.get(&id) {
            assert_eq!(first, &g.body, "a repeat carries the same notification");
            continue;
        }
        seen.insert(id, g.body.clone());
        let t = g.body["type"].as_str().unwrap_or_default().to_string();
        out.entry(t).or_default().push(g.body.clone());
    }
    out
}

/// The sorted ids of a list of sensors in a site's event.
pub fn ids(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("a list of sensors: {v}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// `got`'s events of `kind` by site id, asserting each site came once.
pub fn once_per_site<'a>(
    got: &'a BTreeMap<String, Vec<Value>>,
    kind: &str,
) -> BTreeMap<String, &'a Value> {
    let mut out = BTreeMap::new();
    for e in got.get(kind).into_iter().flatten() {
        let site = e["site"]["id"].as_str().unwrap().to_string();
        assert!(
            out.insert(site.clone(), e).is_none(),
            "{kind} of {site} twice"
        );
    }
    out
}

/// The sensor ids of `got`'s events of `kind`, sorted.
pub fn sensors_of(got: &BTreeMap<String, Vec<Value>>, kind: &str) -> Vec<String> {
    let mut v: Vec<String> = got
        .get(kind)
        .into_iter()
        .flatten()
        .map(|e| e["sensor"]["id"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// Posts `body` until every reading is accepted, as the README tells a sender to: with an
/// `Idempotency-Key`, the whole request again after a 503 or a `store_unavailable` (a
/// commit that outlasted `database_timeout` while a site's decision held its row), so
/// nothing is applied twice. Panics on any other answer, or after ten tries.
pub async fn send_until_accepted(s: &super::TestServer, body: Value) {
    let n = body.as_array().map_or(1, Vec::len);
    let key = super::unique("fleet");
    for _ in 0..10 {
        let mut req = s
            .http
            .post(format!("{}/v1/readings", s.base))
            .header("idempotency-key", &key)
            .json(&body);
        if let Some(t) = &s.token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let answer: Value = r.json().await.unwrap();
        let transient = answer["rejected"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x["code"] == "store_unavailable"));
        match status {
            202 if !transient => {
                assert_eq!(answer["accepted"], n, "{answer}");
                return;
            }
            202 | 503 => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
            _ => panic!("{status}: {answer}"),
        }
    }
    panic!("readings still not accepted after ten tries");
}
