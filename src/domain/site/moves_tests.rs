//! `leave`, `join` and `fan_out` on their own: what a site owes of a sensor that leaves it,
//! up or down, to the clients its loss told and to the others.

use super::*;
use crate::domain::{Detail, EventKind};

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

fn event(id: &str, kind: EventKind, at: Millis) -> Event {
    Event {
        sensor_id: sid(id),
        kind,
        at,
        data: Some(true),
        previous: None,
        last_seen_at: Some(1_000),
        detail: Detail::default(),
    }
}

fn client(id: &str, events: Option<&[&str]>) -> Linked {
    Linked {
        client_id: id.into(),
        events: events.map(|e| e.iter().map(|s| s.to_string()).collect()),
        sensors: vec![sid("x1")],
    }
}

fn held(id: i64, kind: EventKind, at: Millis) -> HeldEvent {
    HeldEvent {
        id,
        event: event("x1", kind, at),
    }
}

#[test]
fn a_sensor_leaving_a_site_in_its_grace_owes_every_client_every_held_event() {
    let state = SiteState {
        pending_since: Some(5_000),
        ..SiteState::default()
    };
    let h = [
        held(1, EventKind::ConnectionLost, 5_000),
        held(2, EventKind::ConnectionRestored, 6_000),
    ];
    let l = leave(
        &state,
        sid("x1"),
        &h,
        &[client("c1", None)],
        Some(true),
        7_000,
    );
    assert!(l.made.is_empty());
    assert_eq!(l.owed, vec![h[0].event.clone(), h[1].event.clone()]);
    assert_eq!(
        l.state, state,
        "the grace of the others runs on, and the decision reads who is in the site then"
    );
}

#[test]
fn a_site_down_owes_the_clients_its_loss_told_what_it_held_back_from_them_only() {
    // Down, its loss told c1 of x1; c2 was not told (it does not take site events) and got
    // what was held up to row 2 as x1's own.
    let state = SiteState {
        down: true,
        since: Some(40_000),
        told: vec![sid("x1"), sid("x2")],
        told_clients: vec!["c1".into()],
        released: 2,
        ..SiteState::default()
    };
    let h = [
        held(1, EventKind::ConnectionRestored, 50_000),
        held(2, EventKind::ConnectionLost, 60_000),
        held(3, EventKind::ConnectionRestored, 70_000),
    ];
    let clients = [client("c1", None), client("c2", None)];
    let l = leave(&state, sid("x1"), &h, &clients, Some(true), 80_000);
    let made: Vec<(&str, EventKind)> = l
        .made
        .iter()
        .map(|m| (m.client_id.as_str(), m.event.kind))
        .collect();
    assert_eq!(
        made,
        [
            ("c1", EventKind::ConnectionRestored),
            ("c1", EventKind::ConnectionLost)
        ],
        "c1 is owed what c2 got already, in order, before what both are owed"
    );
    assert!(l.made.iter().all(|m| m.body.is_none()));
    assert_eq!(l.owed, vec![h[2].event.clone()]);
    assert_eq!(
        l.state.told,
        vec![sid("x2")],
        "its return no longer names x1"
    );
    assert_eq!(
        l.state.pending_since,
        Some(80_000),
        "decided again: its share of lost sensors changed"
    );
}

#[test]
fn a_sensor_lost_after_its_site_went_down_owes_only_what_was_not_released() {
    let state = SiteState {
        down: true,
        told: vec![sid("x2")],
        told_clients: vec!["c1".into()],
        released: 1,
        ..SiteState::default()
    };
    let h = [
        held(1, EventKind::ConnectionLost, 50_000),
        held(2, EventKind::ConnectionRestored, 60_000),
    ];
    let l = leave(
        &state,
        sid("x1"),
        &h,
        &[client("c1", None)],
        Some(true),
        70_000,
    );
    assert!(l.made.is_empty(), "every client had row 1 already");
    assert_eq!(l.owed, vec![h[1].event.clone()]);
}

#[test]
fn what_is_made_at_once_keeps_to_each_client_s_subscription() {
    let state = SiteState {
        down: true,
        told: vec![sid("x1")],
        told_clients: vec!["c1".into(), "c2".into()],
        released: 1,
        ..SiteState::default()
    };
    let h = [held(1, EventKind::ConnectionRestored, 50_000)];
    let clients = [
        client(
            "c1",
            Some(&["site.connection_lost", "sensor.state_changed"]),
        ),
        client("c2", None),
    ];
    let l = leave(&state, sid("x1"), &h, &clients, Some(true), 60_000);
    let to: Vec<&str> = l.made.iter().map(|m| m.client_id.as_str()).collect();
    assert_eq!(to, ["c2"]);
}

#[test]
fn a_site_gaining_a_sensor_is_decided_again_when_down_or_the_sensor_is_lost() {
    let up = SiteState::default();
    assert_eq!(
        join(&up, false, 9_000),
        up,
        "an online sensor changes nothing"
    );
    assert_eq!(join(&up, true, 9_000).pending_since, Some(9_000));
    let grace = SiteState {
        pending_since: Some(5_000),
        ..SiteState::default()
    };
    assert_eq!(
        join(&grace, true, 9_000).pending_since,
        Some(5_000),
        "a grace running goes on"
    );
    let down = SiteState {
        down: true,
        ..SiteState::default()
    };
    assert_eq!(join(&down, false, 9_000).pending_since, Some(9_000));
}

#[test]
fn an_event_fans_out_to_the_clients_that_take_its_type() {
    let e = event("x1", EventKind::ConnectionLost, 5_000);
    let clients = [
        client("c1", None),
        client("c2", Some(&["sensor.state_changed"])),
        client("c3", Some(&["sensor.connection_lost"])),
    ];
    let to: Vec<String> = fan_out(&e, &clients)
        .into_iter()
        .map(|m| m.client_id)
        .collect();
    assert_eq!(to, ["c1", "c3"]);
}

#[test]
fn a_return_made_when_its_sensor_leaves_carries_the_data_it_has_then() {
    let state = SiteState {
        pending_since: Some(5_000),
        ..SiteState::default()
    };
    let h = [
        held(1, EventKind::ConnectionLost, 5_000),
        held(2, EventKind::ConnectionRestored, 6_000),
    ];
    let l = leave(
        &state,
        sid("x1"),
        &h,
        &[client("c1", None)],
        Some(false),
        7_000,
    );
    let data: Vec<Option<bool>> = l.owed.iter().map(|e| e.data).collect();
    assert_eq!(
        data,
        [Some(true), Some(false)],
        "the loss as it was; the return with the state changed since"
    );
}
