//! Silences: a commit marks `silenced` the new notifications a silence active at its `now`
//! matches and notes the (client, sensor) pairs each kept news of; an ended silence is
//! reconciled once — each of its pairs that no other active silence holds gets the one
//! notification that brings its client's view up to date (`silence::reconcile`), or a
//! site still down whose loss it kept tells that loss again, once per client, for all the
//! sensors it names. A silence that follows a schedule is reconciled at each window's end
//! the same way, then moved to the schedule's next window in the same transaction
//! ([`silence::window_after`]): the commit's matching reads only `starts_at` and `ends_at`.

use std::collections::HashSet;
use std::future::Future;

use super::commit::Newer;
use super::sites::SiteRetold;
use crate::domain::client::wants;
use crate::domain::schedule::Schedule;
use crate::domain::silence::{self, View};
use crate::domain::{Connection, Detail, Event, EventKind, Millis, NotificationRef, SensorId};
use crate::store::Result;

/// A notification a silence kept, as marking it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Silenced {
    pub seq: i64,
    pub client_id: String,
    /// The sensor whose lane it travels in.
    pub sensor_id: SensorId,
    pub kind: EventKind,
    pub body: Option<String>,
    pub data: Option<bool>,
    pub previous: Option<bool>,
}

/// A pair a silence kept news of: what its client knew of the sensor before the first
/// notification kept (`None`: a pair noted before latch kept it), and that notification's
/// seq — what was told after it is read from the outbox (retention keeps it while the pair
/// waits), what came before only through this view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub client_id: String,
    pub sensor_id: SensorId,
    pub before: Option<View>,
    pub since: i64,
}

/// A linked client's sensor as reconciling reads it: the sensor's state now and the
/// notification types the client wants (`None`: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedSensor {
    pub data: Option<bool>,
    pub connection: Connection,
    pub last_seen_at: Option<Millis>,
    pub events: Option<Vec<String>>,
}

