//! One conformance suite for every `Store` backend: each check states a behaviour callers
//! rely on. Every check is its own test on a fresh, empty store, for SQLite and for
//! PostgreSQL, so one failure hides no other and the checks pass in any order.
//!
//! A check is an `async fn(&Subject)` in the module of its concern; [`suite!`] lists
//! them all once, emits a `#[tokio::test]` per check and backend, and collects them in
//! [`CHECKS`]. With the `conformance` feature this module is public, so a store outside
//! this crate (the simulation's model of the store, `crates/sim`) is held to the same
//! checks: it runs each of [`CHECKS`] on a fresh store of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::*;
use crate::domain::{Event, time::now_ms};
// The store module imports these for its tests only (`super::*` brings them then); a build
// with the `conformance` feature alone names them here.
#[cfg(not(test))]
use crate::domain::{EventKind, SensorStatus, Status};

mod alarms;
mod armed;
mod audit;
mod batches;
mod choices;
mod claim_order;
mod commit;
mod escalations;
mod find;
mod history;
mod idempotency;
pub use history::Collect;
mod lifecycle;
mod outbox;
mod receivers;
mod registry;
mod retention;
mod sessions;
mod silence_edges;
mod silence_lists;
mod silence_schedules;
mod silences;
mod site_edges;
mod tokens;

/// A `disable_after` no check reaches.
const NEVER: Millis = Millis::MAX / 2;

/// The store a check runs on, with the handles its backend has besides ([`Opened`]); it
/// reads as the store itself.
pub struct Subject {
    pub store: Arc<dyn Store>,
    pub cluster: Option<Arc<dyn ClusterStore>>,
    pub journal: Option<Arc<dyn Journal>>,
}

impl Subject {
    /// A store of one process with no journal.
    pub fn alone(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            cluster: None,
            journal: None,
        }
    }
}

impl From<Opened> for Subject {
    fn from(o: Opened) -> Self {
        Self {
            store: o.store,
            cluster: o.cluster,
            journal: o.journal,
        }
    }
}

impl std::ops::Deref for Subject {
    type Target = dyn Store;
    fn deref(&self) -> &(dyn Store + 'static) {
        &*self.store
    }
}

/// One check of the suite: the behaviour it states, run on a fresh, empty store.
#[derive(Clone, Copy)]
pub struct Check {
    /// The module of its concern (`registry`, `outbox`, …).
    pub concern: &'static str,
    pub name: &'static str,
    /// Runs the check; it panics where the store does not behave.
    pub run: for<'a> fn(&'a Subject) -> Running<'a>,
}

/// A check under way on a store it borrows.
pub type Running<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}::{}", self.concern, self.name)
    }
}

/// An empty store for one check, with what has to live as long as it.
#[cfg(test)]
struct Fresh {
    store: Subject,
    /// The store's data folder, removed after the store (fields drop in order).
    _dir: tempfile::TempDir,
}

/// The store as a server opens it ([`crate::store::connect`]), on `database_url`: what a
/// backend's wiring adds (or forgets) is part of what the checks see.
#[cfg(test)]
async fn open(database_url: Option<String>) -> Fresh {
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::config::Config::load_from(None, &[]).unwrap();
    config.data_dir = dir.path().to_path_buf();
    if database_url.is_some() {
        // A shared store takes its key from outside the data folder; the file is where the
        // embedded store keeps its own, so the rotation checks' keyring over it (as
        // `latch rotate-key` has) is the store's too.
        use base64::Engine as _;
        let file = dir.path().join(crate::secrets::KEY_FILE);
        let key = base64::engine::general_purpose::STANDARD.encode(crate::secrets::generate_key());
        std::fs::write(&file, format!("# the test's key\n{key}\n")).unwrap();
        config.secret_key_file = Some(file);
    }
    config.database_url = database_url;
    config.sqlite_synchronous = crate::store::sqlite::Synchronous::Normal;
    let store = crate::store::connect_cluster(&config).await.unwrap().into();
    Fresh { store, _dir: dir }
}

#[cfg(test)]
async fn fresh_sqlite() -> Option<Fresh> {
    Some(open(None).await)
}

/// A store on a fresh schema of the test database; `None` (SKIPPED) without one outside CI.
#[cfg(test)]
async fn fresh_postgres() -> Option<Fresh> {
    let schema = crate::store::postgres::tests::fresh_schema().await?;
    let url = crate::store::postgres::tests::schema_url(
        &crate::store::postgres::tests::base_url(),
        &schema,
    );
    Some(open(Some(url)).await)
}

