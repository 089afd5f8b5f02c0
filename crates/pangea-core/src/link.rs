//! A replication stream's codec: frames to and from `pangea.v1.ReplicationFrame`,
//! with heartbeats condensed against what the same stream carried before.
//!
//! Heartbeats are the most frequent frames: every origin's, every 50 ms, relayed to
//! every member of each of its scopes, and one in ten carries the sender's applied
//! watermark for every origin. Spelt out (`Frame::to_proto`) they cost about half of
//! the mutation bytes of a 39-replica deployment at 1,000 operations/s. Condensed,
//! a name crosses a stream once and a number crosses as its difference from the
//! last one of its kind: a heartbeat takes about 6 bytes instead of 50, a report
//! entry (its origins as last time, one time for all) about 1 instead of 30
//! (docs/architecture.md, "Condensed heartbeats").
//!
//! The state is per stream and per direction: the sender's [`LinkEncoder`] and the
//! receiver's [`LinkDecoder`] see the same frames in the same order (a QUIC stream
//! is reliable and ordered), so their tables agree; a new stream starts both empty.
//! A decoding error leaves the decoder out of step: the caller must drop the stream
//! (the peer reconnects with a fresh one). Nothing else in a frame is condensed.
//!
//! The layout of `HeartbeatBatch.packed` is documented in `replication.proto`.

use crate::Error;
use crate::frame::{Frame, FrameLimits, Heartbeat, heartbeat_batch_body_len, pb_len};
use crate::hash::WordMap;
use crate::hlc::{LOGICAL_BITS, Timestamp};
use crate::ids::{ReplicaId, ScopeId};
use crate::limits::Limits;
use crate::storage::Watermark;
use pangea_proto::v1 as pb;
use pangea_topology::schema::validate_scope;
use std::collections::HashMap;
use std::sync::Arc;

/// Names one stream may define (scopes and replicas: a deployment has far fewer).
pub const NAMES_MAX: usize = 1 << 16;
/// (scope, origin) pairs and (scope, reporter, origin) triples a decoder tracks.
const PAIRS_MAX: usize = 1 << 16;
const TRIPLES_MAX: usize = 1 << 18;

const TREE_EDGE: i64 = 1;
const REPORT: i64 = 2;
const PURGE: i64 = 4;
const REPORT_AFTER: i64 = 8;
const FLAGS: i64 = TREE_EDGE | REPORT | PURGE | REPORT_AFTER;

const LOGICAL_MASK: u64 = (1 << LOGICAL_BITS) - 1;
const WALL_LIMIT: u64 = 1 << (64 - LOGICAL_BITS);

/// The last heartbeat of one (scope, origin) on a stream.
#[derive(Debug, Clone, Copy, Default)]
struct Last {
    sequence: u64,
    wall_ms: u64,
    purge: u64,
    report_after: u64,
}

fn split(t: Timestamp) -> (u64, u64) {
    (t.as_u64() >> LOGICAL_BITS, t.as_u64() & LOGICAL_MASK)
}

/// The difference `new - old`, modulo 2^64, as the wire's signed number.
fn diff(new: u64, old: u64) -> i64 {
    new.wrapping_sub(old) as i64
}

/// The sender's side of one stream.
///
/// The maps keyed by the indexes it assigns hash with [`WordMap`]'s fast hasher.
/// `names` keeps SipHash: the origins of a relayed report are names a peer sent,
/// and keys chosen to collide must not make interning quadratic.
#[derive(Debug, Default)]
pub struct LinkEncoder {
    names: HashMap<Arc<str>, u32>,
    /// The names by index (`names` inverted).
    by_index: Vec<Arc<str>>,
    last: WordMap<(u32, u32), Last>,
    reported: WordMap<(u32, u32, u32), u64>,
    /// Per (scope, reporter): the origins of its last report on this stream.
    origins: WordMap<(u32, u32), Vec<u32>>,
}

/// Where condensed heartbeats go: built into a message, or only measured.
trait Sink {
    fn name(&mut self, name: &str);
    fn number(&mut self, v: i64);
}

