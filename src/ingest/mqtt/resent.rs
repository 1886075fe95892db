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
//! Bounded: an entry is one publish whose id the broker may still hold for us (at most
//! 65,535 packet ids; the committed unacknowledged ones at most its receive maximum,
//! 8000 by default). An entry goes when the event loop has written the acknowledgement
//! of the publish (or of its resend) on the connection it came on: until then the broker
//! holds the id, and a connection that breaks with the ack still queued brings the
//! publish again. All go when the broker says the session did not survive (nothing will
//! be resent then), and one the broker did not resend on a later connection goes once
//! that connection's resends are in: kept, it would match a later publish that reuses
//! the id with the same topic and payload, which would be acknowledged and never applied.
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
    /// their buffers), and the connection that was current when it was remembered (0:
    /// kept across a stop): every later connection's resends bring it, if any does.
    by_packet: HashMap<u16, (Publish, u64)>,
    /// Publishes whose acknowledgement is queued and not yet written, with the connection
    /// it was queued for. Until the event loop writes it, the broker still holds the id
    /// and resends the publish on a new connection: the connection may break first, and
    /// then the ack goes out (if at all) after the broker's resend.
    queued: HashMap<u16, (Publish, u64)>,
}

impl Resent {
    /// A committed publish that was not acknowledged, while connection `generation` is
    /// the current one.
    pub(super) fn remember(&mut self, p: &Publish, generation: u64) {
        if p.qos != QoS::AtMostOnce {
            self.by_packet.insert(p.pkid, (p.clone(), generation));
        }
    }

    /// Whether `p` is the broker's resend of a committed publish.
    pub(super) fn is_resend(&self, p: &Publish) -> bool {
        let same = |old: &Publish| old.topic == p.topic && old.payload == p.payload;
        p.qos != QoS::AtMostOnce
            && (self
                .by_packet
                .get(&p.pkid)
                .is_some_and(|(old, _)| same(old))
                || self.queued.get(&p.pkid).is_some_and(|(old, _)| same(old)))
    }

    /// The acknowledgement of `p`, which came on connection `generation`, is queued: it is
    /// recognised until the event loop has written it on that connection.
    pub(super) fn acknowledged(&mut self, p: &Publish, generation: u64) {
        self.by_packet.remove(&p.pkid);
        if p.qos != QoS::AtMostOnce {
            self.queued.insert(p.pkid, (p.clone(), generation));
        }
    }

    /// The event loop wrote the acknowledgement of packet `pkid` on connection
    /// `generation`: the broker may give the id to another publish from now on. One
    /// written on a later connection than it was queued for may have followed the
    /// broker's resend, which is still to be recognised.
    pub(super) fn written(&mut self, pkid: u16, generation: u64) {
        if self
            .queued
            .get(&pkid)
            .is_some_and(|(_, g)| *g == generation)
        {
            self.queued.remove(&pkid);
        }
    }

