//! Checks of silences that name many sensors (issue #69): one matches exactly the sensors
//! it names, at the commit and at its end, beside silences that name none; it answers
//! them in the order given; and one read finds which of a list no sensor has.

use super::silences::silence;
use super::*;
use crate::domain::silence::Match;

/// `ms0000`, `ms0001`, … `n` of them.
fn many(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("ms{i:04}")).collect()
}

fn naming(ids: &[String]) -> Match {
    Match {
        sensor_ids: Some(ids.iter().map(|i| sid(i)).collect()),
        ..Match::default()
    }
}

/// The sensors `made` names, sorted.
fn sensors_of(made: &[NotificationRef]) -> Vec<String> {
    let mut ids: Vec<String> = made.iter().map(|n| n.sensor_id.to_string()).collect();
    ids.sort();
    ids
}

/// A silence naming 600 sensors (last first, one twice) keeps what comes of exactly those,
/// answers them as given (a named sensor deleted or not), and holds its pairs against the
/// end of a silence that names none; at its end it brings up to date exactly its own pairs
/// that no other silence naming them holds.
pub(super) async fn a_silence_of_many_sensors_matches_exactly_those(s: &Subject) {
    let all = many(1_200);
    s.create_client(client("mc1", "http://m/")).await.unwrap();
    let links = all.iter().map(|i| ("mc1".to_string(), sid(i))).collect();
    s.import(all.iter().map(|i| sensor(i)).collect(), links, 1_000)
        .await
        .unwrap();
    let mut odd: Vec<String> = all.iter().skip(1).step_by(2).rev().cloned().collect();
    odd.push(odd[0].clone());
    s.create_silence(silence("qm", naming(&odd), 1_000, 50_000))
        .await
        .unwrap();
    s.create_silence(silence("qn", naming(&all[3..4]), 1_000, 90_000))
        .await
        .unwrap();
    // Any sensor's loss, until before qm's end.
    let losses = Match {
        types: Some(vec![EventKind::ConnectionLost]),
        ..Match::default()
    };
    s.create_silence(silence("qt", losses, 1_000, 40_000))
        .await
        .unwrap();

    let mut made = Vec::new();
    for (i, id) in all.iter().take(20).enumerate() {
        let at = 2_000 + i as Millis;
        made.extend(s.commit(change(id, true, None, at), at).await.unwrap());
    }
    let even: Vec<String> = all.iter().take(20).step_by(2).cloned().collect();
    assert_eq!(sensors_of(&made), even, "only the sensors it does not name");
    let lost = s
        .commit(liveness(&all[40], EventKind::ConnectionLost, 3_000), 3_000)
        .await
        .unwrap();
    assert!(lost.is_empty(), "a silence naming no sensor: {lost:?}");

    let named: Vec<SensorId> = odd.iter().map(|i| sid(i)).collect();
    let got = s.get_silence("qm".into()).await.unwrap().unwrap();
    assert_eq!(got.matcher.sensor_ids.as_ref(), Some(&named), "as given");
    assert!(s.delete_sensor(sid(&all[1]), 4_000).await.unwrap());
    let listed = s.list_silences(None, 4_000, page(10)).await.unwrap().items;
    let qm = listed.iter().find(|q| q.id == "qm").unwrap();
    assert_eq!(
        qm.matcher.sensor_ids.as_ref(),
        Some(&named),
        "still as given"
    );
    let qt = listed.iter().find(|q| q.id == "qt").unwrap();
    assert_eq!(qt.matcher.sensor_ids, None);

    // qt's end: the loss it kept is told; the changes qm keeps wait for qm's end.
    let told = s.reconcile_silences(40_000, 45_000).await.unwrap();
    assert_eq!(sensors_of(&told), [all[40].clone()], "{told:?}");
    // qm's end: its pairs but the deleted sensor's and the one qn still holds.
    let told = s.reconcile_silences(50_000, 56_000).await.unwrap();
    let odd_kept: Vec<String> = all.iter().take(20).skip(5).step_by(2).cloned().collect();
    assert_eq!(sensors_of(&told), odd_kept, "{told:?}");
    let told = s.reconcile_silences(90_000, 96_000).await.unwrap();
    assert_eq!(sensors_of(&told), [all[3].clone()], "{told:?}");
}

/// One read says which of many ids no sensor has: the first of them, as given.
pub(super) async fn the_first_missing_of_many_sensors_is_found(s: &Subject) {
    let all = many(3_000);
    s.import(all.iter().map(|i| sensor(i)).collect(), Vec::new(), 1_000)
        .await
        .unwrap();
    let ids: Vec<SensorId> = all.iter().rev().map(|i| sid(i)).collect();
    assert_eq!(s.first_missing_sensor(ids.clone()).await.unwrap(), None);
    let mut with_gone = ids.clone();
    with_gone.insert(100, sid("gone2"));
    with_gone.insert(10, sid("gone1"));
    assert_eq!(
        s.first_missing_sensor(with_gone).await.unwrap(),
        Some(sid("gone1"))
    );
    assert!(s.delete_sensor(sid("ms0000"), 2_000).await.unwrap());
    assert_eq!(
        s.first_missing_sensor(ids).await.unwrap(),
        Some(sid("ms0000"))
    );
    assert_eq!(s.first_missing_sensor(Vec::new()).await.unwrap(), None);
}