#[derive(Default)]
struct Build {
    names: Vec<String>,
    packed: Vec<i64>,
}

impl Sink for Build {
    fn name(&mut self, name: &str) {
        self.names.push(name.to_owned());
    }
    fn number(&mut self, v: i64) {
        self.packed.push(v);
    }
}

/// Encoded sizes (see `frame::pb_len`): names as strings of field 2, numbers as
/// zigzag varints of the packed field 3.
#[derive(Default)]
struct Measure {
    names: usize,
    packed: usize,
}

use pb_len::varint as varint_len;

impl Sink for Measure {
    fn name(&mut self, name: &str) {
        self.names += 1 + varint_len(name.len() as u64) + name.len();
    }
    fn number(&mut self, v: i64) {
        self.packed += varint_len(((v << 1) ^ (v >> 63)) as u64);
    }
}

impl LinkEncoder {
    /// The wire form of `frame`, advancing this stream's state: the frame must then
    /// be sent on the stream (or the stream dropped).
    pub fn encode(&mut self, frame: &Frame) -> pb::ReplicationFrame {
        let Frame::Heartbeats(hbs) = frame else {
            return frame.to_proto();
        };
        let mut b = Build::default();
        let verbose = self.condense(hbs, &mut b);
        let mut p = Frame::Heartbeats(verbose).to_proto();
        if let Some(pb::replication_frame::Frame::Heartbeats(batch)) = &mut p.frame {
            batch.names = b.names;
            batch.packed = b.packed;
        }
        p
    }

    /// The encoded length (protobuf body) of `frame`, advancing the state exactly as
    /// [`LinkEncoder::encode`] would, without building it: what the simulator counts.
    pub fn measure(&mut self, frame: &Frame) -> usize {
        let Frame::Heartbeats(hbs) = frame else {
            return frame.wire_bytes();
        };
        let mut m = Measure::default();
        let verbose = self.condense(hbs, &mut m);
        let packed = if m.packed == 0 {
            0
        } else {
            1 + varint_len(m.packed as u64) + m.packed
        };
        pb_len::message(heartbeat_batch_body_len(&verbose) + m.names + packed)
    }

    /// Writes what it can of `hbs` to `sink`; returns the heartbeats left verbose
    /// (only when the name table is full).
    fn condense(&mut self, hbs: &[Heartbeat], sink: &mut impl Sink) -> Vec<Heartbeat> {
        let mut verbose = Vec::new();
        for hb in hbs {
            if !self.fits(hb) {
                verbose.push(hb.clone());
                continue;
            }
            let scope = self.intern(hb.scope.as_str(), sink);
            let origin = self.intern(hb.origin.as_str(), sink);
            let last = self.last.get(&(scope, origin)).copied().unwrap_or_default();
            let (wall, logical) = split(hb.timestamp);
            let mut flags = 0;
            if hb.tree_edge {
                flags |= TREE_EDGE;
            }
            if !hb.applied.is_empty() {
                flags |= REPORT;
            }
            if hb.purge.as_u64() != last.purge {
                flags |= PURGE;
            }
            if hb.report_after != last.report_after {
                flags |= REPORT_AFTER;
            }
            // Names of the report's origins first: a name is defined before its use.
            // Most reports name the origins of the reporter's last one, which are
            // compared by name rather than hashed again (`None`).
            let report = (!hb.applied.is_empty() && !self.same_origins(scope, origin, &hb.applied))
                .then(|| {
                    hb.applied
                        .iter()
                        .map(|(o, _)| self.intern(o.as_str(), sink))
                        .collect::<Vec<u32>>()
                });
            sink.number(scope as i64);
            sink.number(origin as i64);
            sink.number(flags);
            sink.number(diff(hb.sequence, last.sequence));
            sink.number(diff(wall, last.wall_ms));
            sink.number(logical as i64);
            if flags & PURGE != 0 {
                let (pw, pl) = split(hb.purge);
                sink.number(diff(pw, last.purge >> LOGICAL_BITS));
                sink.number(pl as i64);
            }
            if flags & REPORT_AFTER != 0 {
                sink.number(diff(hb.report_after, last.report_after));
            }
            if flags & REPORT != 0 {
                self.report(scope, origin, wall, report, &hb.applied, sink);
            }
            self.last.insert(
                (scope, origin),
                Last {
                    sequence: hb.sequence,
                    wall_ms: wall,
                    purge: hb.purge.as_u64(),
                    report_after: hb.report_after,
                },
            );
        }
        verbose
    }

