//! Publishes that committed but were never acknowledged, so the broker sends them again:
//! a commit behind a failed one (the connection is dropped before they could be
//! acknowledged in order), or a connection lost while their batch committed.
//!
//! MQTT has no message id, but a resend is recognisable: on a resumed session the broker
//! must send every unacknowledged publish again with its original packet id (MQTT 5
//! §4.4, [MQTT-4.4.0-1]), and it gives no other publish that id while one holds it. So
//! a publish carrying the packet id, topic and payload of one remembered here is that
//! publish again: acknowledged in its place, not applied a second time.
//!
//! Bounded: an entry is one unacknowledged publish the broker holds for us, and it holds
//! at most the receive maximum of them (8000 by default; 65,535 packet ids at most). An
//! entry goes when its resend is acknowledged, and all go when the broker says the session
//! did not survive (nothing will be resent then).
//!
//! The session outlives the process: what is left here when latch stops is kept in the
//! store ([`crate::store::Sessions`]) and taken back by the next start (here or, in a
//! cluster, on the node the session moves to), so a resend after a restart is recognised
//! too.

use std::collections::HashMap;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;

use crate::store::Unacked;

#[derive(Default)]
pub(super) struct Resent {
    /// By packet id: the publish (its topic and payload are compared; cloning one shares
    /// their buffers).
    by_packet: HashMap<u16, Publish>,
}

impl Resent {
    /// A committed publish that was not acknowledged.
    pub(super) fn remember(&mut self, p: &Publish) {
        if p.qos != QoS::AtMostOnce {
            self.by_packet.insert(p.pkid, p.clone());
        }
    }

    /// Whether `p` is the broker's resend of a committed publish.
    pub(super) fn is_resend(&self, p: &Publish) -> bool {
        p.qos != QoS::AtMostOnce
            && self
                .by_packet
                .get(&p.pkid)
                .is_some_and(|old| old.topic == p.topic && old.payload == p.payload)
    }

    /// `p` was acknowledged: its packet id may name another publish from now on.
    pub(super) fn acknowledged(&mut self, p: &Publish) {
        self.by_packet.remove(&p.pkid);
    }

    /// The broker kept no session: nothing will be resent.
    pub(super) fn clear(&mut self) {
        self.by_packet.clear();
    }

    /// What a session kept across a stop ([`Resent::kept`]).
    pub(super) fn restore(unacked: Vec<Unacked>) -> Self {
        let by_packet = unacked
            .into_iter()
            .map(|u| {
                let mut p = Publish::new("", QoS::AtLeastOnce, Vec::<u8>::new(), None);
                p.pkid = u.pkid;
                p.topic = u.topic.into();
                p.payload = u.payload.into();
                (u.pkid, p)
            })
            .collect();
        Self { by_packet }
    }

    /// What is left to recognise, for the store when latch stops.
    pub(super) fn kept(&self) -> Vec<Unacked> {
        let mut kept: Vec<Unacked> = self
            .by_packet
            .values()
            .map(|p| Unacked {
                pkid: p.pkid,
                topic: p.topic.to_vec(),
                payload: p.payload.to_vec(),
            })
            .collect();
        kept.sort_by_key(|u| u.pkid);
        kept
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_packet.is_empty()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_packet.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(pkid: u16, topic: &str, payload: &str) -> Publish {
        let mut p = Publish::new(topic, QoS::AtLeastOnce, payload.to_string(), None);
        p.pkid = pkid;
        p
    }

    #[test]
    fn a_resend_is_its_packet_id_topic_and_payload_until_acknowledged() {
        let mut r = Resent::default();
        r.remember(&publish(7, "s/a/state", "1"));
        assert!(r.is_resend(&publish(7, "s/a/state", "1")));
        assert!(
            !r.is_resend(&publish(7, "s/a/state", "0")),
            "another payload"
        );
        assert!(!r.is_resend(&publish(7, "s/b/state", "1")), "another topic");
        assert!(
            !r.is_resend(&publish(8, "s/a/state", "1")),
            "another packet"
        );
        r.acknowledged(&publish(7, "s/a/state", "1"));
        assert!(
            !r.is_resend(&publish(7, "s/a/state", "1")),
            "the id is free again"
        );
        r.remember(&publish(9, "s/a/state", "1"));
        r.clear();
        assert_eq!(r.len(), 0);
        let mut q0 = publish(0, "s/a/state", "1");
        q0.qos = QoS::AtMostOnce;
        r.remember(&q0);
        assert_eq!(r.len(), 0, "nothing is resent at QoS 0");
    }

    #[test]
    fn what_is_kept_across_a_stop_is_recognised_after_it() {
        let mut r = Resent::default();
        r.remember(&publish(9, "s/b/state", "0"));
        r.remember(&publish(7, "s/a/state", "{\"data\":1}"));
        let kept = r.kept();
        assert_eq!(kept.iter().map(|u| u.pkid).collect::<Vec<_>>(), [7, 9]);
        let back = Resent::restore(kept);
        assert!(back.is_resend(&publish(7, "s/a/state", "{\"data\":1}")));
        assert!(back.is_resend(&publish(9, "s/b/state", "0")));
        assert!(!back.is_resend(&publish(9, "s/b/state", "1")));
        assert!(Resent::restore(Vec::new()).is_empty());
    }
}
