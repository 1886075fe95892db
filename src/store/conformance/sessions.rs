//! Broker sessions: what a session keeps is replaced whole, and taken once.

use super::*;

fn unacked(pkid: u16, payload: &[u8]) -> Unacked {
    Unacked {
        pkid,
        topic: format!("sensors/s{pkid}/state").into_bytes(),
        payload: payload.to_vec(),
    }
}

pub(super) async fn unacked_publishes_are_kept_until_taken(s: &Subject) {
    assert!(s.take_unacked("a".into()).await.unwrap().is_empty());
    let (one, two) = (unacked(7, b"1"), unacked(u16::MAX, &[0, 255, b'{']));
    s.keep_unacked("a".into(), vec![two.clone()]).await.unwrap();
    s.keep_unacked("b".into(), vec![one.clone()]).await.unwrap();
    // Replaced whole: the same packet id again is no conflict.
    s.keep_unacked("a".into(), vec![two.clone(), one.clone()])
        .await
        .unwrap();
    assert_eq!(
        s.take_unacked("a".into()).await.unwrap(),
        vec![one.clone(), two],
        "by packet id"
    );
    assert!(
        s.take_unacked("a".into()).await.unwrap().is_empty(),
        "taken once"
    );
    assert_eq!(s.take_unacked("b".into()).await.unwrap(), vec![one]);
    s.keep_unacked("c".into(), Vec::new()).await.unwrap();
    assert!(s.take_unacked("c".into()).await.unwrap().is_empty());
}
