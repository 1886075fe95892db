//! A loopback TCP proxy between latch and a real service that interferes at one message of
//! the protocol latch speaks, the moment latch sends it: the connection cut just before
//! latch's AMQP `basic.ack` reaches RabbitMQ (the readings committed, the broker never
//! hears it), PostgreSQL's `COMMIT` held back until the test lets it go (the transaction
//! open on the server, its outcome unknown to latch), or the server's answer to it held
//! (committed, and latch does not know). Everything else passes unchanged, both ways; each
//! interference is armed for one message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The protocol the client speaks, and the message the proxy looks for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// AMQP 0-9-1: a `basic.ack` (class 60, method 80) of any channel. Cut: the connection
    /// closes both ways without it.
    AmqpAck,
    /// PostgreSQL: a simple query `COMMIT` (how tokio-postgres ends a transaction). Held:
    /// not passed on until [`Proxy::release`].
    PgCommit,
    /// PostgreSQL: a `COMMIT` passed on, and what the server answers on that connection
    /// from then on held until [`Proxy::release`].
    PgCommitAnswer,
}

pub struct Proxy {
    /// `host:port` to give latch in place of the service's.
    pub addr: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    target: Target,
    armed: AtomicBool,
    /// When set, only a target on a connection whose messages since its last target
    /// contained these bytes counts (PostgreSQL: the `COMMIT` of a transaction that wrote
    /// a given sensor, whose id travels in its statements' parameters).
    needle: std::sync::Mutex<Option<Vec<u8>>>,
    /// How many times the target was met while armed.
    hits: watch::Sender<usize>,
    /// Set by [`Proxy::release`]: a held message goes on.
    released: watch::Sender<bool>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`), not armed.
    pub async fn start(upstream: String, target: Target) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shared = Arc::new(Shared {
            target,
            armed: AtomicBool::new(false),
            needle: std::sync::Mutex::new(None),
            hits: watch::Sender::new(0),
            released: watch::Sender::new(false),
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let cut = Cut::default();
                let hold = Arc::new(AtomicBool::new(false));
                tokio::spawn(inspect(cr, sw, s.clone(), cut.clone(), hold.clone()));
                tokio::spawn(pass(sr, cw, cut, s.clone(), hold));
            }
        });
        Self { addr, shared, task }
    }

    /// The next target message (of any connection) is cut or held.
    pub fn arm(&self) {
        self.arm_with(None);
    }

    /// As [`Proxy::arm`], for the next target on a connection whose open transaction sent
    /// `needle` since the proxy was armed.
    pub fn arm_for(&self, needle: &str) {
        self.arm_with(Some(needle.as_bytes().to_vec()));
    }

    fn arm_with(&self, needle: Option<Vec<u8>>) {
        // The needle before the arming: armed without it, any target would count.
        *self.shared.needle.lock().unwrap() = needle;
        self.shared.released.send_replace(false);
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until the target was met `n` times in all (a minute at most: a target that
    /// never comes fails the test rather than hanging it).
    pub async fn hit(&self, n: usize) {
        let mut hits = self.shared.hits.subscribe();
        tokio::time::timeout(Duration::from_secs(60), hits.wait_for(|h| *h >= n))
            .await
            .unwrap_or_else(|_| panic!("the proxy's target was not met {n} times in a minute"))
            .unwrap();
    }

    /// Lets a held message go on.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }
}

/// Cuts one proxied connection, both ways.
#[derive(Clone, Default)]
struct Cut(Arc<tokio::sync::Notify>, Arc<AtomicBool>);

impl Cut {
    fn cancel(&self) {
        self.1.store(true, Ordering::SeqCst);
        self.0.notify_waiters();
    }

    async fn cancelled(&self) {
        let notified = self.0.notified();
        if !self.1.load(Ordering::SeqCst) {
            notified.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Passes bytes from the service to the client until either side closes or the
/// connection is cut; while `hold` is set, holds them until released.
async fn pass(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    cut: Cut,
    shared: Arc<Shared>,
    hold: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            _ = cut.cancelled() => return,
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
        };
        if hold.load(Ordering::SeqCst) {
            let mut released = shared.released.subscribe();
            if released.wait_for(|r| *r).await.is_err() {
                return;
            }
            hold.store(false, Ordering::SeqCst);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Passes the client's bytes to the service message by message, looking for the target.
async fn inspect(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    cut: Cut,
    hold: Arc<AtomicBool>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    // Whether the client's opening (AMQP's protocol header; PostgreSQL's untyped startup
    // messages) is still to pass before the first framed message.
    let mut opening = true;
    // Whether this connection sent the needle in the transaction it has open, since the
    // proxy was armed. A query outside a transaction (a pooled connection's read of the
    // same sensor) or before arming does not count: the `COMMIT` it would pick out is
    // another transaction's.
    let mut mentioned = false;
    let mut in_transaction = false;
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some(len) = next_message(shared.target, &buf, &mut opening) {
            let message: Vec<u8> = buf.drain(..len).collect();
            // No opening message is a target: neither starts with a frame or query type.
            let needle = shared.needle.lock().unwrap().clone();
            if begins(shared.target, &message) {
                in_transaction = true;
                mentioned = false;
            }
            if let Some(n) = &needle
                && in_transaction
                && shared.armed.load(Ordering::SeqCst)
            {
                mentioned |= message.windows(n.len()).any(|w| w == n.as_slice());
            }
            let is_target = matches(shared.target, &message) && (needle.is_none() || mentioned);
            if matches(shared.target, &message) {
                mentioned = false;
                in_transaction = false;
            }
            if is_target && shared.armed.swap(false, Ordering::SeqCst) {
                shared.hits.send_modify(|h| *h += 1);
                match shared.target {
                    Target::AmqpAck => {
                        // Both ways, at once: the service never gets it.
                        cut.cancel();
                        return;
                    }
                    Target::PgCommit => {
                        let mut released = shared.released.subscribe();
                        if released.wait_for(|r| *r).await.is_err() {
                            return;
                        }
                    }
                    // Before the server can answer it.
                    Target::PgCommitAnswer => hold.store(true, Ordering::SeqCst),
                }
            }
            if to.write_all(&message).await.is_err() {
                cut.cancel();
                return;
            }
        }
    }
    let _ = to.shutdown().await;
}

/// The length of the complete message at the start of `buf`, if it is all there.
fn next_message(target: Target, buf: &[u8], opening: &mut bool) -> Option<usize> {
    match target {
        Target::AmqpAck => {
            if *opening {
                // The protocol header, "AMQP" 0 0 9 1: passed as a message of its own.
                if buf.len() < 8 {
                    return None;
                }
                *opening = false;
                return Some(8);
            }
            // type(1) channel(2) size(4) payload(size) frame-end(1)
            let size = u32::from_be_bytes(buf.get(3..7)?.try_into().ok()?) as usize;
            let len = 7 + size + 1;
            (buf.len() >= len).then_some(len)
        }
        Target::PgCommit | Target::PgCommitAnswer => {
            if *opening {
                // Untyped: length(4, itself included) then the body. An SSLRequest
                // (code 80877103) is followed by the startup message, also untyped.
                let len = u32::from_be_bytes(buf.get(0..4)?.try_into().ok()?) as usize;
                if buf.len() < len {
                    return None;
                }
                let ssl = len == 8 && buf[4..8] == 80_877_103u32.to_be_bytes();
                if !ssl {
                    *opening = false;
                }
                return Some(len);
            }
            // type(1) length(4, itself included) body
            let len = u32::from_be_bytes(buf.get(1..5)?.try_into().ok()?) as usize + 1;
            (buf.len() >= len).then_some(len)
        }
    }
}

/// Whether a whole framed message opens a transaction (PostgreSQL: a simple query
/// `START TRANSACTION`, as tokio-postgres sends it, or `BEGIN`); never for AMQP.
fn begins(target: Target, m: &[u8]) -> bool {
    match target {
        Target::AmqpAck => false,
        Target::PgCommit | Target::PgCommitAnswer => simple_query(m).is_some_and(|q| {
            let q = q.to_ascii_uppercase();
            q.starts_with("START TRANSACTION") || q.starts_with("BEGIN")
        }),
    }
}

/// The text of a PostgreSQL simple query message.
fn simple_query(m: &[u8]) -> Option<&str> {
    if m[0] != b'Q' {
        return None;
    }
    Some(
        std::str::from_utf8(&m[5..])
            .ok()?
            .trim_end_matches('\0')
            .trim(),
    )
}

/// Whether a whole framed message is the target.
fn matches(target: Target, m: &[u8]) -> bool {
    match target {
        // A method frame (type 1) of class 60 (basic), method 80 (ack).
        Target::AmqpAck => m[0] == 1 && m.get(7..11) == Some(&[0, 60, 0, 80]),
        // A simple query whose text is COMMIT.
        Target::PgCommit | Target::PgCommitAnswer => {
            simple_query(m).is_some_and(|q| q.eq_ignore_ascii_case("COMMIT"))
        }
    }
}
