//! Notifications to broker destinations: a client whose `url` names an MQTT topic or an
//! AMQP exchange gets each notification published there instead of POSTed. Everything
//! around the attempt is the outbox's as for a webhook (claims, lanes, retries, supersede,
//! dead letters, rate limits, disabling); this module makes one attempt and says what the
//! broker answered.
//!
//! **One connection per broker** (host, port, login and, for AMQP, vhost), shared by every
//! client naming it, kept by a link task that reconnects with a growing delay. An attempt
//! takes the link's connection as it is: up, it publishes; down (or retrying after a
//! failure), it fails at once with the last connection error, so a dead broker costs its
//! clients' attempts nothing but their retries, and holds up no webhook or other broker;
//! connecting for the first time (or again right after losing a working connection), it
//! waits within its timeout. A connection is never resumed: what was in flight when it
//! dropped failed (its attempt is retried, same `webhook-id`), and the next connection
//! starts clean, so nothing of an old one is resent behind a newer notification.
//!
//! **The guard applies**: a link resolves its host through [`Guard::resolve`] and
//! connects to an allowed address, each time it connects. A refused host fails attempts as
//! `destination_not_allowed`, without retries, like a webhook's.
//!
//! **Credentials** live in the client's URL and in the key of its link, never in a log
//! line or an attempt's error ([`Broker`]'s `Display` and `Debug` leave the password out).
//! A link idle for [`IDLE`] closes, so a URL changed or deleted leaves no connection open.
//!
//! **A sink is one file**: its scheme, URL shape, parsing, connection and publishing are
//! its [`Protocol`] implementation, registered once in [`SINKS`], which the API's URL
//! check and pattern ([`super::destination`]) and the attempts both read.

mod amqp;
mod mqtt;
mod url;

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::attempt::{self, AttemptResult, REFUSED};
use super::guard::{self, Guard, ResolveError};
use crate::domain::destination::Shape;
use crate::domain::{Millis, Sendable};
pub use url::{Broker, PLACEHOLDERS, Template};

/// A link with nothing in flight and no attempt for this long closes.
const IDLE: Duration = Duration::from_secs(300);
/// First delay before connecting again after a failure; doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Why an attempt to a broker failed. Its `Display` is the attempt's recorded error.
#[derive(Debug, Clone)]
enum Failure {
    /// The guard refuses the broker's address (or plaintext under `https_only`).
    NotAllowed(guard::Refusal),
    /// The broker answered no: a refused login, a negative acknowledgement, a return.
    Refused(String),
    /// No connection: it could not be made, or it was lost with the attempt in flight.
    Connection(String),
    /// No answer within the delivery timeout; `.0` names what was waited for.
    Timeout(&'static str),
    /// Nothing could be sent: the client's URL or secret cannot be used.
    Unusable(String),
}

impl Failure {
    /// What the retry policy and the metrics read of it.
    fn kind(&self) -> attempt::Failure {
        match self {
            Failure::NotAllowed(_) => attempt::Failure::NotAllowed,
            Failure::Refused(_) => attempt::Failure::BrokerRefused,
            Failure::Connection(_) => attempt::Failure::Connection,
            Failure::Timeout(_) => attempt::Failure::Timeout,
            Failure::Unusable(_) => attempt::Failure::Unusable,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NotAllowed(r) => write!(f, "{}: {r}", guard::NOT_ALLOWED),
            Failure::Refused(why) => write!(f, "{REFUSED}: {why}"),
            Failure::Connection(why) => write!(f, "connection failed: {why}"),
            Failure::Timeout(what) => write!(f, "timed out waiting for {what}"),
            Failure::Unusable(why) => f.write_str(why),
        }
    }
}

/// One notification as a broker message: the body a webhook would get and its Standard
/// Webhooks headers (MQTT 5 user properties, AMQP headers).
struct Message {
    id: String,
    timestamp: i64,
    signature: String,
    body: Vec<u8>,
}

/// Why a connection ended, told once to whoever waits for it.
struct Lost {
    token: CancellationToken,
    why: Mutex<Option<Failure>>,
}

impl Lost {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            token: CancellationToken::new(),
            why: Mutex::new(None),
        })
    }

    /// The connection ended for `why` (the first report counts).
    fn report(&self, why: Failure) {
        self.why
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(why);
        self.token.cancel();
    }

    fn is_lost(&self) -> bool {
        self.token.is_cancelled()
    }

    fn why(&self) -> Failure {
        let why = self.why.lock().unwrap_or_else(|e| e.into_inner());
        why.clone()
            .unwrap_or_else(|| Failure::Connection("the connection closed".into()))
    }

    async fn wait(&self) -> Failure {
        self.token.cancelled().await;
        self.why()
    }
}