    /// The broker kept no session: nothing will be resent.
    pub(super) fn clear(&mut self) {
        self.by_packet.clear();
        self.queued.clear();
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
                (u.pkid, (p, 0))
            })
            .collect();
        Self {
            by_packet,
            queued: HashMap::new(),
        }
    }

    /// What is left to recognise, for the store when latch stops.
    pub(super) fn kept(&self) -> Vec<Unacked> {
        let mut kept: Vec<Unacked> = self
            .by_packet
            .values()
            .map(|(p, _)| Unacked {
                pkid: p.pkid,
                topic: p.topic.to_vec(),
                payload: p.payload.to_vec(),
            })
            .collect();
        kept.sort_by_key(|u| u.pkid);
        kept
    }

    /// No committed publish waits for its resend: nothing to wait for at a stop, nor to
    /// keep across it. Acks still queued do not count: the stop wrote them (its
    /// `DISCONNECT` goes behind them), or could not tell; kept, one the broker did take
    /// would leave its id looking held, and a new publish that reuses it with the same
    /// topic and payload would be taken for a resend and lost.
    pub(super) fn is_empty(&self) -> bool {
        self.by_packet.is_empty()
    }

    /// The broker's resends of connection `generation` are in (it sends them before it
    /// answers the subscription): an ack still queued from an earlier connection was
    /// written after its resend, or reached the broker, which then resends nothing; a
    /// publish remembered before this connection and not resent on it is not held by the
    /// broker any more (its ack got through, or another client of the session took it).
    pub(super) fn resends_in(&mut self, generation: u64) {
        self.queued.retain(|_, (_, g)| *g >= generation);
        self.by_packet.retain(|_, (_, g)| *g >= generation);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_packet.len() + self.queued.len()
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
        r.remember(&publish(7, "s/a/state", "1"), 1);
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
        r.acknowledged(&publish(7, "s/a/state", "1"), 1);
        assert!(
            r.is_resend(&publish(7, "s/a/state", "1")),
            "the ack is not written yet"
        );
        r.written(7, 1);
        assert!(
            !r.is_resend(&publish(7, "s/a/state", "1")),
            "the id is free again"
        );
        r.remember(&publish(9, "s/a/state", "1"), 1);
        r.clear();
        assert_eq!(r.len(), 0);
        let mut q0 = publish(0, "s/a/state", "1");
        q0.qos = QoS::AtMostOnce;
        r.remember(&q0, 1);
        assert_eq!(r.len(), 0, "nothing is resent at QoS 0");
    }

    #[test]
    fn what_is_kept_across_a_stop_is_recognised_after_it() {
        let mut r = Resent::default();
        r.remember(&publish(9, "s/b/state", "0"), 1);
        r.remember(&publish(7, "s/a/state", "{\"data\":1}"), 1);
        let kept = r.kept();
        assert_eq!(kept.iter().map(|u| u.pkid).collect::<Vec<_>>(), [7, 9]);
        let back = Resent::restore(kept);
        assert!(back.is_resend(&publish(7, "s/a/state", "{\"data\":1}")));
        assert!(back.is_resend(&publish(9, "s/b/state", "0")));
        assert!(!back.is_resend(&publish(9, "s/b/state", "1")));
        assert!(Resent::restore(Vec::new()).is_empty());
    }

    /// An ack queued on one connection and written on the next (the first broke before
    /// it went out) may reach the broker after its resend: that resend is still the
    /// publish again, not a new one.
    #[test]
    fn an_ack_written_on_a_later_connection_leaves_its_resend_recognised() {
        let mut r = Resent::default();
        let p = publish(5, "s/a/state", "1");
        r.acknowledged(&p, 1);
        r.written(5, 2);
        assert!(r.is_resend(&p));
        // The resend is acknowledged on connection 2, and that ack written there.
        r.acknowledged(&p, 2);
        r.written(5, 2);
        assert!(!r.is_resend(&p));
        assert!(r.is_empty());
        // Queued on connection 3 and never written there: recognised until connection 4
        // has had its resends, and not kept across a stop. 6 committed unacknowledged
        // while connection 4 was current: the next connection brings it.
        r.remember(&publish(6, "s/b/state", "0"), 4);
        r.acknowledged(&publish(8, "s/c/state", "1"), 3);
        assert!(!r.is_empty());
        let kept: Vec<u16> = r.kept().iter().map(|u| u.pkid).collect();
        assert_eq!(kept, [6]);
        assert!(r.is_resend(&publish(8, "s/c/state", "1")));
        r.resends_in(4);
        assert!(!r.is_resend(&publish(8, "s/c/state", "1")), "a new publish");
        assert!(r.is_resend(&publish(6, "s/b/state", "0")));
    }

    /// What a stop kept, or a connection remembered, that the broker does not resend on a
    /// later connection is not held by it (another client of the session took it, or the
    /// ack got through): a new publish that reuses its id, topic and payload is applied.
    #[test]
    fn what_the_next_connection_does_not_resend_is_forgotten() {
        let kept = vec![Unacked {
            pkid: 3,
            topic: b"s/a/state".to_vec(),
            payload: b"1".to_vec(),
        }];
        let mut r = Resent::restore(kept);
        r.remember(&publish(4, "s/b/state", "0"), 1);
        r.remember(&publish(5, "s/c/state", "0"), 2);
        assert!(r.is_resend(&publish(3, "s/a/state", "1")));
        // Connection 2's resends are in, and neither 3 nor 4 was among them.
        r.resends_in(2);
        assert!(!r.is_resend(&publish(3, "s/a/state", "1")), "a new publish");
        assert!(!r.is_resend(&publish(4, "s/b/state", "0")), "a new publish");
        assert!(r.is_resend(&publish(5, "s/c/state", "0")), "still to come");
        let kept: Vec<u16> = r.kept().iter().map(|u| u.pkid).collect();
        assert_eq!(kept, [5], "only what may still come is kept across a stop");
    }
}