    /// Whether `applied` names the origins of `reporter`'s last report on this
    /// stream, in its order.
    fn same_origins(&self, scope: u32, reporter: u32, applied: &[(ReplicaId, Watermark)]) -> bool {
        self.origins.get(&(scope, reporter)).is_some_and(|last| {
            last.len() == applied.len()
                && last
                    .iter()
                    .zip(applied)
                    .all(|(&i, (o, _))| *self.by_index[i as usize] == *o.as_str())
        })
    }

    /// An applied-watermark report: a header (`n × 4`, + 1 when the origins are
    /// those of the reporter's last report on this stream, + 2 when every entry has
    /// one timestamp), the origins' indexes unless the same, each sequence as the
    /// difference from the reporter's last report of that origin, then the
    /// timestamp once (the heartbeat's wall ms minus the entry's, and its logical
    /// part) or per entry.
    fn report(
        &mut self,
        scope: u32,
        reporter: u32,
        wall: u64,
        new_origins: Option<Vec<u32>>,
        applied: &[(ReplicaId, Watermark)],
        sink: &mut impl Sink,
    ) {
        // `None`: the origins of the last report, taken out while the entries are
        // written and put back after.
        let same = new_origins.is_none();
        let origins = new_origins
            .or_else(|| self.origins.remove(&(scope, reporter)))
            .unwrap_or_default();
        debug_assert!(
            !origins.is_empty(),
            "`None` only when the last report's are kept"
        );
        let one_time = applied
            .windows(2)
            .all(|w| w[0].1.timestamp == w[1].1.timestamp);
        sink.number(origins.len() as i64 * 4 + i64::from(same) + 2 * i64::from(one_time));
        if !same {
            for o in &origins {
                sink.number(*o as i64);
            }
        }
        for (o, (_, w)) in origins.iter().zip(applied) {
            let seen = self.reported.entry((scope, reporter, *o)).or_default();
            sink.number(diff(w.sequence, *seen));
            *seen = w.sequence;
        }
        let times = if one_time { &applied[..1] } else { applied };
        for (_, w) in times {
            let (ww, wl) = split(w.timestamp);
            sink.number(diff(wall, ww));
            sink.number(wl as i64);
        }
        self.origins.insert((scope, reporter), origins);
    }

    /// Whether the names `hb` needs fit in the table.
    fn fits(&self, hb: &Heartbeat) -> bool {
        let room = NAMES_MAX - self.names.len();
        if room >= 2 + hb.applied.len() {
            return true;
        }
        let mut new: Vec<&str> = [hb.scope.as_str(), hb.origin.as_str()]
            .into_iter()
            .chain(hb.applied.iter().map(|(o, _)| o.as_str()))
            .filter(|n| !self.names.contains_key(*n))
            .collect();
        new.sort_unstable();
        new.dedup();
        new.len() <= room
    }

    fn intern(&mut self, name: &str, sink: &mut impl Sink) -> u32 {
        if let Some(&i) = self.names.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        let name: Arc<str> = Arc::from(name);
        self.names.insert(name.clone(), i);
        self.by_index.push(name);
        sink.name(&self.by_index[i as usize]);
        i
    }
}

/// The receiver's side of one stream.
#[derive(Debug, Default)]
pub struct LinkDecoder {
    names: Vec<Arc<str>>,
    last: HashMap<(u32, u32), Last>,
    reported: HashMap<(u32, u32, u32), u64>,
    /// Per (scope, reporter): the origins of its last report on this stream.
    origins: HashMap<(u32, u32), Vec<u32>>,
}

