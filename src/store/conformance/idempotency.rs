//! `Idempotency-Key`s: taken once at a time, the answer kept for repeats, and what group
//! commits applied under a key read back by the next holder.

use super::*;

fn keyed(key: &str, positions: &[u32]) -> Keyed {
    Keyed {
        key: key.into(),
        positions: positions.to_vec(),
    }
}

pub(super) async fn a_key_is_held_once_and_its_answer_kept(s: &Subject) {
    let take = |fp: &str, now: Millis| s.take_key("k1".into(), fp.into(), now, now - 60_000);
    assert_eq!(
        take("fp", 100_000).await.unwrap(),
        Taken::Fresh { applied: vec![] }
    );
    // Held: a repeat waits, another request under the key is refused.
    assert_eq!(take("fp", 100_500).await.unwrap(), Taken::Busy);
    assert_eq!(take("other", 100_500).await.unwrap(), Taken::Mismatch);
    // A holder silent past the hold is taken over.
    assert_eq!(
        take("fp", 170_000).await.unwrap(),
        Taken::Fresh { applied: vec![] }
    );
    s.answer_key("k1".into(), Some((201, "{\"id\":\"x\"}".into())))
        .await
        .unwrap();
    assert_eq!(
        take("fp", 171_000).await.unwrap(),
        Taken::Answered {
            status: 201,
            body: "{\"id\":\"x\"}".into()
        }
    );
    assert_eq!(take("other", 171_000).await.unwrap(), Taken::Mismatch);
    // Released unanswered: the next repeat takes it at once.
    assert_eq!(
        s.take_key("k2".into(), "fp".into(), 100_000, 40_000)
            .await
            .unwrap(),
        Taken::Fresh { applied: vec![] }
    );
    s.answer_key("k2".into(), None).await.unwrap();
    assert_eq!(
        s.take_key("k2".into(), "fp".into(), 100_001, 40_001)
            .await
            .unwrap(),
        Taken::Fresh { applied: vec![] }
    );
}

pub(super) async fn what_commits_applied_under_a_key_is_read_back(s: &Subject) {
    s.create_sensor(sensor("n1")).await.unwrap();
    s.take_key("k".into(), "fp".into(), 5_000, 0).await.unwrap();
    let mut one = change("n1", true, None, 5_000);
    one.keyed = vec![keyed("k", &[4, 0])];
    s.commit(one, 5_000).await.unwrap();
    let mut two = change("n1", false, Some(true), 5_100);
    two.keyed = vec![keyed("k", &[2]), keyed("elsewhere", &[1])];
    s.commit(two, 5_100).await.unwrap();
    // The holder stopped without answering; its repeat learns what is done.
    assert_eq!(
        s.take_key("k".into(), "fp".into(), 90_000, 80_000)
            .await
            .unwrap(),
        Taken::Fresh {
            applied: vec![0, 2, 4]
        }
    );
    // A commit that fails keeps nothing under the key.
    let mut fenced = change("n1", true, Some(false), 5_200);
    fenced.fence = vec![Fence {
        partition: 0,
        epoch: 99,
    }];
    fenced.keyed = vec![keyed("k", &[7])];
    assert!(s.commit(fenced, 5_200).await.is_err());
    s.answer_key("k".into(), None).await.unwrap();
    assert_eq!(
        s.take_key("k".into(), "fp".into(), 90_001, 80_001)
            .await
            .unwrap(),
        Taken::Fresh {
            applied: vec![0, 2, 4]
        }
    );
}

pub(super) async fn keys_are_forgotten_after_their_day(s: &Subject) {
    s.create_sensor(sensor("n1")).await.unwrap();
    s.take_key("old".into(), "fp".into(), 1_000, 0)
        .await
        .unwrap();
    let mut b = change("n1", true, None, 1_000);
    b.keyed = vec![keyed("old", &[0])];
    s.commit(b, 1_000).await.unwrap();
    s.answer_key("old".into(), Some((202, "{}".into())))
        .await
        .unwrap();
    s.take_key("new".into(), "fp".into(), 50_000, 0)
        .await
        .unwrap();
    assert_eq!(s.forget_keys(10_000).await.unwrap(), 1);
    // Forgotten: the same key is a new request, with nothing applied under it.
    assert_eq!(
        s.take_key("old".into(), "another".into(), 60_000, 0)
            .await
            .unwrap(),
        Taken::Fresh { applied: vec![] }
    );
    assert_eq!(
        s.take_key("new".into(), "x".into(), 60_000, 0)
            .await
            .unwrap(),
        Taken::Mismatch
    );
}
