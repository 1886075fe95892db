//! A lingering close, as nginx does it: a request whose body the handler did not read to
//! the end (refused as too large, or before its token was checked) has the rest read and
//! thrown away, up to a bound, while the answer goes out. Closing with unread bytes makes
//! the kernel reset the connection, and a client still sending then sees a broken pipe or
//! a reset instead of latch's 413 or 401.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// Most bytes read and thrown away after the answer: four times the largest body latch
/// takes, so a client a little past the limit reads its 413, while a client sending
/// gigabytes is cut off.
pub const LINGER_BYTES: usize = 4 * crate::ingest::http::MAX_READINGS_BODY_BYTES;

/// Longest a connection lingers, however slowly its client sends (nginx's `lingering_time`
/// is 30 s; its `lingering_timeout` between reads, 5 s).
pub const LINGER_TIME: Duration = Duration::from_secs(10);

/// Middleware: every request's body becomes a [`Lingering`] one.
pub async fn lingering(req: Request, next: Next) -> Response {
    next.run(req.map(|body| Body::new(Lingering::new(body))))
        .await
}

/// A request body that, dropped before its end, drains the rest in a task of its own.
pub struct Lingering {
    inner: Option<Body>,
}

impl Lingering {
    pub fn new(body: Body) -> Self {
        Self { inner: Some(body) }
    }
}

impl HttpBody for Lingering {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        match self.inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(body) = self.inner.take() else {
            return;
        };
        if body.is_end_stream() {
            return;
        }
        // Outside a runtime (a test dropping a request by hand) there is nothing to serve.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(drain(body));
        }
    }
}

/// Reads and drops the rest of `body`, up to [`LINGER_BYTES`] and [`LINGER_TIME`]; then
/// the connection closes (or, read to the end, stays open for the next request).
async fn drain(body: Body) {
    use futures::StreamExt as _;
    let mut stream = body.into_data_stream();
    let _ = tokio::time::timeout(LINGER_TIME, async {
        let mut read = 0;
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > LINGER_BYTES {
                break;
            }
        }
    })
    .await;
}