/// Lists every check once: [`CHECKS`], and (in this crate's tests) a module per backend
/// with one test per check, each on the store `fresh_…()` opens (`None`: skipped).
macro_rules! suite {
    ($($concern:ident::$check:ident),* $(,)?) => {
        /// Every check of the suite, in the order they are listed.
        pub const CHECKS: &[Check] = &[
            $(Check { concern: stringify!($concern), name: stringify!($check), run: run::$check },)*
        ];

        /// Each check as a [`Check::run`].
        mod run {
            use super::*;
            $(
                pub(super) fn $check(s: &Subject) -> Running<'_> {
                    Box::pin(super::$concern::$check(s))
                }
            )*
        }

        #[cfg(test)]
        mod sqlite {
            suite!(@tests super::fresh_sqlite; $($concern::$check),*);
        }

        #[cfg(test)]
        mod postgres {
            suite!(@tests super::fresh_postgres; $($concern::$check),*);
        }
    };
    (@tests $fresh:path; $($concern:ident::$check:ident),*) => {
        $(
            #[tokio::test]
            async fn $check() {
                let Some(fresh) = $fresh().await else {
                    return;
                };
                super::$concern::$check(&fresh.store).await;
            }
        )*
    };
}

suite!(
    registry::sensors_crud_and_pagination,
    registry::clients_and_links,
    registry::import_skips_what_exists,
    registry::deletes_cancel_pending,
    registry::registry_changes_follow_create_change_delete,
    registry::counts_by_connection,
    commit::commit_creates_state_history_and_outbox,
    commit::lost_state_survives_and_filters,
    commit::a_batch_notifies_in_event_then_client_order,
    commit::a_sweep_is_told_only_of_what_it_did_not_read,
    choices::subscriptions_make_only_wanted_notifications,
    choices::state_keeps_source_window_and_reminders,
    choices::door_signals_round_trip,
    choices::door_signals_in_history,
    choices::hold_alarms_round_trip,
    choices::flap_round_trip,
    alarms::an_alarm_opens_once_names_its_notifications_and_resolves,
    alarms::an_acknowledgement_is_taken_once_quiets_reminders_and_tells_the_clients_told,
    alarms::a_site_down_is_one_alarm_for_its_sensors,
    alarms::a_schedule_is_kept_whole,
    alarms::a_batch_that_resolves_and_reopens_an_alarm_commits,
    alarms::retention_keeps_an_open_alarms_notifications,
    armed::an_armed_sensor_tells_a_change_out_of_schedule_and_its_next_change_resolves_it,
    armed::a_disarmed_sensors_next_change_still_resolves_its_alarm,
    escalations::an_alarm_nobody_takes_escalates_once_and_the_next_client_hears_its_end,
    escalations::an_alarm_taken_before_its_time_escalates_to_nobody,
    escalations::the_end_told_to_a_client_reached_is_not_superseded_by_a_later_change,
    audit::a_change_keeps_its_record_and_a_refused_one_none,
    audit::the_trail_filters_by_resource_token_and_time,
    audit::the_trail_ships_once_and_stays_readable,
    batches::a_clients_batch_round_trips_and_claims_read_it,
    batches::a_batchs_mark_follows_its_requests,
    outbox::claim_reads_registry_and_cancels_orphans,
    outbox::record_and_retry,
    outbox::leases_exclude_other_nodes,
    outbox::another_nodes_lease_is_kept_but_for_a_delivery,
    outbox::a_lease_given_back_late_keeps_anothers_retry_time,
    outbox::an_older_connection_notification_is_not_replayed,
    history::archive_keeps_reads_whole,
    history::spool_ships_only_what_the_sink_took,
    lifecycle::rotated_secret_signs_during_its_grace,
    lifecycle::gone_disables_until_enabled,
    lifecycle::a_long_failure_streak_disables,
    lifecycle::bulk_replay_keeps_order_and_skips_refusals,
    lifecycle::health_sums_up_attempts,
    lifecycle::health_counts_broker_acknowledgements,
    lifecycle::rate_limit_is_kept,
    receivers::receiver_settings_round_trip_and_claims_read_them,
    receivers::secrets_are_sealed_under_the_stores_key,
    retention::history_goes_at_its_time_and_no_sooner,
    retention::finished_notifications_go_pending_ones_stay,
    retention::a_delivered_state_stays_while_an_older_one_of_its_lane_waits,
    retention::a_delivered_notification_stays_while_an_older_failed_one_it_outranks_does,
    retention::attempts_made_after_retention_emptied_them_still_ship,
    tokens::tokens_keep_hash_and_scopes,
    tokens::deleted_tokens_are_gone,
    idempotency::a_key_is_held_once_and_its_answer_kept,
    idempotency::what_commits_applied_under_a_key_is_read_back,
    idempotency::keys_are_forgotten_after_their_day,
    sessions::unacked_publishes_are_kept_until_taken,
    silences::sites_count_their_sensors,
    silences::a_silence_keeps_and_reconciles_once,
    silences::overlapping_silences_reconcile_at_the_last_end,
    silences::a_silences_state_change_supersedes_an_older_pending_one,
    silences::a_site_decides_once_for_its_sensors,
    silences::a_site_still_down_releases_to_the_clients_its_loss_did_not_tell,
    site_edges::a_moved_sensor_takes_its_held_loss_along,
    site_edges::a_deleted_site_tells_what_it_held,
    site_edges::a_site_whose_lost_sensors_leave_comes_back,
    site_edges::many_sites_down_starve_none,
    site_edges::a_subscription_changed_while_down_releases_at_once,
    site_edges::a_newer_site_event_supersedes_one_waiting,
    site_edges::a_sensors_return_waits_for_the_site_event_that_counts_it_lost,
    site_edges::a_site_comes_back_when_sensors_its_loss_did_not_name_return,
    claim_order::a_site_event_waits_for_an_older_own_event_of_a_sensor_it_names,
    claim_order::a_replayed_dead_letter_tells_nothing_a_newer_one_overtook,
    claim_order::a_sensor_leaving_gives_a_retold_client_nothing_twice,
    silence_edges::a_silence_ending_in_a_grace_leaves_the_loss_to_the_site,
    silence_edges::a_silence_longer_than_retention_still_reconciles,
    silence_edges::a_silenced_site_loss_is_told_once_at_the_end,
    silence_edges::a_site_silence_reconciles_a_sensor_that_moved_away,
    silence_edges::a_silence_end_counts_what_a_site_event_named,
    silence_lists::a_silence_of_many_sensors_matches_exactly_those,
    silence_lists::the_first_missing_of_many_sensors_is_found,
    silence_schedules::a_scheduled_silence_keeps_only_inside_its_windows,
    silence_schedules::a_scheduled_silence_without_windows_or_ended_stays_put,
    find::notifications_newest_first_with_filters,
    find::sensors_found_by_id_prefix_and_address_words,
    find::clients_found_by_name,
    find::a_sensor_finds_the_site_events_that_named_it,
);

