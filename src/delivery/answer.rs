//! Reading what a remote answered, bounded in bytes as well as in time. A token endpoint or
//! a receiver belongs to a third party: one that streams gigabytes must cost latch a
//! bounded buffer, not the node's memory (and with it ingest and every other client).

use std::time::Duration;

/// Most bytes of a token endpoint's answer read: a token answer is a few hundred bytes;
/// one larger than this fails the fetch.
pub(super) const TOKEN_ANSWER_MAX: usize = 64 * 1024;

/// Most bytes of a webhook's answer read after its status: only so that the connection
/// can be used again when the answer is short; a longer one is left unread (its
/// connection is closed rather than kept).
pub(super) const DRAIN_MAX: usize = 64 * 1024;

/// How long a webhook's answer is drained at most.
pub(super) const DRAIN_TIME: Duration = Duration::from_millis(200);

/// The body of `answer` when it holds at most `max` bytes; `Ok(None)` as soon as it is
/// longer (what came so far is dropped).
pub(super) async fn read_at_most(
    mut answer: reqwest::Response,
    max: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if answer.content_length().is_some_and(|n| n > max as u64) {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await? {
        if body.len() + chunk.len() > max {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// Reads and drops up to [`DRAIN_MAX`] bytes of `answer` within [`DRAIN_TIME`]; answers how
/// many it read.
pub(super) async fn drain(mut answer: reqwest::Response) -> usize {
    let mut read = 0;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while read < DRAIN_MAX {
            match answer.chunk().await {
                Ok(Some(chunk)) => read += chunk.len(),
                _ => break,
            }
        }
    })
    .await;
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on loopback whose every answer is 200 with a body of `size` bytes, or an
    /// endless one when `None`.
    async fn serving(size: Option<usize>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = sock.read(&mut buf).await;
                    let head = match size {
                        Some(n) => format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\n\r\n"),
                        None => "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".into(),
                    };
                    if sock.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let block = vec![b'x'; 8192];
                    let mut sent = 0;
                    loop {
                        let n = size.map_or(block.len(), |s| (s - sent).min(block.len()));
                        if n == 0 {
                            return;
                        }
                        let frame = match size {
                            Some(_) => block[..n].to_vec(),
                            None => {
                                [format!("{n:x}\r\n").as_bytes(), &block[..n], b"\r\n"].concat()
                            }
                        };
                        if sock.write_all(&frame).await.is_err() {
                            return;
                        }
                        sent += n;
                    }
                });
            }
        });
        format!("http://{addr}/")
    }

    #[tokio::test]
    async fn an_answer_past_the_cap_is_not_read_whole() {
        let http = reqwest::Client::new();
        let small = serving(Some(100)).await;
        let r = http.get(&small).send().await.unwrap();
        assert_eq!(
            read_at_most(r, 1000).await.unwrap().map(|b| b.len()),
            Some(100)
        );
        for size in [Some(TOKEN_ANSWER_MAX + 1), None] {
            let url = serving(size).await;
            let r = http.get(&url).send().await.unwrap();
            assert_eq!(read_at_most(r, TOKEN_ANSWER_MAX).await.unwrap(), None);
        }
        let endless = serving(None).await;
        let r = http.get(&endless).send().await.unwrap();
        let read = drain(r).await;
        // The cap, and at most the one chunk that crossed it (hyper reads at most 400 KiB).
        assert!(read < DRAIN_MAX + 512 * 1024, "drained {read} bytes");
    }
}
