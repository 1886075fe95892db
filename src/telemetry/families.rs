//! Every metric family latch records, named and described once. Call sites take a handle
//! from a family (`families::COMMIT_FAILURES.counter().increment(1)`), never a string, so
//! a name lives in one place, and the book's metrics reference is generated from [`ALL`].
//!
//! Label values are `&'static str`: every label latch uses has a closed set of values
//! (sources, reasons, outcomes, statuses, call names), and static parts cost no
//! allocation on the paths that count every reading and every attempt.

use metrics::{Counter, Gauge, Histogram, Label};

/// What a family measures over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric family: its name, kind, help text and label names.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

fn labels(values: &[(&'static str, &'static str)]) -> Vec<Label> {
    values
        .iter()
        .map(|(k, v)| Label::from_static_parts(k, v))
        .collect()
}

impl Family {
    pub fn counter(&self) -> Counter {
        metrics::counter!(self.name)
    }
    pub fn counter_with(&self, values: &[(&'static str, &'static str)]) -> Counter {
        metrics::counter!(self.name, labels(values))
    }
    pub fn gauge(&self) -> Gauge {
        metrics::gauge!(self.name)
    }
    pub fn gauge_with(&self, values: &[(&'static str, &'static str)]) -> Gauge {
        metrics::gauge!(self.name, labels(values))
    }
    pub fn histogram(&self) -> Histogram {
        metrics::histogram!(self.name)
    }

    /// This family's counters by the value of its label `label`, each taken from the
    /// recorder once ([`CountersBy`]).
    pub fn counters_by(&self, label: &'static str) -> CountersBy {
        CountersBy {
            family: *self,
            label,
            handles: Vec::new(),
        }
    }

    /// Gives the family its help text (the exporter's `# HELP`).
    pub fn describe(&self) {
        match self.kind {
            Kind::Counter => metrics::describe_counter!(self.name, self.help),
            Kind::Gauge => metrics::describe_gauge!(self.name, self.help),
            Kind::Histogram => metrics::describe_histogram!(self.name, self.help),
        }
    }
}

