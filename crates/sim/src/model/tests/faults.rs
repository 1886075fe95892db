//! The fault hooks and the processes' gates: what each fault leaves in the store and what
//! the caller is told, and calls of a killed, frozen or slow node.

use std::sync::Mutex;

use async_trait::async_trait;
use latch::domain::Millis;
use latch::store::Error;
use latch::store::conformance::{change, client, sensor};
use latch::store::prelude::*;
use tokio::sync::Notify;

use super::*;
use crate::model::{Call, Fault, Faults, Life};

/// Faults by op, in turn; the `commit` calls wait for the clock to reach `slow_until`, and
/// their answers for `release` to be notified while `hold` is set.
#[derive(Default)]
struct Script {
    next: Mutex<Vec<(&'static str, Fault)>>,
    slow_until: Mutex<Option<(Clock, Millis)>>,
    hold: Mutex<bool>,
    release: Notify,
    seen: Mutex<Vec<Call>>,
}

#[async_trait]
impl Faults for Script {
    async fn before(&self, call: &Call) -> Fault {
        self.seen.lock().unwrap().push(call.clone());
        let slow = self.slow_until.lock().unwrap().clone();
        if let (Some((clock, until)), "commit") = (slow, call.op) {
            clock.sleep_until(until).await;
        }
        let mut next = self.next.lock().unwrap();
        match next.iter().position(|(op, _)| *op == call.op) {
            Some(i) => next.remove(i).1,
            None => Fault::None,
        }
    }

    async fn after(&self, call: &Call) {
        let held = *self.hold.lock().unwrap();
        if held && call.op == "commit" {
            self.release.notified().await;
        }
    }
}

/// A shared model scripted by `script`, with a sensor linked to a client.
async fn scripted(script: Arc<Script>) -> (ModelStore, Clock, Arc<NodeStore>) {
    let clock = Clock::manual(START);
    let model = ModelStore::new(Mode::Shared { partitions: 4 }, clock.clone(), script);
    let node = model.for_node("n1");
    node.create_sensor(sensor("f1")).await.unwrap();
    node.create_client(client("f-a", "http://a/"))
        .await
        .unwrap();
    node.link("f-a".into(), sid("f1"), 1).await.unwrap();
    (model, clock, node)
}

fn notifications(model: &ModelStore) -> usize {
    model.read(|t| t.notifications().count())
}

#[tokio::test]
async fn each_fault_says_what_was_written() {
    let script = Arc::new(Script::default());
    let (model, _, node) = scripted(script.clone()).await;
    *script.next.lock().unwrap() = vec![
        ("commit", Fault::Unavailable),
        ("commit", Fault::Full),
        ("commit", Fault::InDoubt { applied: false }),
        ("commit", Fault::InDoubt { applied: true }),
    ];
    let commit = || node.commit(change("f1", true, None, 10), 10);
    assert!(matches!(commit().await, Err(Error::Backend(_))));
    let full = commit().await;
    assert!(matches!(&full, Err(e) if e.is_full() && !e.maybe_written()));
    assert_eq!(notifications(&model), 0, "refused: nothing written");
    let lost = commit().await;
    assert!(matches!(&lost, Err(e) if e.maybe_written()));
    assert_eq!(notifications(&model), 0, "in doubt, and not applied");
    let landed = commit().await;
    assert!(matches!(&landed, Err(Error::Indeterminate(_))));
    assert_eq!(notifications(&model), 1, "in doubt, and applied");
    assert_eq!(commit().await.unwrap().len(), 1, "the faults were used up");
    let seen = script.seen.lock().unwrap();
    let commits: Vec<&Call> = seen.iter().filter(|c| c.op == "commit").collect();
    assert_eq!(commits.len(), 5);
    assert!(commits.iter().all(|c| c.writes && &*c.node == "n1"));
    assert!(seen.iter().any(|c| c.op == "get_sensor" || c.op == "link"));
}

#[tokio::test(start_paused = true)]
async fn a_killed_nodes_calls_never_end_and_the_others_go_on() {
    let (model, _, node) = scripted(Arc::new(Script::default())).await;
    let other = model.for_node("n2");
    node.kill();
    assert_eq!(node.life(), Life::Killed);
    let call = node.commit(change("f1", true, None, 10), 10);
    assert!(
        tokio::time::timeout(LONG, call).await.is_err(),
        "never answered"
    );
    assert_eq!(notifications(&model), 0, "nor applied");
    other
        .commit(change("f1", true, None, 10), 10)
        .await
        .unwrap();
    assert_eq!(notifications(&model), 1);
}

#[tokio::test(start_paused = true)]
async fn a_frozen_node_goes_on_once_thawed() {
    let (model, _, node) = scripted(Arc::new(Script::default())).await;
    node.freeze();
    let call = tokio::spawn({
        let node = node.clone();
        async move { node.commit(change("f1", true, None, 10), 10).await }
    });
    tokio::time::sleep(LONG).await;
    assert!(!call.is_finished());
    assert_eq!(notifications(&model), 0, "nothing done while stopped");
    node.thaw();
    assert_eq!(call.await.unwrap().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_slow_store_answers_when_the_clock_says() {
    let script = Arc::new(Script::default());
    let (model, clock, node) = scripted(script.clone()).await;
    *script.slow_until.lock().unwrap() = Some((clock.clone(), START + 5_000));
    let call = tokio::spawn({
        let node = node.clone();
        async move { node.commit(change("f1", true, None, 10), 10).await }
    });
    tokio::time::sleep(LONG).await;
    assert!(
        !call.is_finished(),
        "waits for the model's clock, not tokio's"
    );
    clock.advance(Duration::from_secs(5));
    assert_eq!(call.await.unwrap().unwrap().len(), 1);
    assert_eq!(notifications(&model), 1);
}

/// A commit applied whose answer is slow, and the process killed before it came: written,
/// never answered.
#[tokio::test(start_paused = true)]
async fn a_process_killed_before_its_answer_came_never_learns_it_landed() {
    let script = Arc::new(Script::default());
    let (model, _, node) = scripted(script.clone()).await;
    *script.hold.lock().unwrap() = true;
    let call = tokio::spawn({
        let node = node.clone();
        async move { node.commit(change("f1", true, None, 10), 10).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(notifications(&model), 1, "applied");
    assert!(!call.is_finished(), "its answer held back");
    node.kill();
    script.release.notify_waiters();
    tokio::time::sleep(LONG).await;
    assert!(!call.is_finished(), "a killed process gets no answer");
    call.abort();
}