/// The numbers of `packed`, in order; running out is an error.
struct Numbers<'a> {
    it: std::slice::Iter<'a, i64>,
}

impl Numbers<'_> {
    fn next(&mut self, what: &'static str) -> Result<i64, Error> {
        self.it
            .next()
            .copied()
            .ok_or_else(|| Error::malformed("condensed heartbeats", format!("ends before {what}")))
    }

    fn wall(&mut self, base: u64, what: &'static str) -> Result<u64, Error> {
        let w = base.wrapping_add(self.next(what)? as u64);
        if w >= WALL_LIMIT {
            return Err(Error::malformed(
                "condensed heartbeats",
                format!("{what} of {w} ms is beyond the clock's range"),
            ));
        }
        Ok(w)
    }

    fn logical(&mut self, what: &'static str) -> Result<u64, Error> {
        let l = self.next(what)?;
        if !(0..=LOGICAL_MASK as i64).contains(&l) {
            return Err(Error::malformed(
                "condensed heartbeats",
                format!("{what} logical part {l} out of range"),
            ));
        }
        Ok(l as u64)
    }
}

impl LinkDecoder {
    /// Parses a frame from the peer, heartbeats condensed or not. On error the
    /// stream is out of step: drop it.
    pub fn decode(
        &mut self,
        p: pb::ReplicationFrame,
        limits: &Limits,
        fl: &FrameLimits,
    ) -> Result<Frame, Error> {
        let Some(pb::replication_frame::Frame::Heartbeats(mut batch)) = p.frame else {
            return Frame::from_proto(p, limits, fl);
        };
        let names = std::mem::take(&mut batch.names);
        let packed = std::mem::take(&mut batch.packed);
        let verbose = pb::ReplicationFrame {
            frame: Some(pb::replication_frame::Frame::Heartbeats(batch)),
        };
        let Frame::Heartbeats(mut hbs) = Frame::from_proto(verbose, limits, fl)? else {
            unreachable!("a heartbeat batch parses as heartbeats");
        };
        if self.names.len() + names.len() > NAMES_MAX {
            return Err(Error::malformed(
                "condensed heartbeats",
                format!(
                    "name table of {} names, limit {NAMES_MAX}",
                    self.names.len() + names.len()
                ),
            ));
        }
        for n in names {
            // Replica ids and scope names share the table: a scope's name is a
            // valid name or one followed by `/` and a shard group.
            validate_scope(&n)?;
            self.names.push(Arc::from(n));
        }
        let mut nums = Numbers { it: packed.iter() };
        while nums.it.len() > 0 {
            if hbs.len() >= fl.heartbeats_max {
                return Err(Error::malformed(
                    "heartbeat batch",
                    format!("over {} heartbeats", fl.heartbeats_max),
                ));
            }
            hbs.push(self.heartbeat(&mut nums, fl)?);
        }
        Ok(Frame::Heartbeats(hbs))
    }

    fn name(&self, n: &mut Numbers<'_>, what: &'static str) -> Result<(u32, &Arc<str>), Error> {
        let i = n.next(what)?;
        usize::try_from(i)
            .ok()
            .and_then(|i| self.names.get(i).map(|s| (i as u32, s)))
            .ok_or_else(|| {
                Error::malformed(
                    "condensed heartbeats",
                    format!("{what} index {i}, table of {}", self.names.len()),
                )
            })
    }

