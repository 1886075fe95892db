//! `decide` and `hold` on their own: storms, a site that stays down, its return, and
//! who learns of what.

use super::*;

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

const RULES: Rules = Rules {
    grace: 30_000,
    ratio: 0.5,
    min_sensors: 3,
};

fn site() -> Site {
    Site {
        id: "bldg-7".into(),
        name: Some("Svobody 23".into()),
        address: None,
        gateway_sensor_id: None,
        created_at: 0,
        updated_at: 0,
    }
}

fn member(id: &str, lost: bool) -> Member {
    Member {
        id: sid(id),
        address: format!("room {id}"),
        connection: if lost {
            Connection::Lost
        } else {
            Connection::Online
        },
        data: Some(true),
        last_seen_at: Some(1_000),
    }
}

fn lost_event(id: &str, at: Millis) -> Event {
    Event {
        sensor_id: sid(id),
        kind: EventKind::ConnectionLost,
        at,
        data: Some(true),
        previous: None,
        last_seen_at: Some(1_000),
        detail: Detail::default(),
    }
}

fn linked(id: &str, sensors: &[&str], events: Option<&[&str]>) -> Linked {
    Linked {
        client_id: id.into(),
        events: events.map(|e| e.iter().map(|s| s.to_string()).collect()),
        sensors: sensors.iter().map(|s| sid(s)).collect(),
    }
}

/// Held events numbered from 1, as a store numbers them.
fn numbered(events: impl IntoIterator<Item = Event>) -> Vec<HeldEvent> {
    events
        .into_iter()
        .zip(1..)
        .map(|(event, id)| HeldEvent { id, event })
        .collect()
}

fn pending(at: Millis) -> SiteState {
    SiteState {
        pending_since: Some(at),
        ..SiteState::default()
    }
}

/// The decision on a site whose sensors were first lost at 5,000, once the grace ran out.
fn grace_ran_out(members: &[Member], held: &[HeldEvent], clients: &[Linked]) -> Decision {
    decide(
        &site(),
        &pending(5_000),
        members,
        held,
        clients,
        &RULES,
        35_000,
    )
    .expect("a decision once the grace ran out")
}

#[test]
fn a_storm_is_one_site_event_per_client_naming_only_its_sensors() {
    let members: Vec<Member> = ["a1", "a2", "a3", "a4"]
        .iter()
        .map(|id| member(id, *id != "a4"))
        .collect();
    let held = numbered(["a1", "a2", "a3"].iter().map(|id| lost_event(id, 5_000)));
    let clients = [
        linked("c1", &["a1", "a2", "a4"], None),
        linked("c2", &["a3"], None),
        linked("old", &["a1"], Some(&["sensor.connection_lost"])),
    ];
    assert_eq!(
        decide(
            &site(),
            &pending(5_000),
            &members,
            &held,
            &clients,
            &RULES,
            20_000
        ),
        None,
        "the grace still runs"
    );
    let d = grace_ran_out(&members, &held, &clients);
    assert!(d.state.down);
    assert_eq!(d.state.told, vec![sid("a1"), sid("a2"), sid("a3")]);
    let changed = d.changed.as_ref().expect("the site went down");
    assert_eq!(
        (changed.kind, changed.at, changed.lost),
        (EventKind::SiteConnectionLost, 35_000, 3)
    );
    let site_events: Vec<&Made> = d.made.iter().filter(|m| m.body.is_some()).collect();
    assert_eq!(site_events.len(), 2);
    let c1: serde_json::Value =
        serde_json::from_str(site_events[0].body.as_ref().unwrap()).unwrap();
    assert_eq!(c1["sensors"].as_array().unwrap().len(), 2, "{c1}");
    assert_eq!(c1["sensors_total"], 3);
    // A client that does not take site events gets its sensor's own loss.
    let own: Vec<(&str, EventKind)> = d
        .made
        .iter()
        .filter(|m| m.body.is_none())
        .map(|m| (m.client_id.as_str(), m.event.kind))
        .collect();
    assert_eq!(own, [("old", EventKind::ConnectionLost)]);
}