pub fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

fn page(limit: u32) -> PageRequest {
    PageRequest { limit, after: None }
}

pub fn sensor(id: &str) -> Sensor {
    Sensor {
        id: sid(id),
        address: format!("address of {id}"),
        heartbeat_timeout_s: None,
        debounce_s: None,
        site_id: None,
        created_at: 1_000,
        battery_low_pct: crate::domain::signals::DEFAULT_BATTERY_LOW_PCT,
        labels: Default::default(),
        hold_alarms: Default::default(),
        flap: None,
        armed: None,
    }
}

pub fn client(id: &str, url: &str) -> Client {
    Client {
        id: id.into(),
        name: format!("client {id}"),
        url: url.into(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        created_at: 2_000,
        ..Client::default()
    }
}

/// `id` lost (or restored) at `at`, heard last at 1 s.
pub fn liveness(id: &str, kind: EventKind, at: Millis) -> CommitBatch {
    let connection = match kind {
        EventKind::ConnectionLost => Connection::Lost,
        _ => Connection::Online,
    };
    CommitBatch {
        states: vec![StateUpdate {
            sensor_id: sid(id),
            data: Some(true),
            changed_at: Some(1_000),
            last_ts: Some(1_000),
            last_seen_at: Some(1_000),
            connection,
            last_source: None,
            debounce: None,
            lost_since: None,
            reminders: None,
            signals: Default::default(),
            hold: None,
            flapping: None,
            seen_only: false,
        }],
        events: vec![Event {
            sensor_id: sid(id),
            kind,
            at,
            data: Some(true),
            previous: None,
            last_seen_at: Some(1_000),
            detail: Default::default(),
        }],
        ..Default::default()
    }
}

/// `n` delivered by node `n1` in one attempt at `at` (200).
pub fn delivered(n: &NotificationRef, at: Millis) -> Outcome {
    Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: Some(Attempt {
            notification_id: n.id.clone(),
            at,
            status_code: Some(200),
            error: None,
            duration_ms: 3,
        }),
        attempts: 1,
        verdict: Verdict::Delivered,
        node: "n1".into(),
        batch_id: None,
    }
}

pub fn change(id: &str, data: bool, previous: Option<bool>, at: Millis) -> CommitBatch {
    CommitBatch {
        readings: vec![ReadingRecord {
            sensor_id: sid(id),
            data,
            ts: at,
            received_at: at,
            late: false,
            signals: Default::default(),
        }],
        states: vec![StateUpdate {
            sensor_id: sid(id),
            data: Some(data),
            changed_at: Some(at),
            last_ts: Some(at),
            last_seen_at: Some(at),
            connection: Connection::Online,
            last_source: None,
            debounce: None,
            lost_since: None,
            reminders: None,
            signals: Default::default(),
            hold: None,
            flapping: None,
            seen_only: false,
        }],
        events: vec![Event {
            sensor_id: sid(id),
            kind: EventKind::StateChanged,
            at,
            data: Some(data),
            previous,
            last_seen_at: None,
            detail: Default::default(),
        }],
        ..Default::default()
    }
}