    /// See [`LinkEncoder::report`].
    fn report(
        &mut self,
        n: &mut Numbers<'_>,
        scope: u32,
        reporter: u32,
        wall: u64,
        fl: &FrameLimits,
    ) -> Result<Vec<(ReplicaId, Watermark)>, Error> {
        let header = n.next("report header")?;
        let (count, same, one_time) = (header >> 2, header & 1 != 0, header & 2 != 0);
        if !(1..=fl.applied_max as i64).contains(&count) {
            return Err(Error::malformed(
                "watermark vector",
                format!("{count} origins, limit {}", fl.applied_max),
            ));
        }
        let origins = if same {
            match self.origins.get(&(scope, reporter)) {
                Some(o) if o.len() == count as usize => o.clone(),
                other => {
                    return Err(Error::malformed(
                        "condensed heartbeats",
                        format!(
                            "report of {count} origins \"as last time\", last had {}",
                            other.map_or(0, Vec::len)
                        ),
                    ));
                }
            }
        } else {
            if !self.origins.contains_key(&(scope, reporter)) && self.origins.len() >= PAIRS_MAX {
                return Err(Error::malformed(
                    "condensed heartbeats",
                    format!("over {PAIRS_MAX} reporters"),
                ));
            }
            (0..count)
                .map(|_| self.name(n, "report origin").map(|(i, _)| i))
                .collect::<Result<Vec<u32>, Error>>()?
        };
        let mut applied = Vec::with_capacity(origins.len());
        for &o in &origins {
            let seen = self.reported.get(&(scope, reporter, o)).copied();
            if seen.is_none() && self.reported.len() >= TRIPLES_MAX {
                return Err(Error::malformed(
                    "condensed heartbeats",
                    format!("over {TRIPLES_MAX} reported watermarks"),
                ));
            }
            let sequence = seen
                .unwrap_or_default()
                .wrapping_add(n.next("report sequence")? as u64);
            self.reported.insert((scope, reporter, o), sequence);
            applied.push((
                ReplicaId::new(self.names[o as usize].clone()),
                Watermark {
                    sequence,
                    timestamp: Timestamp::ZERO,
                },
            ));
        }
        let times = if one_time { 1 } else { applied.len() };
        for i in 0..times {
            let w = wall.wrapping_sub(n.next("report timestamp")? as u64);
            if w >= WALL_LIMIT {
                return Err(Error::malformed(
                    "condensed heartbeats",
                    format!("report timestamp of {w} ms is beyond the clock's range"),
                ));
            }
            let t = Timestamp::from_u64((w << LOGICAL_BITS) | n.logical("report timestamp")?);
            if one_time {
                applied.iter_mut().for_each(|(_, wm)| wm.timestamp = t);
            } else {
                applied[i].1.timestamp = t;
            }
        }
        if !same {
            self.origins.insert((scope, reporter), origins);
        }
        Ok(applied)
    }