/// A family's counters, one per value of a label, each taken from the recorder once and
/// then kept by whoever counts. Taking a handle hashes the family's name and labels and
/// looks them up under the registry's lock, which the dispatcher did several times for
/// every webhook. A handle taken before the recorder is installed counts nothing, so these
/// are made by what starts after it (the service installs it first).
pub struct CountersBy {
    family: Family,
    label: &'static str,
    handles: Vec<(&'static str, Counter)>,
}

impl CountersBy {
    /// The counter of label value `value`. The values are few (a closed set): a list
    /// beats a map.
    pub fn get(&mut self, value: &'static str) -> &Counter {
        let i = match self.handles.iter().position(|(v, _)| *v == value) {
            Some(i) => i,
            None => {
                let c = self.family.counter_with(&[(self.label, value)]);
                self.handles.push((value, c));
                self.handles.len() - 1
            }
        };
        &self.handles[i].1
    }
}

macro_rules! families {
    ($($id:ident: $kind:ident $name:literal [$($label:literal),*] $help:literal;)*) => {
        $(
            #[doc = $help]
            pub const $id: Family = Family {
                name: $name,
                kind: Kind::$kind,
                help: $help,
                labels: &[$($label),*],
            };
        )*
        /// Every family, in the metrics reference's order.
        pub const ALL: &[&Family] = &[$(&$id),*];
    };
}

families! {
    READINGS_ACCEPTED: Counter "latch_readings_accepted_total" ["source"]
        "Readings accepted (durable), by source.";
    READINGS_REJECTED: Counter "latch_readings_rejected_total" ["source", "reason"]
        "Readings rejected, by source and reason.";
    DELIVERY_ATTEMPTS: Counter "latch_delivery_attempts_total" ["outcome"]
        "Webhook attempts, by outcome.";
    NOTIFICATIONS: Counter "latch_notifications_total" ["status"]
        "Notifications that reached a final status, by status (silenced: made while a silence matched them, never sent).";
    NOTIFICATIONS_PENDING: Gauge "latch_notifications_pending" []
        "Notifications waiting to be delivered.";
    DELIVERY_LATENCY: Histogram "latch_delivery_latency_seconds" []
        "Time from a notification's creation to its delivery, in seconds.";
    DELIVERY_ATTEMPT_SECONDS: Histogram "latch_delivery_attempt_seconds" []
        "Duration of one webhook attempt, in seconds.";
    COMMIT_SECONDS: Histogram "latch_commit_seconds" []
        "Duration of one group commit, in seconds.";
    COMMIT_READINGS: Histogram "latch_commit_readings" []
        "Readings in one group commit.";
    COMMIT_FAILURES: Counter "latch_commit_failures_total" []
        "Group commits that failed (their readings were refused).";
    COMMIT_QUEUE_SECONDS: Histogram "latch_commit_queue_seconds" []
        "Time a shard's batch waited for its group commit to start (for the store's writer and the commit before), in seconds.";
    STORE_WRITER_WAIT_SECONDS: Histogram "latch_store_writer_wait_seconds" []
        "Embedded store: time a write waited for the one writer connection, in seconds.";
    WAL_CHECKPOINT_SECONDS: Histogram "latch_wal_checkpoint_seconds" []
        "Embedded store: duration of one checkpoint of the write-ahead log into the database file, in seconds.";
    HISTORY_ARCHIVE_SECONDS: Histogram "latch_history_archive_seconds" []
        "Embedded store without ClickHouse: duration of one move of readings from the journal into the archive, in seconds.";
    SENSORS_LOST: Gauge "latch_sensors_lost" []
        "Sensors whose connection is lost now.";
    DOOR_ALARMS: Counter "latch_door_alarms_total" ["type"]
        "Door alarms made, by type: sensor.state_held (reminders too), sensor.battery_low, sensor.tamper, sensor.fault, sensor.flapping.";
    ALARMS_OPEN: Gauge "latch_alarms_open" ["kind", "state"]
        "Alarms not resolved, by kind and state (open: nobody acknowledged it; acknowledged); the whole store's count, the same on every node.";
    ALARM_OLDEST_UNACKNOWLEDGED_SECONDS: Gauge "latch_alarm_oldest_unacknowledged_seconds" []
        "Age of the oldest alarm nobody acknowledged, in seconds; 0 when none is open.";
    SENSORS_LOST_TOTAL: Counter "latch_sensors_lost_total" []
        "Sensors declared lost (connection_lost events).";
    SITES_DOWN: Gauge "latch_sites_down" []
        "Sites down now (their site.connection_lost sent, not yet restored); the whole store's count, the same on every node.";
    SITE_HELD_EVENTS: Gauge "latch_site_held_events" []
        "Liveness events held for the grace of sites that are up, waiting for the site's decision (counted every second, the whole store's).";
    SITE_GRACE_OLDEST_SECONDS: Gauge "latch_site_grace_oldest_seconds" []
        "Age of the oldest site grace still running (a site's first held loss not yet decided), in seconds; 0 when none runs. Above LATCH_SITE_GRACE plus a few seconds, no round is deciding.";
    SOURCE_UP: Gauge "latch_source_up" ["source"]
        "1 while a broker source is connected and consuming, else 0.";
    SOURCE_RECONNECTS: Counter "latch_source_reconnects_total" ["source"]
        "Times a broker source lost its connection and reconnected.";
    AMQP_DEAD_LETTERED: Counter "latch_amqp_dead_lettered_total" ["reason"]
        "AMQP messages moved to the dead-letter queue, by reason.";
    AMQP_DUPLICATES: Counter "latch_amqp_duplicates_total" []
        "AMQP redeliveries of a message already committed, acknowledged without applying.";
    MQTT_DUPLICATES: Counter "latch_mqtt_duplicates_total" []
        "MQTT publishes acknowledged without being applied again (resent by the broker after they had committed).";
    MQTT_RETAINED_IGNORED: Counter "latch_mqtt_retained_ignored_total" []
        "MQTT publishes ignored because they carried the retain flag (stale, not readings).";
    STORE_TIMEOUTS: Counter "latch_store_timeouts_total" ["call"]
        "Store calls PostgreSQL did not answer within `database_timeout`, by call.";
    COMMITS_IN_DOUBT: Counter "latch_commits_in_doubt_total" ["outcome"]
        "PostgreSQL group commits whose answer was lost, by how their transaction ended once it did (`committed`, `rolled_back`) or `unknown`.";
    HISTORY_SPOOL_ROWS: Gauge "latch_history_spool_rows" []
        "History rows waiting in the store for ClickHouse (counted every 5 s).";
    HISTORY_SHIPPED: Counter "latch_history_shipped_rows_total" []
        "History rows shipped to ClickHouse.";
    HISTORY_SHIP_FAILURES: Counter "latch_history_ship_failures_total" []
        "History shipments ClickHouse did not take.";
    HISTORY_SHIP_SECONDS: Histogram "latch_history_ship_seconds" []
        "Duration of one shipment to ClickHouse, in seconds.";
    CLICKHOUSE_UP: Gauge "latch_clickhouse_up" []
        "1 after a shipment ClickHouse took, 0 after one it did not (0 until the first).";
    CLIENTS_DISABLED: Gauge "latch_clients_disabled" []
        "Clients disabled now (410 Gone, or failing for `endpoint_disable_after`).";
    HTTP_RATE_LIMIT: Counter "latch_http_rate_limit_total" ["outcome"]
        "Requests to /v1 the rate limit let through (allowed) or answered 429 (limited).";
    AUTH_FAILURES: Counter "latch_http_auth_failures_total" ["reason"]
        "Requests refused for their credentials, by reason (missing_token, unknown_token, cluster_secret), and those refused unseen while their address failed too often (throttled).";
    CLUSTER_PARTITIONS_OWNED: Gauge "latch_cluster_partitions_owned" []
        "Partitions whose lease this node holds and serves.";
    CLUSTER_PARTITIONS: Gauge "latch_cluster_partitions" []
        "Partitions of the cluster (fixed when the database was first used).";
    CLUSTER_TAKEOVERS: Counter "latch_cluster_takeovers_total" []
        "Partitions this node took over (free, released or expired leases).";
    CLUSTER_FORWARDED: Counter "latch_cluster_forwarded_readings_total" ["source"]
        "Readings handed to the node serving their partition, by the source they came in by.";
    CLUSTER_FORWARD_FAILURES: Counter "latch_cluster_forward_failures_total" []
        "Forwarded requests the owner did not answer (their readings: send again).";
    CLUSTER_FENCED_COMMITS: Counter "latch_cluster_fenced_commits_total" []
        "Commits refused because a partition had moved to another node.";
    STORAGE_FULL: Gauge "latch_storage_full" []
        "1 while the store's disk is full (readings are refused as storage_full), else 0.";
    STORAGE_FULL_EPISODES: Counter "latch_storage_full_episodes_total" []
        "Times the store's disk became full.";
    RETENTION_DELETED: Counter "latch_retention_deleted_total" ["what"]
        "Rows retention deleted (readings, events, notifications, attempts, audit records) and PostgreSQL or ClickHouse history partitions it dropped (partitions).";
    TASK_PANICS: Counter "latch_task_panics_total" []
        "Tasks of the service that panicked (the log names them; the process stops after the first).";
}
