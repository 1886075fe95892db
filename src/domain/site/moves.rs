//! A sensor that leaves its site (moved to another site or to none, deleted, or its site
//! deleted) while the site holds events of it or its loss named it: what the site still
//! owes the sensor's clients, so that each learns what it was not told yet, in order, once,
//! by the rules of where the sensor is now (book: Sites).
//!
//! Held events are kept per sensor, not per client: while a site is down, the clients its
//! loss told of a sensor are owed every event held of it (the site's return would have
//! summed them up), the others only those not released to them yet (`released`). The
//! part every client is owed goes where the sensor now is ([`super::decide::hold`] at its
//! new site, which may hold it for that site's grace, or made at once); the part only the
//! told clients are owed is made for them at once, before it, as the sensor's own.

use super::decide::{HeldEvent, Linked, Made, SiteState, released};
use crate::domain::client::wants;
use crate::domain::{Event, Millis, SensorId};

/// What a site owes when `sensor` leaves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Leaving {
    /// The site's state without the sensor. A site down is decided again at the next
    /// round, as its share of lost sensors changed (it may be back).
    pub state: SiteState,
    /// Events only some clients are owed (those the site's loss told of the sensor, whose
    /// events it held back from them), made now as the sensor's own, in order.
    pub made: Vec<Made>,
    /// Events every client of the sensor is owed, in the order held: they go where the
    /// sensor is now.
    pub owed: Vec<Event>,
}

/// What the site in `state` owes when `sensor` leaves it at `now`: `held`, its events held
/// there in order; `clients`, the clients linked to it; `data_now`, its data now, which a
/// return carries as it goes out ([`super::decide::released`]).
pub fn leave(
    state: &SiteState,
    sensor: SensorId,
    held: &[HeldEvent],
    clients: &[Linked],
    data_now: Option<bool>,
    now: Millis,
) -> Leaving {
    let named = state.down && state.told.contains(&sensor);
    let (early, owed): (Vec<&HeldEvent>, Vec<&HeldEvent>) = match state.down {
        true => held.iter().partition(|h| h.id <= state.released),
        false => (Vec::new(), held.iter().collect()),
    };
    let mut made = Vec::new();
    if named {
        for h in early {
            for c in clients {
                if state.told_clients.contains(&c.client_id)
                    && h.id > state.released_to(&c.client_id)
                    && wants(&c.events, h.event.kind)
                {
                    made.push(Made {
                        client_id: c.client_id.clone(),
                        event: released(&h.event, data_now),
                        body: None,
                    });
                }
            }
        }
    }
    let mut state = state.clone();
    state.told.retain(|s| *s != sensor);
    if state.down {
        state.pending_since = Some(now);
    }
    Leaving {
        state,
        made,
        owed: owed
            .into_iter()
            .map(|h| released(&h.event, data_now))
            .collect(),
    }
}

/// The state of a site `sensor` joins at `now` (`lost`: the sensor is lost now). A site
/// down is decided again at the next round (its share of lost sensors changed); a site up
/// that gains a lost sensor starts its grace, as if the loss had come there.
pub fn join(state: &SiteState, lost: bool, now: Millis) -> SiteState {
    let mut state = state.clone();
    if state.down {
        state.pending_since = Some(now);
    } else if lost {
        state.pending_since = Some(state.pending_since.unwrap_or(now));
    }
    state
}

/// The notifications an event of a sensor in no site's hold makes: one per client linked
/// to it that takes its type, in the clients' order.
pub fn fan_out(e: &Event, clients: &[Linked]) -> Vec<Made> {
    clients
        .iter()
        .filter(|c| wants(&c.events, e.kind))
        .map(|c| Made {
            client_id: c.client_id.clone(),
            event: e.clone(),
            body: None,
        })
        .collect()
}

#[cfg(test)]
#[path = "moves_tests.rs"]
mod tests;
