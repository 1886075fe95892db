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

use std::collections::HashMap;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;

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
}