/// A link's connection as attempts see it.
enum State<C> {
    /// Connecting. `Some`: again after that failure, so attempts fail at once with it
    /// rather than wait on a broker that is likely still down.
    Connecting(Option<Failure>),
    Up(C),
    /// Waiting before the next try, after this failure.
    Down(Failure),
    /// Closed for good (idle, or latch stopping).
    Closed,
}

/// What a link needs of a protocol.
trait Protocol: Sized + Send + Sync + 'static {
    /// The URL scheme that names this sink.
    const SCHEME: &'static str;
    /// The port a URL that gives none connects to.
    const DEFAULT_PORT: u16;
    /// Its URLs' shape as a regular expression without anchors: one alternative of the
    /// API's published URL pattern, which takes exactly what [`Protocol::parse`] takes (a
    /// unit test holds the two to the same verdicts).
    const URL: &'static str;
    /// Its URLs' shape in words, for an error.
    const FORM: &'static str;
    /// A short example, for the error naming every accepted scheme.
    const EXAMPLE: &'static str;
    /// Where in the broker a notification goes (a topic; an exchange and a routing key).
    type Target: Send + Sync;
    type Conn: Clone + Send + Sync + 'static;
    /// [`Protocol::URL`] anchored and compiled.
    fn shape() -> &'static Shape;
    /// Reads a URL after its `scheme://`; the error says what is wrong, in words.
    fn parse(rest: &str) -> Result<(Broker, Self::Target), String>;
    /// Publishes `msg` about `sensor`'s event `kind` to `target` and waits until
    /// `deadline` for the broker to take it.
    fn publish(
        conn: &Self::Conn,
        target: &Self::Target,
        sensor: &str,
        kind: &str,
        msg: Message,
        deadline: Instant,
    ) -> impl Future<Output = Result<(), Failure>> + Send;
    /// Opens a connection to `addr`, an address the guard allowed for `broker`'s host.
    fn connect(
        broker: &Broker,
        addr: SocketAddr,
        timeout: Duration,
    ) -> impl Future<Output = Result<Self::Conn, Failure>> + Send;
    /// Resolves when the connection is lost, with why.
    fn lost(conn: &Self::Conn) -> impl Future<Output = Failure> + Send;
    /// Closes the connection (latch stopping, or the link idle).
    fn close(conn: Self::Conn) -> impl Future<Output = ()> + Send;
}

/// One broker's connection, kept by its link task ([`run`]).
struct Link<P: Protocol> {
    broker: Broker,
    state: watch::Sender<State<P::Conn>>,
    /// Attempts using the link now; it closes only when none are.
    inflight: AtomicUsize,
    last_used: Mutex<Instant>,
}

/// An attempt's hold on a link: counted in flight until dropped.
struct Use<P: Protocol>(Arc<Link<P>>);

impl<P: Protocol> Drop for Use<P> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<P: Protocol> Link<P> {
    /// The connection once it is up; a failure at once when it is down, or when it does
    /// not come up before `deadline`.
    async fn ready(&self, deadline: Instant) -> Result<P::Conn, Failure> {
        let mut rx = self.state.subscribe();
        loop {
            match &*rx.borrow_and_update() {
                State::Up(c) => return Ok(c.clone()),
                State::Down(f) | State::Connecting(Some(f)) => return Err(f.clone()),
                State::Closed => return Err(Failure::Connection("latch is stopping".into())),
                State::Connecting(None) => {}
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Failure::Connection("the link closed".into())),
                Err(_) => {
                    return Err(Failure::Connection(
                        "the broker did not accept a connection within the attempt's timeout"
                            .into(),
                    ));
                }
            }
        }
    }
}