/// The tables silences read and write, within one transaction.
pub trait SilenceTables {
    /// Marks `silenced` those of the new notifications `seqs` (ascending) that a silence
    /// active at `now` matches, off the pending list; answers them.
    fn mark_silenced(
        &mut self,
        seqs: &[i64],
        now: Millis,
    ) -> impl Future<Output = Result<Vec<Silenced>>>;
    /// Notes pairs with the sensor's site now; of a pair noted already, or twice here, the
    /// first stays.
    fn note_pairs(&mut self, pairs: &[Pair]) -> impl Future<Output = Result<()>>;
    /// Marks reconciled the silences ended by `ended_by` not reconciled yet; answers their
    /// ids (another node's transaction reconciling them waits, then finds none).
    fn take_ended(
        &mut self,
        ended_by: Millis,
        now: Millis,
    ) -> impl Future<Output = Result<Vec<String>>>;
    /// The schedule silence `id` follows and the end of the window it holds: `None` when
    /// it is one-off, a caller ended it, or its schedule is gone.
    fn follows(&mut self, id: &str) -> impl Future<Output = Result<Option<(Schedule, Millis)>>>;
    /// Moves silence `id` to the window `[starts_at, ends_at)`, to be reconciled at its end.
    fn move_window(
        &mut self,
        id: &str,
        starts_at: Millis,
        ends_at: Millis,
    ) -> impl Future<Output = Result<()>>;
    /// Takes out the pairs silence `id` matches (by the sensor's site when noted, or now)
    /// that no other silence active at `now` holds.
    fn take_pairs(&mut self, id: &str, now: Millis) -> impl Future<Output = Result<Vec<Pair>>>;
    /// The site of `sensor` now.
    fn site_of(&mut self, sensor: SensorId) -> impl Future<Output = Result<Option<String>>>;
    /// Tells `client` the loss of `site` again if it is down (`domain::site::retell`).
    fn retell_site(
        &mut self,
        site: &str,
        client: &str,
        now: Millis,
    ) -> impl Future<Output = Result<Option<SiteRetold>>>;
    /// Writes that the site's loss told the client: its return goes to it too.
    fn site_told(&mut self, r: &SiteRetold) -> impl Future<Output = Result<()>>;
    /// Whether the sensor's site holds events of it its decision will release to `client`:
    /// every one while the site is up, those not released while it is down, all to a client
    /// its loss told of the sensor.
    fn site_will_tell(
        &mut self,
        client: &str,
        sensor: SensorId,
    ) -> impl Future<Output = Result<bool>>;
    /// What `client` knows of `sensor` from its newest notification about it past `since`
    /// delivered or waiting to be: of the sensor's own kinds in its lane, or a site's event
    /// that named it (`silence::site_view`).
    fn view(
        &mut self,
        client: &str,
        sensor: SensorId,
        since: i64,
    ) -> impl Future<Output = Result<Option<View>>>;
    /// Whether the sensor's site is down and its loss told `client` of the sensor.
    fn told_by_site(
        &mut self,
        client: &str,
        sensor: SensorId,
    ) -> impl Future<Output = Result<bool>>;
    /// The sensor as `client` is linked to it (`None`: not linked).
    fn linked(
        &mut self,
        client: &str,
        sensor: SensorId,
    ) -> impl Future<Output = Result<Option<LinkedSensor>>>;
    /// Inserts a pending notification of `e` for `client`, due `now`.
    fn insert_one(
        &mut self,
        client: &str,
        e: &Event,
        now: Millis,
    ) -> impl Future<Output = Result<NotificationRef>>;
    /// As [`super::commit::CommitTables::supersede`].
    fn supersede(&mut self, newer: &[Newer<'_>], now: Millis) -> impl Future<Output = Result<()>>;
}

/// Marks silenced the new notifications (`seqs`) a silence active at `now` matches and
/// notes their pairs: what a commit does after its fan-out. Answers their seqs.
pub async fn apply<T: SilenceTables>(t: &mut T, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
    if seqs.is_empty() {
        return Ok(HashSet::new());
    }
    let silenced = t.mark_silenced(seqs, now).await?;
    crate::store::count_silenced(silenced.len());
    let mut pairs = Vec::new();
    for s in &silenced {
        let k = silence::Kept {
            kind: s.kind,
            anchor: s.sensor_id,
            data: s.data,
            previous: s.previous,
            body: s.body.as_deref(),
        };
        pairs.extend(silence::kept(k).into_iter().map(|(sensor, before)| Pair {
            client_id: s.client_id.clone(),
            sensor_id: sensor,
            before: Some(before),
            since: s.seq,
        }));
    }
    if !pairs.is_empty() {
        t.note_pairs(&pairs).await?;
    }
    Ok(silenced.into_iter().map(|s| s.seq).collect())
}

/// Reconciles the silences ended by `ended_by`, each once: what `Silences::
/// reconcile_silences` does on every backend. Answers the notifications made, in seq
/// order.
pub async fn reconcile_ended<T: SilenceTables>(
    t: &mut T,
    ended_by: Millis,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let mut ended = t.take_ended(ended_by, now).await?;
    // In id order, so the notifications' order does not hang on the backend's.
    ended.sort_unstable();
    let mut made = Vec::new();
    for id in ended {
        made.extend(reconcile(t, &id, now).await?);
        move_on(t, &id, now).await?;
    }
    made.sort_by_key(|r| r.seq);
    Ok(made)
}

/// Moves a silence that follows a schedule, its window reconciled, to the schedule's next
/// window: the one after the window's end, or after `now` when rounds were missed (a window
/// already begun is taken as it is, one wholly past is skipped). With none to come it stays
/// as it is, reconciled, and is pending until a change to its schedule places it again
/// (`App::replace_schedule`).
async fn move_on<T: SilenceTables>(t: &mut T, id: &str, now: Millis) -> Result<()> {
    let Some((schedule, ended)) = t.follows(id).await? else {
        return Ok(());
    };
    if let Some((starts_at, ends_at)) = silence::window_after(&schedule, ended.max(now)) {
        t.move_window(id, starts_at, ends_at).await?;
    }
    Ok(())
}

/// Reconciles silence `id`: each pair it kept something from, that no other active
/// silence holds, gets one notification if its client's view is wrong.
async fn reconcile<T: SilenceTables>(
    t: &mut T,
    id: &str,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let pairs = t.take_pairs(id, now).await?;
    // A site still down whose loss the silence kept from a client: one site loss for it,
    // not a loss per sensor; the sensors it names are up to date then.
    let mut retold: Vec<SiteRetold> = Vec::new();
    let mut asked = HashSet::new();
    for p in &pairs {
        if let Some(site) = t.site_of(p.sensor_id).await?
            && asked.insert((p.client_id.clone(), site.clone()))
            && let Some(r) = t.retell_site(&site, &p.client_id, now).await?
        {
            retold.push(r);
        }
    }
    let mut made: Vec<NotificationRef> = retold.iter().map(|r| r.made.clone()).collect();
    for p in pairs {
        let named = retold
            .iter()
            .any(|r| r.client == p.client_id && r.named.contains(&p.sensor_id));
        if named {
            continue;
        }
        if let Some(r) = bring_up_to_date(t, &p, now).await? {
            made.push(r);
        }
    }
    // Once the other pairs are reconciled: until then the site's return is not yet this
    // client's to tell.
    for r in &retold {
        t.site_told(r).await?;
    }
    Ok(made)
}

/// The notification that brings a pair's client's view of its sensor up to date, made
/// pending, if it is linked, wants that type, and its view is wrong.
async fn bring_up_to_date<T: SilenceTables>(
    t: &mut T,
    p: &Pair,
    now: Millis,
) -> Result<Option<NotificationRef>> {
    let (client, sensor) = (p.client_id.as_str(), p.sensor_id);
    // What its site holds of the sensor and will tell this client: the site's decision
    // brings its view up to date (a return with the data at release), and a notification
    // here would tell the same loss or return twice, with different ids (issue #68).
    if t.site_will_tell(client, sensor).await? {
        return Ok(None);
    }
    let seen = t.view(client, sensor, p.since).await?.or(p.before);
    let told = t.told_by_site(client, sensor).await?;
    let Some(l) = t.linked(client, sensor).await? else {
        return Ok(None);
    };
    let view = silence::told_by_site(seen.unwrap_or(View::unseen(l.data)), told);
    let Some((kind, data, previous)) = silence::reconcile(view, l.connection, l.data) else {
        return Ok(None);
    };
    if !wants(&l.events, kind) {
        return Ok(None);
    }
    let e = Event {
        sensor_id: sensor,
        kind,
        at: now,
        data,
        previous,
        last_seen_at: l.last_seen_at,
        detail: Detail::default(),
    };
    let made = t.insert_one(client, &e, now).await?;
    if kind == EventKind::StateChanged {
        // A newer state, as a commit's: the lane's older pending states no attempt holds
        // are superseded (book: Supersede).
        let newer = Newer {
            sensor,
            client: Some(client),
            seq: made.seq,
        };
        t.supersede(&[newer], now).await?;
    }
    Ok(Some(made))
}