    fn heartbeat(&mut self, n: &mut Numbers<'_>, fl: &FrameLimits) -> Result<Heartbeat, Error> {
        let (scope, scope_name) = self.name(n, "scope")?;
        let scope_id = ScopeId::new(scope_name.clone());
        let (origin, origin_name) = self.name(n, "origin")?;
        let origin_id = ReplicaId::new(origin_name.clone());
        let flags = n.next("flags")?;
        if flags & !FLAGS != 0 {
            return Err(Error::malformed(
                "condensed heartbeats",
                format!("unknown flags {flags:#x}"),
            ));
        }
        let last = self.last.get(&(scope, origin)).copied();
        if last.is_none() && self.last.len() >= PAIRS_MAX {
            return Err(Error::malformed(
                "condensed heartbeats",
                format!("over {PAIRS_MAX} (scope, origin) pairs"),
            ));
        }
        let last = last.unwrap_or_default();
        let sequence = last.sequence.wrapping_add(n.next("sequence")? as u64);
        let wall = n.wall(last.wall_ms, "timestamp")?;
        let logical = n.logical("timestamp")?;
        let purge = if flags & PURGE != 0 {
            let w = n.wall(last.purge >> LOGICAL_BITS, "purge")?;
            (w << LOGICAL_BITS) | n.logical("purge")?
        } else {
            last.purge
        };
        let report_after = if flags & REPORT_AFTER != 0 {
            last.report_after
                .wrapping_add(n.next("report_after")? as u64)
        } else {
            last.report_after
        };
        let applied = if flags & REPORT != 0 {
            self.report(n, scope, origin, wall, fl)?
        } else {
            Vec::new()
        };
        self.last.insert(
            (scope, origin),
            Last {
                sequence,
                wall_ms: wall,
                purge,
                report_after,
            },
        );
        Ok(Heartbeat {
            scope: scope_id,
            origin: origin_id,
            sequence,
            timestamp: Timestamp::from_u64((wall << LOGICAL_BITS) | logical),
            applied: applied.into(),
            purge: Timestamp::from_u64(purge),
            tree_edge: flags & TREE_EDGE != 0,
            report_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pangea_proto::Message;
    use proptest::prelude::*;

    fn id(i: u8) -> ReplicaId {
        ReplicaId::new(format!("replica-{i}"))
    }

    /// A heartbeat from small random parts: few names, so they repeat across
    /// batches as on a real stream.
    fn heartbeat() -> impl Strategy<Value = Heartbeat> {
        (
            (0u8..3, 0u8..6, any::<u64>(), 0u64..1 << 48, any::<u16>()),
            (
                prop::collection::vec((0u8..6, any::<u64>(), 0u64..1 << 48, any::<u16>()), 0..5),
                any::<u64>(),
                any::<bool>(),
                0u64..4,
            ),
        )
            .prop_map(
                |((scope, origin, sequence, wall, logical), (report, purge, tree_edge, after))| {
                    let mut report: Vec<(ReplicaId, Watermark)> = report
                        .into_iter()
                        .map(|(o, s, w, l)| {
                            (
                                id(o),
                                Watermark {
                                    sequence: s,
                                    timestamp: Timestamp::new(w, l),
                                },
                            )
                        })
                        .collect();
                    report.sort_by(|a, b| a.0.cmp(&b.0));
                    report.dedup_by(|a, b| a.0 == b.0);
                    Heartbeat {
                        scope: ScopeId::from(["global", "eu-resident", "apac"][scope as usize]),
                        origin: id(origin),
                        sequence,
                        timestamp: Timestamp::new(wall, logical),
                        applied: report.into(),
                        purge: Timestamp::from_u64(purge),
                        tree_edge,
                        report_after: after,
                    }
                },
            )
    }

    fn wire(p: &pb::ReplicationFrame) -> pb::ReplicationFrame {
        pb::ReplicationFrame::decode(p.encode_to_vec().as_slice()).expect("own encoding decodes")
    }

    proptest! {
        /// Batch after batch on one stream, the decoder gives back exactly what the
        /// encoder was given, and `measure` counts the very bytes `encode` makes.
        #[test]
        fn condensed_heartbeats_round_trip(
            batches in prop::collection::vec(prop::collection::vec(heartbeat(), 0..8), 1..12),
        ) {
            let (mut enc, mut meter, mut dec) =
                (LinkEncoder::default(), LinkEncoder::default(), LinkDecoder::default());
            for hbs in batches {
                let frame = Frame::Heartbeats(hbs);
                let p = enc.encode(&frame);
                prop_assert_eq!(meter.measure(&frame), p.encoded_len());
                let back = dec.decode(wire(&p), &Limits::default(), &FrameLimits::default());
                prop_assert_eq!(back.expect("decodes"), frame);
            }
        }

        /// Whatever a peer sends after a valid start, decoding returns an error or
        /// heartbeats; it never panics.
        #[test]
        fn any_condensed_batch_decodes_or_errs(
            first in prop::collection::vec(heartbeat(), 0..4),
            names in prop::collection::vec("[a-z0-9-]{0,12}", 0..4),
            packed in prop::collection::vec(any::<i64>(), 0..40),
            small in prop::collection::vec(-3i64..12, 0..40),
        ) {
            let mut enc = LinkEncoder::default();
            let mut dec = LinkDecoder::default();
            let _ = dec.decode(wire(&enc.encode(&Frame::Heartbeats(first))),
                &Limits::default(), &FrameLimits::default());
            for packed in [packed, small] {
                let p = pb::ReplicationFrame {
                    frame: Some(pb::replication_frame::Frame::Heartbeats(pb::HeartbeatBatch {
                        heartbeats: vec![],
                        names: names.clone(),
                        packed,
                    })),
                };
                let _ = dec.decode(p, &Limits::default(), &FrameLimits::default());
            }
        }
    }

    /// What a relaying replica sends every 50 ms: one heartbeat per origin, every
    /// tenth with a 39-origin report (one time for all, as replicas report).
    /// Condensed, the steady state is about a tenth of the bytes spelt out.
    #[test]
    fn steady_heartbeats_cost_a_few_bytes() {
        let origins: Vec<ReplicaId> = (0..39).map(id).collect();
        let mut enc = LinkEncoder::default();
        let mut dec = LinkDecoder::default();
        let (mut condensed, mut verbose, mut reports) = (0, 0, 0);
        for round in 0..200u64 {
            let wall = 1_800_000_000_000 + round * 50;
            let hbs: Vec<Heartbeat> = origins
                .iter()
                .enumerate()
                .map(|(i, o)| Heartbeat {
                    scope: ScopeId::global(),
                    origin: o.clone(),
                    sequence: 1_000 + round * (i as u64 % 3),
                    timestamp: Timestamp::new(wall - 40 - i as u64, 0),
                    applied: if (round + i as u64).is_multiple_of(10) {
                        reports += 1;
                        origins
                            .iter()
                            .map(|p| {
                                (
                                    p.clone(),
                                    Watermark {
                                        sequence: 1_000 + round,
                                        timestamp: Timestamp::new(wall - 120, 0),
                                    },
                                )
                            })
                            .collect()
                    } else {
                        Default::default()
                    },
                    purge: Timestamp::new(wall / 1_000 * 1_000 - 5_000, 0),
                    tree_edge: i == 0,
                    report_after: 0,
                })
                .collect();
            let frame = Frame::Heartbeats(hbs);
            let p = enc.encode(&frame);
            if round >= 10 {
                condensed += p.encoded_len();
                verbose += frame.encoded_len();
            }
            let back = dec.decode(wire(&p), &Limits::default(), &FrameLimits::default());
            assert_eq!(back.expect("decodes"), frame);
        }
        assert!(reports > 0);
        // 190 rounds × 39 heartbeats, 741 of them with a 39-entry report.
        let per_heartbeat = condensed as f64 / (190.0 * 39.0);
        assert!(
            condensed * 10 < verbose,
            "condensed {condensed} B vs verbose {verbose} B ({per_heartbeat:.1} B/heartbeat)"
        );
    }

    #[test]
    fn an_index_beyond_the_table_is_refused() {
        let mut dec = LinkDecoder::default();
        let p = pb::ReplicationFrame {
            frame: Some(pb::replication_frame::Frame::Heartbeats(
                pb::HeartbeatBatch {
                    heartbeats: vec![],
                    names: vec!["global".into()],
                    packed: vec![0, 1, 0, 1, 1, 0],
                },
            )),
        };
        let e = dec
            .decode(p, &Limits::default(), &FrameLimits::default())
            .expect_err("origin 1 is not defined");
        assert!(e.to_string().contains("origin index 1, table of 1"), "{e}");
    }

    #[test]
    fn condensed_heartbeats_need_the_stream() {
        let mut enc = LinkEncoder::default();
        let hb = Heartbeat {
            scope: ScopeId::global(),
            origin: id(1),
            sequence: 3,
            timestamp: Timestamp::new(5, 0),
            applied: Default::default(),
            purge: Timestamp::ZERO,
            tree_edge: false,
            report_after: 0,
        };
        let p = enc.encode(&Frame::Heartbeats(vec![hb]));
        let e = Frame::from_proto(p, &Limits::default(), &FrameLimits::default())
            .expect_err("stateless parse refuses condensed heartbeats");
        assert!(e.to_string().contains("outside a stream"), "{e}");
    }
}