/// A registered sink, its protocol's functions behind pointers: what the URL check and an
/// attempt look up by scheme.
struct Sink {
    scheme: &'static str,
    url: &'static str,
    example: &'static str,
    check: fn(&str) -> Result<(), String>,
    publish: for<'a> fn(&'a Brokers, &'a str, Out<'a>) -> BoxFuture<'a, Result<(), Failure>>,
}

/// What an attempt publishes, whatever the sink.
struct Out<'a> {
    sensor: &'a str,
    kind: &'a str,
    msg: Message,
    deadline: Instant,
}

impl Sink {
    const fn of<P: Protocol>() -> Self {
        Sink {
            scheme: P::SCHEME,
            url: P::URL,
            example: P::EXAMPLE,
            check: check::<P>,
            publish: publish_to::<P>,
        }
    }
}

/// Every broker destination latch publishes to: the one place a sink is registered.
const SINKS: &[Sink] = &[Sink::of::<mqtt::Mqtt>(), Sink::of::<amqp::Amqp>()];

fn sink(scheme: &str) -> Option<&'static Sink> {
    SINKS.iter().find(|s| s.scheme.eq_ignore_ascii_case(scheme))
}

/// Reads a `P` URL whole: the parser's verdict in words, then its published shape.
fn check<P: Protocol>(url: &str) -> Result<(), String> {
    let (_, rest) = url.split_once("://").expect("checked by the caller");
    P::parse(rest)?;
    if !P::shape().matches(url) {
        return Err(format!(
            "url is not a valid {} destination: {}",
            P::SCHEME,
            P::FORM
        ));
    }
    Ok(())
}

fn publish_to<'a, P: Protocol>(
    brokers: &'a Brokers,
    rest: &'a str,
    out: Out<'a>,
) -> BoxFuture<'a, Result<(), Failure>> {
    Box::pin(async move {
        let (broker, target) =
            P::parse(rest).map_err(|e| Failure::Unusable(format!("url unusable: {e}")))?;
        let link = brokers.link::<P>(&broker);
        let conn = link.0.ready(out.deadline).await?;
        P::publish(&conn, &target, out.sensor, out.kind, out.msg, out.deadline).await
    })
}

/// The broker part of a client URL's check: `Some` when `scheme` names a sink (or its
/// TLS variant, refused with a message saying so), with the verdict.
pub(crate) fn check_url(scheme: &str, url: &str) -> Option<Result<(), String>> {
    if let Some(s) = sink(scheme) {
        return Some((s.check)(url));
    }
    let plain = scheme.strip_suffix(['s', 'S']).and_then(sink)?;
    Some(Err(format!(
        "url: {scheme}:// (TLS) is not supported by this build; use {}:// on a trusted \
         network or through a TLS tunnel",
        plain.scheme
    )))
}

/// The sinks' URL shapes, unanchored, as alternatives of one pattern.
pub(crate) fn url_alternatives() -> impl Iterator<Item = &'static str> {
    SINKS.iter().map(|s| s.url)
}

/// The sinks' examples (`mqtt://host/topic`), for an error naming what is accepted.
pub(crate) fn examples() -> impl Iterator<Item = &'static str> {
    SINKS.iter().map(|s| s.example)
}

/// Every link, by broker (whose scheme tells the sinks apart): each a `Link<P>` of its
/// broker's sink.
type Links = Mutex<HashMap<Broker, Arc<dyn Any + Send + Sync>>>;

/// Every broker link of the dispatcher; cheap to clone.
#[derive(Clone)]
pub struct Brokers {
    inner: Arc<Inner>,
}

