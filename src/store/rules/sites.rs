//! Sites: a commit holds back the liveness events of a site's sensors that the site's
//! decision is to tell (`decide::hold`), and asks for a decision where one is due; a round
//! decides each due site (`decide::decide`) — its notifications made, the held events it
//! consumed taken out, those a silence keeps silenced and untold — and a silence's end
//! tells a site still down its loss again (`site::retell`). A site down is one `site_down`
//! alarm, opened when it goes down and resolved when it comes back, named by the site's
//! notifications; the sensors' events a decision releases open and resolve their own.

use std::collections::{HashMap, HashSet};
use std::future::Future;

use super::alarms::AlarmTables;
use crate::domain::site::decide::{
    self, Decision, HeldEvent, Hold, Linked, Member, Rules, SiteState,
};
use crate::domain::site::{Site, SiteEvent, retell};
use crate::domain::{Event, EventKind, Millis, NotificationRef, SensorId};
use crate::store::{Decided, Result};

/// A sensor's site as holding reads it: the site's id and state, and whether the site holds
/// events of the sensor already.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteOf {
    pub site: String,
    pub state: SiteState,
    pub held: bool,
}

/// A site's loss told again to a client: the notification made and the sensors it names.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteRetold {
    pub made: NotificationRef,
    pub named: Vec<SensorId>,
    pub site: String,
    pub client: String,
}

/// The tables sites read and write, within one transaction.
pub trait SiteTables: AlarmTables {
    /// The sites of those of `sensors` that have one, each site held against a round
    /// deciding it for the rest of the transaction (and read after it is held).
    fn sites_of(
        &mut self,
        sensors: &[SensorId],
    ) -> impl Future<Output = Result<HashMap<SensorId, SiteOf>>>;
    /// Keeps `held` (each with its site) in their order, and asks a decision of the sites
    /// `asked` whose grace does not run yet: their `pending_since` becomes `now`.
    fn hold(
        &mut self,
        held: &[(&str, &Event)],
        asked: &[&str],
        now: Millis,
    ) -> impl Future<Output = Result<()>>;
    /// Site `id` and its state, held against other writers of it.
    fn site(&mut self, id: &str) -> impl Future<Output = Result<Option<(Site, SiteState)>>>;
    /// The site's sensors, by id.
    fn members(&mut self, site: &str) -> impl Future<Output = Result<Vec<Member>>>;
    /// The events the site holds, in the order held, and the id of the last row read (rows
    /// of a kind this version does not know are read and left out, so a decision consumes
    /// them too).
    fn held_events(
        &mut self,
        site: &str,
    ) -> impl Future<Output = Result<(Vec<HeldEvent>, Option<i64>)>>;
    /// The clients linked to the site's sensors, by id, each with its sensors of the site.
    fn linked(&mut self, site: &str) -> impl Future<Output = Result<Vec<Linked>>>;
    /// Inserts a pending notification of `e` (a site's with its `body`) for `client`.
    fn insert_one(
        &mut self,
        client: &str,
        e: &Event,
        body: Option<&str>,
        now: Millis,
    ) -> impl Future<Output = Result<NotificationRef>>;
    /// Takes out the site's held events up to row `last`.
    fn consume_held(&mut self, site: &str, last: i64) -> impl Future<Output = Result<()>>;
    /// As [`super::commit::CommitTables::silence_new`].
    fn silence_new(
        &mut self,
        seqs: &[i64],
        now: Millis,
    ) -> impl Future<Output = Result<HashSet<i64>>>;
    /// Writes the site's state.
    fn write_state(&mut self, site: &str, state: &SiteState) -> impl Future<Output = Result<()>>;
}

/// Which of `events` (their places) make no notification now: liveness events of a site's
/// sensors that the site's decision holds, kept, and reminders it drops. A loss while the
/// site is up starts its grace. What a commit does before its fan-out.
pub async fn hold_for_sites<T: SiteTables>(
    t: &mut T,
    events: &[&Event],
    now: Millis,
) -> Result<HashSet<usize>> {
    let mut skipped = HashSet::new();
    let mut sensors: Vec<SensorId> = events
        .iter()
        .filter(|e| e.kind.is_connection())
        .map(|e| e.sensor_id)
        .collect();
    if sensors.is_empty() {
        return Ok(skipped);
    }
    sensors.sort_unstable();
    sensors.dedup();
    let mut sites = t.sites_of(&sensors).await?;
    if sites.is_empty() {
        return Ok(skipped);
    }
    let mut held: Vec<(String, &Event)> = Vec::new();
    let mut asked: Vec<String> = Vec::new();
    for (k, e) in events.iter().enumerate() {
        if !e.kind.is_connection() {
            continue;
        }
        let Some(s) = sites.get_mut(&e.sensor_id) else {
            continue;
        };
        let hold = decide::hold(e.kind, &s.state, e.sensor_id, s.held);
        if decide::asks_decision(e.kind, &s.state, hold) {
            asked.push(s.site.clone());
        }
        match hold {
            Hold::Send => continue,
            Hold::Drop => {}
            Hold::Hold => {
                held.push((s.site.clone(), e));
                s.held = true;
            }
        }
        skipped.insert(k);
    }
    asked.sort_unstable();
    asked.dedup();
    if !held.is_empty() || !asked.is_empty() {
        let held: Vec<(&str, &Event)> = held.iter().map(|(s, e)| (s.as_str(), *e)).collect();
        let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
        t.hold(&held, &asked, now).await?;
    }
    Ok(skipped)
}

