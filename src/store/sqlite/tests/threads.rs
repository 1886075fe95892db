//! The store's own threads: every call runs on them, and a call that panics fails alone.

use super::*;

/// Every call runs on the store's own threads, never on Tokio's blocking pool, whose
/// threads (each with allocator pages of its own) came and went with the calls' bursts.
#[tokio::test]
async fn calls_run_on_the_store_s_own_threads() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let name = || Ok(std::thread::current().name().map(String::from));
    let read = store.read(move |_| name()).await.unwrap();
    let write = store.write(move |_| name()).await.unwrap();
    let archive = store.write_archive(move |_| name()).await.unwrap();
    assert!(read.is_some_and(|n| n.starts_with("latch-store-reader-")));
    assert_eq!(write.as_deref(), Some("latch-store-writer"));
    assert_eq!(archive.as_deref(), Some("latch-store-archive"));
}

/// A call that panics fails alone: its thread goes on, and the readers still serve
/// [`READERS`] calls at once.
#[tokio::test]
async fn a_call_that_panics_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    for _ in 0..READERS {
        let failed = store.read(|_| -> Result<()> { panic!("on purpose") }).await;
        assert!(matches!(failed, Err(Error::Backend(_))), "{failed:?}");
    }
    let all_at_once = Arc::new(std::sync::Barrier::new(READERS));
    let calls = (0..READERS).map(|_| {
        let all_at_once = all_at_once.clone();
        store.read(move |_| {
            all_at_once.wait();
            Ok(())
        })
    });
    let served = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        futures::future::join_all(calls),
    )
    .await
    .expect("every reader thread serves");
    assert!(served.iter().all(|r| r.is_ok()));
}