struct Inner {
    links: Links,
    guard: Arc<Guard>,
    /// A connection attempt's limit (the delivery timeout).
    timeout: Duration,
    /// Latch stopping: links let their attempts finish (within `grace`), then close.
    stop: CancellationToken,
    grace: Duration,
    tracker: TaskTracker,
}

impl Brokers {
    pub fn new(
        guard: Arc<Guard>,
        timeout: Duration,
        stop: CancellationToken,
        grace: Duration,
        tracker: TaskTracker,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                links: Mutex::default(),
                guard,
                timeout,
                stop,
                grace,
                tracker,
            }),
        }
    }

    /// Publishes one notification to the broker destination `s.url` names. Never fails:
    /// every problem is an attempt result, as [`super::sender::send`]'s are.
    pub async fn send(&self, s: &Sendable, timeout: Duration, at: Millis) -> AttemptResult {
        let started = Instant::now();
        match self.publish(s, timeout, at).await {
            Ok(()) => AttemptResult::acknowledged(at, started.elapsed()),
            Err(f) => AttemptResult::failed(at, f.kind(), f.to_string(), started.elapsed()),
        }
    }

    async fn publish(&self, s: &Sendable, timeout: Duration, at: Millis) -> Result<(), Failure> {
        let deadline = Instant::now() + timeout;
        let (scheme, rest) = s.url.split_once("://").unwrap_or_default();
        let sink = sink(scheme).ok_or_else(|| {
            Failure::Unusable(format!(
                "url unusable: no broker destination is {scheme}://"
            ))
        })?;
        if self.inner.guard.https_only() {
            return Err(Failure::NotAllowed(guard::Refusal::NotHttps));
        }
        let body = attempt::payload(s);
        let timestamp = at / 1000;
        let signature = attempt::signatures(
            &s.secret,
            s.previous_secret.as_deref(),
            &s.notification.id,
            timestamp,
            &body,
        )
        .map_err(|e| Failure::Unusable(format!("client secret unusable: {e}")))?;
        let msg = Message {
            id: s.notification.id.clone(),
            timestamp,
            signature,
            body,
        };
        let sensor = s.notification.sensor_id.to_string();
        let out = Out {
            sensor: &sensor,
            kind: s.notification.kind.as_str(),
            msg,
            deadline,
        };
        (sink.publish)(self, rest, out).await
    }

    /// The broker's link, started on first use; held in flight until the result is in.
    fn link<P: Protocol>(&self, broker: &Broker) -> Use<P> {
        let mut map = self.inner.links.lock().unwrap_or_else(|e| e.into_inner());
        let any = map
            .entry(broker.clone())
            .or_insert_with(|| {
                let link = Arc::new(Link::<P> {
                    broker: broker.clone(),
                    state: watch::channel(State::Connecting(None)).0,
                    inflight: AtomicUsize::new(0),
                    last_used: Mutex::new(Instant::now()),
                });
                self.inner
                    .tracker
                    .spawn(run::<P>(self.inner.clone(), link.clone()));
                link
            })
            .clone();
        let link: Arc<Link<P>> = any
            .downcast()
            .expect("a broker's scheme names its sink, whose links are of its protocol");
        // Under the map's lock, which the idle check takes too: a link found here is not
        // closed as idle under this attempt.
        link.inflight.fetch_add(1, Ordering::SeqCst);
        *link.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        Use(link)
    }
}