/// Decides the `due` sites (each held by this transaction): what a round does with the
/// sites it took. Answers the notifications made and the sites that changed.
pub async fn decide_due<T: SiteTables>(
    t: &mut T,
    due: Vec<(Site, SiteState)>,
    rules: Rules,
    now: Millis,
) -> Result<Decided> {
    let mut decided = Decided::default();
    for (site, state) in due {
        let (made, changed) = decide_one(t, &site, &state, rules, now).await?;
        decided.made.extend(made);
        decided.changed.extend(changed);
    }
    Ok(decided)
}

async fn decide_one<T: SiteTables>(
    t: &mut T,
    site: &Site,
    state: &SiteState,
    rules: Rules,
    now: Millis,
) -> Result<(Vec<NotificationRef>, Option<SiteEvent>)> {
    let members = t.members(&site.id).await?;
    let (held, last_row) = t.held_events(&site.id).await?;
    let clients = t.linked(&site.id).await?;
    let Some(mut d) = decide::decide(site, state, &members, &held, &clients, &rules, now) else {
        return Ok((Vec::new(), None));
    };
    let alarm_ids = alarms(t, &site.id, &d).await?;
    let mut made = Vec::with_capacity(d.made.len());
    for (m, alarm_id) in d.made.iter().zip(alarm_ids) {
        let n = t
            .insert_one(&m.client_id, &m.event, m.body.as_deref(), now)
            .await?;
        if let Some(id) = alarm_id {
            t.name_alarm(n.seq, &id).await?;
        }
        made.push(n);
    }
    // Every row read, those of a kind this version does not know too.
    if let (true, Some(last)) = (d.consumes_held, last_row) {
        t.consume_held(&site.id, last).await?;
    }
    let seqs: Vec<i64> = made.iter().map(|n| n.seq).collect();
    let silenced = t.silence_new(&seqs, now).await?;
    d.untell(made.iter().filter(|n| silenced.contains(&n.seq)));
    made.retain(|n| !silenced.contains(&n.seq));
    t.write_state(&site.id, &d.state).await?;
    Ok((made, d.changed))
}

/// The alarm each of a decision's notifications names: the site's `site_down` — opened
/// as it goes down, resolved as it comes back — for the site's own; the sensor's, by
/// [`alarm::plan`], for a sensor's event the decision releases (each event once, however
/// many clients it goes to).
async fn alarms<T: SiteTables>(t: &mut T, site: &str, d: &Decision) -> Result<Vec<Option<String>>> {
    let mut site_alarm = t.site_alarm(site).await?;
    match &d.changed {
        Some(c) if c.kind == EventKind::SiteConnectionLost && site_alarm.is_none() => {
            let id = t.new_alarm_id();
            t.open_site_alarm(&id, site, c.at).await?;
            site_alarm = Some(id);
        }
        Some(c) if c.kind == EventKind::SiteConnectionRestored => {
            if let Some(id) = &site_alarm {
                t.write_alarms(&[], &[(id.clone(), c.at)]).await?;
            }
        }
        _ => {}
    }
    // While the site is down its loss stands for its sensors': a loss released as the
    // sensor's own (to a client that takes no site events) opens none of its own.
    let down = d.state.down;
    let stands = |e: &Event| {
        e.kind.is_site()
            || (down && matches!(e.kind, EventKind::ConnectionLost | EventKind::StillLost))
    };
    let events: Vec<&Event> = d
        .made
        .iter()
        .map(|m| &m.event)
        .filter(|e| !stands(e))
        .collect();
    let mut planned = super::alarms::of_events(t, &events).await?.into_iter();
    Ok(d.made
        .iter()
        .map(|m| match (m.event.kind.is_site(), stands(&m.event)) {
            (true, _) => site_alarm.clone(),
            (false, true) => None,
            (false, false) => planned.next().flatten(),
        })
        .collect())
}

/// Tells `client` the loss of `site` again if it is down and a silence kept it from the
/// client (`site::retell`); that the site told it is written later
/// ([`super::silences::SilenceTables::site_told`]).
pub async fn retell<T: SiteTables>(
    t: &mut T,
    site: &str,
    client: &str,
    now: Millis,
) -> Result<Option<SiteRetold>> {
    let Some((site, state)) = t.site(site).await? else {
        return Ok(None);
    };
    if !state.down {
        return Ok(None);
    }
    let Some(c) = t
        .linked(&site.id)
        .await?
        .into_iter()
        .find(|l| l.client_id == client)
    else {
        return Ok(None);
    };
    let members = t.members(&site.id).await?;
    let Some(r) = retell::retell(&site, &state, &members, &c, now) else {
        return Ok(None);
    };
    let made = t
        .insert_one(client, &r.made.event, r.made.body.as_deref(), now)
        .await?;
    if let Some(id) = t.site_alarm(&site.id).await? {
        t.name_alarm(made.seq, &id).await?;
    }
    Ok(Some(SiteRetold {
        made,
        named: r.named,
        site: site.id,
        client: client.to_string(),
    }))
}
