//! Traffic accounting: what the network carried, by link class and by replica pair,
//! and what it dropped, by reason.

use pangea_topology::{LinkClass, ReplicaId};
use serde::Serialize;

/// A count of messages and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    pub messages: u64,
    pub bytes: u64,
}

impl Traffic {
    pub(crate) fn add(&mut self, bytes: usize) {
        self.messages += 1;
        // usize is at most 64 bits on every supported target.
        self.bytes += bytes as u64;
    }
}

/// Traffic split the way WAN bills are: inside a region, between regions of one
/// continent, between continents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ClassTraffic {
    pub intra_region: Traffic,
    pub inter_region: Traffic,
    pub inter_continent: Traffic,
}

impl ClassTraffic {
    pub fn get(&self, class: LinkClass) -> &Traffic {
        match class {
            LinkClass::IntraRegion => &self.intra_region,
            LinkClass::InterRegion => &self.inter_region,
            LinkClass::InterContinent => &self.inter_continent,
        }
    }

    pub(crate) fn get_mut(&mut self, class: LinkClass) -> &mut Traffic {
        match class {
            LinkClass::IntraRegion => &mut self.intra_region,
            LinkClass::InterRegion => &mut self.inter_region,
            LinkClass::InterContinent => &mut self.inter_continent,
        }
    }

    pub fn total(&self) -> Traffic {
        let all = [self.intra_region, self.inter_region, self.inter_continent];
        Traffic {
            messages: all.iter().map(|t| t.messages).sum(),
            bytes: all.iter().map(|t| t.bytes).sum(),
        }
    }
}

/// Dropped messages by reason (see [`crate::net::DropReason`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Drops {
    pub partitioned: Traffic,
    pub replica_down: Traffic,
    pub unknown_replica: Traffic,
}

impl Drops {
    pub fn total_messages(&self) -> u64 {
        self.partitioned.messages + self.replica_down.messages + self.unknown_replica.messages
    }
}

/// Traffic on one directed replica pair (one connection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairTraffic {
    pub from: ReplicaId,
    pub to: ReplicaId,
    pub class: LinkClass,
    pub messages: u64,
    pub bytes: u64,
}

/// A snapshot of the network's counters since it was built. Serializes to JSON for
/// drill reports; every list is in a fixed order (replica ids), so two runs of one
/// seed serialize identically.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NetStats {
    /// Messages accepted for delivery, by link class: the WAN bytes a run cost.
    /// Messages later dropped in flight are included (they crossed the wire).
    pub sent: ClassTraffic,
    /// Messages handed to their receiver.
    pub delivered: Traffic,
    /// Refused at send time (partition, a down end, an unknown replica); these never
    /// count as sent.
    pub dropped_at_send: Drops,
    /// Accepted, then dropped when a partition cut their path or their receiver went
    /// down before they arrived.
    pub dropped_in_flight: Drops,
    /// Extra transmissions caused by loss (each adds one retransmission timeout).
    pub retransmissions: u64,
    /// Messages in flight now.
    pub in_flight: usize,
    /// The most messages ever in flight at once.
    pub in_flight_max: usize,
    /// Every connection that carried traffic, ordered by (from, to) id.
    pub pairs: Vec<PairTraffic>,
}

impl NetStats {
    /// Adds the counters of another shard's network (`in_flight_max` becomes the sum
    /// of the maxima: an upper bound).
    pub fn absorb(&mut self, o: NetStats) {
        for class in [
            LinkClass::IntraRegion,
            LinkClass::InterRegion,
            LinkClass::InterContinent,
        ] {
            let t = *o.sent.get(class);
            let mine = self.sent.get_mut(class);
            mine.messages += t.messages;
            mine.bytes += t.bytes;
        }
        self.delivered.messages += o.delivered.messages;
        self.delivered.bytes += o.delivered.bytes;
        for (a, b) in [
            (&mut self.dropped_at_send, o.dropped_at_send),
            (&mut self.dropped_in_flight, o.dropped_in_flight),
        ] {
            for (x, y) in [
                (&mut a.partitioned, b.partitioned),
                (&mut a.replica_down, b.replica_down),
                (&mut a.unknown_replica, b.unknown_replica),
            ] {
                x.messages += y.messages;
                x.bytes += y.bytes;
            }
        }
        self.retransmissions += o.retransmissions;
        self.in_flight += o.in_flight;
        self.in_flight_max += o.in_flight_max;
        self.pairs.extend(o.pairs);
        self.pairs
            .sort_by(|a, b| (&a.from, &a.to).cmp(&(&b.from, &b.to)));
    }
}