#[test]
fn one_sensor_lost_alone_goes_out_after_the_grace() {
    let members: Vec<Member> = (0..10).map(|i| member(&format!("b{i}"), i == 0)).collect();
    let held = numbered([lost_event("b0", 5_000)]);
    let clients = [linked("c1", &["b0", "b1"], None)];
    let d = grace_ran_out(&members, &held, &clients);
    assert!(!d.state.down);
    assert_eq!(d.state.pending_since, None);
    assert_eq!(d.changed, None, "it stays up: nothing for the live stream");
    assert_eq!(d.made.len(), 1);
    assert_eq!(d.made[0].event.kind, EventKind::ConnectionLost);
    assert!(d.made[0].body.is_none());
}

#[test]
fn a_gateway_lost_is_the_site_down_and_its_return_lists_back_and_still_lost() {
    let s = Site {
        gateway_sensor_id: Some(sid("gw")),
        ..site()
    };
    let members = [
        member("gw", true),
        member("g1", true),
        member("g2", false),
        member("g3", false),
    ];
    let clients = [linked("c1", &["gw", "g1", "g2"], None)];
    let held = numbered([lost_event("gw", 5_000), lost_event("g1", 5_000)]);
    let d = decide(
        &s,
        &pending(5_000),
        &members,
        &held,
        &clients,
        &RULES,
        35_000,
    )
    .unwrap();
    assert!(d.state.down, "two of four are lost, but one is the gateway");
    assert_eq!(d.made.len(), 1);
    // The gateway comes back; g1 does not.
    let members = [
        member("gw", false),
        member("g1", true),
        member("g2", false),
        member("g3", false),
    ];
    let restored = Event {
        kind: EventKind::ConnectionRestored,
        ..lost_event("gw", 50_000)
    };
    assert_eq!(
        hold(EventKind::ConnectionRestored, &d.state, sid("gw"), false),
        Hold::Hold
    );
    assert_eq!(
        hold(EventKind::StillLost, &d.state, sid("g1"), false),
        Hold::Drop
    );
    assert_eq!(
        hold(EventKind::ConnectionLost, &d.state, sid("g3"), false),
        Hold::Send
    );
    let up = decide(
        &s,
        &d.state,
        &members,
        &numbered([restored]),
        &clients,
        &RULES,
        60_000,
    )
    .unwrap();
    assert!(!up.state.down);
    let back = up.changed.as_ref().expect("the site came back");
    assert_eq!(
        (back.kind, back.sensors, back.lost),
        (EventKind::SiteConnectionRestored, 4, 1)
    );
    assert_eq!(
        up.made.len(),
        1,
        "the site's restoration only: {:?}",
        up.made
    );
    let body: serde_json::Value = serde_json::from_str(up.made[0].body.as_ref().unwrap()).unwrap();
    assert_eq!(body["restored"][0]["id"], "gw");
    assert_eq!(body["still_lost"][0]["id"], "g1");
}

#[test]
fn a_client_linked_while_the_site_was_down_gets_the_sensors_own_return() {
    let members = [member("e1", true), member("e2", true), member("e3", true)];
    let held = numbered([lost_event("e1", 5_000)]);
    let first = [linked("c1", &["e1", "e2", "e3"], None)];
    let d = grace_ran_out(&members, &held, &first);
    assert_eq!(d.state.told_clients, ["c1"]);
    let back = [
        member("e1", false),
        member("e2", false),
        member("e3", false),
    ];
    let restored = Event {
        kind: EventKind::ConnectionRestored,
        ..lost_event("e1", 50_000)
    };
    let both = [
        linked("c1", &["e1", "e2", "e3"], None),
        linked("late", &["e1"], None),
    ];
    let up = decide(
        &site(),
        &d.state,
        &back,
        &numbered([restored]),
        &both,
        &RULES,
        60_000,
    )
    .unwrap();
    let got: Vec<(&str, EventKind)> = up
        .made
        .iter()
        .map(|m| (m.client_id.as_str(), m.event.kind))
        .collect();
    assert_eq!(
        got,
        [
            ("c1", EventKind::SiteConnectionRestored),
            ("late", EventKind::ConnectionRestored)
        ]
    );
}