/// A link's life: connect (to an address the guard allows), serve until the connection
/// is lost, connect again after a growing delay; close when idle or when latch stops.
async fn run<P: Protocol>(inner: Arc<Inner>, link: Arc<Link<P>>) {
    let broker = &link.broker;
    let mut backoff = Duration::ZERO;
    let mut check = tokio::time::interval(IDLE / 10);
    loop {
        let conn = tokio::select! {
            biased;
            _ = inner.stop.cancelled() => break,
            c = connect::<P>(&inner, broker) => c,
        };
        match conn {
            Ok(conn) => {
                tracing::info!(broker = %broker, "Connected to a broker destination.");
                backoff = Duration::ZERO;
                link.state.send_replace(State::Up(conn.clone()));
                let why = loop {
                    tokio::select! {
                        biased;
                        _ = inner.stop.cancelled() => break None,
                        why = P::lost(&conn) => break Some(why),
                        _ = check.tick() => if idle(&inner, &link) { break None },
                    }
                };
                let Some(why) = why else {
                    close::<P>(&inner, &link, conn).await;
                    return;
                };
                tracing::warn!(broker = %broker, error = %why, "Lost a broker destination's connection; reconnecting.");
                // Straight away, and attempts wait for it: a broker restart or a dropped
                // connection usually takes one try.
                link.state.send_replace(State::Connecting(None));
            }
            Err(failure) => {
                backoff = (backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
                tracing::warn!(broker = %broker, error = %failure, retry_in = ?backoff, "Cannot connect to a broker destination.");
                link.state.send_replace(State::Down(failure.clone()));
                let wake = Instant::now() + backoff;
                loop {
                    tokio::select! {
                        biased;
                        _ = inner.stop.cancelled() => {
                            link.state.send_replace(State::Closed);
                            return;
                        }
                        _ = check.tick() => if idle(&inner, &link) {
                            link.state.send_replace(State::Closed);
                            return;
                        },
                        _ = tokio::time::sleep_until(wake) => break,
                    }
                }
                link.state.send_replace(State::Connecting(Some(failure)));
            }
        }
    }
    link.state.send_replace(State::Closed);
}

/// Resolves the host through the guard and connects to the first allowed address that
/// takes the connection.
async fn connect<P: Protocol>(inner: &Inner, broker: &Broker) -> Result<P::Conn, Failure> {
    let addrs = tokio::time::timeout(
        inner.timeout,
        inner.guard.resolve(&broker.host, broker.port),
    )
    .await
    .map_err(|_| Failure::Timeout("the broker's name to resolve"))?
    .map_err(|e| match e {
        ResolveError::Refused(r) => Failure::NotAllowed(r),
        e @ ResolveError::Lookup { .. } => Failure::Connection(e.to_string()),
    })?;
    let mut last = Failure::Connection(format!("{} has no address", broker.host));
    for addr in addrs {
        match P::connect(broker, addr, inner.timeout).await {
            Ok(conn) => return Ok(conn),
            Err(f) => last = f,
        }
    }
    Err(last)
}

/// Whether the link has been unused for [`IDLE`]; if so it leaves the map (under the
/// map's lock, so no attempt takes it meanwhile).
fn idle<P: Protocol>(inner: &Inner, link: &Arc<Link<P>>) -> bool {
    let mut map = inner.links.lock().unwrap_or_else(|e| e.into_inner());
    let unused = link
        .last_used
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .elapsed();
    if link.inflight.load(Ordering::SeqCst) > 0 || unused < IDLE {
        return false;
    }
    map.remove(&link.broker);
    link.state.send_replace(State::Closed);
    true
}

/// Closes the connection once the attempts on it are done (latch stopping: within the
/// shutdown grace).
async fn close<P: Protocol>(inner: &Inner, link: &Link<P>, conn: P::Conn) {
    let deadline = Instant::now() + inner.grace;
    while link.inflight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    link.state.send_replace(State::Closed);
    P::close(conn).await;
    tracing::info!(broker = %link.broker, "Closed a broker destination's connection.");
}

/// A broker's reason code or name in words: `BadUserNamePassword` → `bad user name
/// password`.
fn words(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.extend(c.to_lowercase());
    }
    out
}

#[cfg(test)]
mod parse_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_as_the_attempts_error() {
        assert_eq!(
            Failure::Refused("PUBACK not authorized".into()).to_string(),
            "refused by the broker: PUBACK not authorized"
        );
        assert!(
            Failure::Timeout("the broker's PUBACK")
                .to_string()
                .contains("timed out")
        );
        assert!(
            Failure::NotAllowed(guard::Refusal::NotHttps)
                .to_string()
                .starts_with(guard::NOT_ALLOWED)
        );
        assert_eq!(words("BadUserNamePassword"), "bad user name password");
    }
}