#[test]
fn while_down_held_events_go_at_once_to_the_clients_its_loss_did_not_tell() {
    let lost = [
        member("d1", true),
        member("d2", true),
        member("d3", true),
        member("d4", true),
    ];
    let sensor_events = Some(&["sensor.connection_lost", "sensor.connection_restored"][..]);
    let clients = [
        linked("c1", &["d1", "d2", "d3", "d4"], None),
        linked("c2", &["d1", "d2"], sensor_events),
    ];
    let losses = numbered(
        ["d1", "d2", "d3", "d4"]
            .iter()
            .map(|id| lost_event(id, 5_000)),
    );
    let down = grace_ran_out(&lost, &losses, &clients);
    assert!(down.consumes_held);
    assert_eq!(down.state.told_clients, ["c1"]);
    let restored = |id: &str, at| Event {
        kind: EventKind::ConnectionRestored,
        ..lost_event(id, at)
    };
    // d1 is back; three of four are still lost.
    let members = [
        member("d1", false),
        member("d2", true),
        member("d3", true),
        member("d4", true),
    ];
    let held = vec![HeldEvent {
        id: 5,
        event: restored("d1", 40_000),
    }];
    let got = |d: &Decision| -> Vec<(String, EventKind, String)> {
        d.made
            .iter()
            .map(|m| {
                (
                    m.client_id.clone(),
                    m.event.kind,
                    m.event.sensor_id.to_string(),
                )
            })
            .collect()
    };
    let d = decide(
        &site(),
        &down.state,
        &members,
        &held,
        &clients,
        &RULES,
        41_000,
    )
    .unwrap();
    assert_eq!(
        got(&d),
        [("c2".into(), EventKind::ConnectionRestored, "d1".into())]
    );
    assert_eq!(
        (d.state.down, d.state.released, d.consumes_held),
        (true, 5, false)
    );
    assert_eq!(d.changed, None);
    assert_eq!(
        decide(&site(), &d.state, &members, &held, &clients, &RULES, 42_000),
        None,
        "nothing new for anyone"
    );
    // c1 stops taking site events: the site's loss told it of d1, so it gets d1's own
    // return now, and what follows as any client the loss did not tell. (The change of
    // its subscription asks for the decision: a site down with nothing new is not due.)
    let unsubscribed = [
        linked("c1", &["d1", "d2", "d3", "d4"], sensor_events),
        linked("c2", &["d1", "d2"], sensor_events),
    ];
    assert_eq!(
        decide(
            &site(),
            &d.state,
            &members,
            &held,
            &unsubscribed,
            &RULES,
            43_000
        ),
        None,
        "not due until something asks"
    );
    let asked = SiteState {
        pending_since: Some(43_000),
        ..d.state.clone()
    };
    let d = decide(
        &site(),
        &asked,
        &members,
        &held,
        &unsubscribed,
        &RULES,
        43_000,
    )
    .unwrap();
    assert_eq!(
        got(&d),
        [("c1".into(), EventKind::ConnectionRestored, "d1".into())]
    );
    assert!(d.state.told_clients.is_empty());
    let mut held = held;
    held.push(HeldEvent {
        id: 6,
        event: restored("d2", 50_000),
    });
    let back = [
        member("d1", false),
        member("d2", false),
        member("d3", true),
        member("d4", true),
    ];
    let up = decide(
        &site(),
        &d.state,
        &back,
        &held,
        &unsubscribed,
        &RULES,
        51_000,
    )
    .unwrap();
    assert_eq!(
        got(&up),
        [
            ("c1".into(), EventKind::ConnectionRestored, "d2".into()),
            ("c2".into(), EventKind::ConnectionRestored, "d2".into())
        ],
        "each return once, and no site event to a client that no longer takes them"
    );
    assert_eq!((up.state.down, up.consumes_held), (false, true));
}

#[test]
fn while_up_losses_are_held_and_state_changes_never() {
    let up = SiteState::default();
    assert_eq!(
        hold(EventKind::ConnectionLost, &up, sid("x"), false),
        Hold::Hold
    );
    assert_eq!(
        hold(EventKind::ConnectionRestored, &up, sid("x"), false),
        Hold::Send
    );
    assert_eq!(
        hold(EventKind::ConnectionRestored, &up, sid("x"), true),
        Hold::Hold
    );
    assert_eq!(
        hold(EventKind::StateChanged, &up, sid("x"), true),
        Hold::Send
    );
}
