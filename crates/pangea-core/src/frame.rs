//! Replication frames as the core sees them: parsed, validated, bounded. The wire
//! form is `pangea.v1.ReplicationFrame`; [`Frame::from_proto`] is the only way in
//! from a peer and refuses anything malformed or out of bounds with a typed error.

use crate::Error;
use crate::hlc::Timestamp;
use crate::ids::{ReplicaId, ScopeId};
use crate::limits::Limits;
use crate::row::RowState;
use crate::storage::{LogEntry, Watermark};
use bytes::Bytes;
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::schema::{validate_name, validate_scope};
use std::sync::Arc;

/// Bounds on one frame's contents, beyond the byte limit the transport enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Mutations in one `MutationBatch` or `GapFill`.
    pub entries_max: usize,
    /// Heartbeats in one `HeartbeatBatch` (one per origin per scope, so this bounds
    /// scopes × replicas).
    pub heartbeats_max: usize,
    /// Origins in one heartbeat's applied vector.
    pub applied_max: usize,
    /// Rows in one snapshot chunk.
    pub snapshot_rows_max: usize,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            entries_max: 10_000,
            heartbeats_max: 10_000,
            applied_max: 1_000,
            snapshot_rows_max: 100_000,
        }
    }
}

/// One origin's liveness and progress in one scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub scope: ScopeId,
    pub origin: ReplicaId,
    /// The origin's last sequence that has been sent.
    pub sequence: u64,
    /// The origin promises no mutation after `sequence` with a timestamp ≤ this.
    pub timestamp: Timestamp,
    /// The origin's own applied watermarks in the scope (for the purge horizon);
    /// empty in most heartbeats.
    pub applied: Applied,
    /// The origin's view of the purge horizon.
    pub purge: Timestamp,
    /// The sender is the origin and holds the receiver as a tree neighbour: the
    /// receiver adopts it as an inbound neighbour.
    pub tree_edge: bool,
    /// The origin asks every replica that has durably applied its stream up to
    /// this sequence for an applied-watermark report in its next heartbeat (a
    /// client waits for the write to reach other regions); 0: nobody asks.
    pub report_after: u64,
}

/// A heartbeat's applied watermarks, in origin order, with their encoded length
/// (measured once: every copy of a relayed heartbeat is measured for the wire).
/// Shared: a heartbeat relayed to many peers copies none of them; empty (most
/// heartbeats), it allocates nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied(Option<(Watermarks, usize)>);

/// Watermarks by origin, shared.
type Watermarks = Arc<[(ReplicaId, Watermark)]>;

impl Applied {
    /// The encoded length of the watermarks (the repeated field, tags included).
    pub fn encoded_len(&self) -> usize {
        self.0.as_ref().map_or(0, |(_, len)| *len)
    }
}

impl std::ops::Deref for Applied {
    type Target = [(ReplicaId, Watermark)];

    fn deref(&self) -> &Self::Target {
        self.0.as_ref().map_or(&[], |(w, _)| w)
    }
}

impl From<Vec<(ReplicaId, Watermark)>> for Applied {
    fn from(v: Vec<(ReplicaId, Watermark)>) -> Self {
        let len = v
            .iter()
            .map(|(o, w)| {
                pb_len::message(
                    pb_len::string(o.as_str())
                        + pb_len::uint64(w.sequence)
                        + pb_len::uint64(w.timestamp.as_u64()),
                )
            })
            .sum();
        Applied((!v.is_empty()).then(|| (v.into(), len)))
    }
}

impl FromIterator<(ReplicaId, Watermark)> for Applied {
    fn from_iter<I: IntoIterator<Item = (ReplicaId, Watermark)>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<_>>().into()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapRequest {
    pub scope: ScopeId,
    pub origin: ReplicaId,
    pub from: u64,
    pub to: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapFill {
    pub scope: ScopeId,
    pub origin: ReplicaId,
    pub entries: Vec<LogEntry>,
    /// The first sequence the sender still retains (0: none).
    pub log_start: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotChunk {
    pub scope: ScopeId,
    pub snapshot_id: u64,
    pub index: u32,
    pub table: Arc<str>,
    pub rows: Vec<(Bytes, RowState)>,
    /// On the last chunk: the watermarks every row of the snapshot includes.
    pub watermarks: Vec<(ReplicaId, Watermark)>,
    pub last: bool,
}

/// A replication frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Mutations(Vec<LogEntry>),
    Heartbeats(Vec<Heartbeat>),
    GapRequest(GapRequest),
    GapFill(GapFill),
    SnapshotRequest { scope: ScopeId },
    SnapshotChunk(SnapshotChunk),
}

/// How the driver should schedule a frame (principle 6: serving first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrameClass {
    /// Heartbeats, gap requests: small and latency-sensitive.
    Control,
    /// The mutation stream.
    Replication,
    /// Snapshots: large, lowest priority.
    Bulk,
}

fn name<T: for<'a> From<&'a str>>(kind: &'static str, s: &str) -> Result<T, Error> {
    validate_name(kind, s)?;
    Ok(T::from(s))
}

fn scope_name(s: &str) -> Result<ScopeId, Error> {
    validate_scope(s)?;
    Ok(ScopeId::from(s))
}

fn watermarks_from(
    p: Vec<pb::OriginWatermark>,
    max: usize,
) -> Result<Vec<(ReplicaId, Watermark)>, Error> {
    if p.len() > max {
        return Err(Error::malformed(
            "watermark vector",
            format!("{} origins, limit {max}", p.len()),
        ));
    }
    p.into_iter()
        .map(|w| {
            Ok((
                name("replica", &w.origin)?,
                Watermark {
                    sequence: w.sequence,
                    timestamp: Timestamp::from_u64(w.timestamp),
                },
            ))
        })
        .collect()
}

/// Protobuf sizes, field by field (proto3: zero scalars and empty strings are not
/// encoded; every field number here is below 16, so a tag is one byte).
pub(crate) mod pb_len {
    pub(crate) fn varint(v: u64) -> usize {
        // 7 bits per byte; zero still takes one byte.
        (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
    }

    pub(crate) fn uint64(v: u64) -> usize {
        if v == 0 { 0 } else { 1 + varint(v) }
    }

    pub(crate) fn string(s: &str) -> usize {
        if s.is_empty() {
            0
        } else {
            1 + varint(s.len() as u64) + s.len()
        }
    }

    /// An embedded message (always encoded, even when empty) of `len` bytes.
    pub(crate) fn message(len: usize) -> usize {
        1 + varint(len as u64) + len
    }
}

/// `Frame::Heartbeats(hbs).encoded_len()`, computed without building the message.
pub fn heartbeats_encoded_len(hbs: &[Heartbeat]) -> usize {
    // ReplicationFrame { frame: heartbeats (field 3) = HeartbeatBatch { batch } }.
    pb_len::message(heartbeat_batch_body_len(hbs))
}

/// The length of `HeartbeatBatch { heartbeats: hbs }` (verbose), without its tag.
pub(crate) fn heartbeat_batch_body_len(hbs: &[Heartbeat]) -> usize {
    hbs.iter()
        .map(|h| {
            pb_len::message(
                pb_len::string(h.scope.as_str())
                    + pb_len::string(h.origin.as_str())
                    + pb_len::uint64(h.sequence)
                    + pb_len::uint64(h.timestamp.as_u64())
                    + h.applied.encoded_len()
                    + pb_len::uint64(h.purge.as_u64())
                    + pb_len::uint64(u64::from(h.tree_edge))
                    + pb_len::uint64(h.report_after),
            )
        })
        .sum()
}

fn watermarks_to(w: &[(ReplicaId, Watermark)]) -> Vec<pb::OriginWatermark> {
    w.iter()
        .map(|(o, w)| pb::OriginWatermark {
            origin: o.to_string(),
            sequence: w.sequence,
            timestamp: w.timestamp.as_u64(),
            vouched: 0,
        })
        .collect()
}

fn entries_from(
    p: Vec<pb::MutationFrame>,
    limits: &Limits,
    fl: &FrameLimits,
) -> Result<Vec<LogEntry>, Error> {
    if p.len() > fl.entries_max {
        return Err(Error::malformed(
            "mutation batch",
            format!("{} entries, limit {}", p.len(), fl.entries_max),
        ));
    }
    p.into_iter()
        .map(|f| LogEntry::from_frame(f, limits))
        .collect()
}

impl Frame {
    /// Parses a frame from a peer. `Hello` is the transport's business and refused here.
    pub fn from_proto(
        p: pb::ReplicationFrame,
        limits: &Limits,
        fl: &FrameLimits,
    ) -> Result<Frame, Error> {
        use pb::replication_frame::Frame as F;
        match p
            .frame
            .ok_or_else(|| Error::malformed("ReplicationFrame", "empty"))?
        {
            F::Hello(_) => Err(Error::malformed("ReplicationFrame", "unexpected Hello")),
            F::Mutations(b) => {
                if b.mutations.is_empty() {
                    return Err(Error::malformed("mutation batch", "empty"));
                }
                Ok(Frame::Mutations(entries_from(b.mutations, limits, fl)?))
            }
            F::Heartbeats(b) => {
                if !b.names.is_empty() || !b.packed.is_empty() {
                    return Err(Error::malformed(
                        "heartbeat batch",
                        "condensed heartbeats outside a stream (see link::LinkDecoder)",
                    ));
                }
                if b.heartbeats.len() > fl.heartbeats_max {
                    return Err(Error::malformed(
                        "heartbeat batch",
                        format!(
                            "{} heartbeats, limit {}",
                            b.heartbeats.len(),
                            fl.heartbeats_max
                        ),
                    ));
                }
                let hbs = b
                    .heartbeats
                    .into_iter()
                    .map(|h| {
                        Ok(Heartbeat {
                            scope: scope_name(&h.scope)?,
                            origin: name("replica", &h.origin)?,
                            sequence: h.sequence,
                            timestamp: Timestamp::from_u64(h.timestamp),
                            applied: watermarks_from(h.applied, fl.applied_max)?.into(),
                            purge: Timestamp::from_u64(h.purge_timestamp),
                            tree_edge: h.tree_edge,
                            report_after: h.report_after,
                        })
                    })
                    .collect::<Result<_, Error>>()?;
                Ok(Frame::Heartbeats(hbs))
            }
            F::GapRequest(g) => {
                if g.from_sequence == 0 || g.to_sequence < g.from_sequence {
                    return Err(Error::malformed(
                        "GapRequest",
                        format!("range {}..={}", g.from_sequence, g.to_sequence),
                    ));
                }
                Ok(Frame::GapRequest(GapRequest {
                    scope: scope_name(&g.scope)?,
                    origin: name("replica", &g.origin)?,
                    from: g.from_sequence,
                    to: g.to_sequence,
                }))
            }
            F::GapFill(g) => {
                let scope: ScopeId = scope_name(&g.scope)?;
                let origin: ReplicaId = name("replica", &g.origin)?;
                let entries = entries_from(g.mutations, limits, fl)?;
                if entries
                    .iter()
                    .any(|e| e.scope != scope || e.origin != origin)
                {
                    return Err(Error::malformed("GapFill", "entry of another stream"));
                }
                Ok(Frame::GapFill(GapFill {
                    scope,
                    origin,
                    entries,
                    log_start: g.log_start,
                }))
            }
            F::SnapshotRequest(s) => Ok(Frame::SnapshotRequest {
                scope: scope_name(&s.scope)?,
            }),
            F::SnapshotChunk(c) => {
                if c.rows.len() > fl.snapshot_rows_max {
                    return Err(Error::malformed(
                        "SnapshotChunk",
                        format!("{} rows, limit {}", c.rows.len(), fl.snapshot_rows_max),
                    ));
                }
                let table: Arc<str> = if c.table.is_empty() && c.rows.is_empty() {
                    Arc::from("")
                } else {
                    validate_name("table", &c.table)?;
                    c.table.as_str().into()
                };
                let rows = c
                    .rows
                    .into_iter()
                    .map(|r| {
                        let (key, row) = RowState::from_proto(r)?;
                        if key.is_empty() || key.len() > limits.row_key_bytes_max {
                            return Err(Error::malformed(
                                "SnapshotChunk",
                                format!("row key of {} bytes", key.len()),
                            ));
                        }
                        Ok((key, row))
                    })
                    .collect::<Result<_, Error>>()?;
                Ok(Frame::SnapshotChunk(SnapshotChunk {
                    scope: scope_name(&c.scope)?,
                    snapshot_id: c.snapshot_id,
                    index: c.index,
                    table,
                    rows,
                    watermarks: watermarks_from(c.watermarks, fl.applied_max)?,
                    last: c.last,
                }))
            }
        }
    }

    pub fn to_proto(&self) -> pb::ReplicationFrame {
        use pb::replication_frame::Frame as F;
        let f = match self {
            Frame::Mutations(es) => F::Mutations(pb::MutationBatch {
                mutations: es.iter().map(LogEntry::to_frame).collect(),
            }),
            Frame::Heartbeats(hbs) => F::Heartbeats(pb::HeartbeatBatch {
                heartbeats: hbs
                    .iter()
                    .map(|h| pb::Heartbeat {
                        scope: h.scope.to_string(),
                        origin: h.origin.to_string(),
                        sequence: h.sequence,
                        timestamp: h.timestamp.as_u64(),
                        applied: watermarks_to(&h.applied),
                        purge_timestamp: h.purge.as_u64(),
                        tree_edge: h.tree_edge,
                        report_after: h.report_after,
                    })
                    .collect(),
                names: Vec::new(),
                packed: Vec::new(),
            }),
            Frame::GapRequest(g) => F::GapRequest(pb::GapRequest {
                scope: g.scope.to_string(),
                origin: g.origin.to_string(),
                from_sequence: g.from,
                to_sequence: g.to,
            }),
            Frame::GapFill(g) => F::GapFill(pb::GapFill {
                scope: g.scope.to_string(),
                origin: g.origin.to_string(),
                mutations: g.entries.iter().map(LogEntry::to_frame).collect(),
                log_start: g.log_start,
            }),
            Frame::SnapshotRequest { scope } => F::SnapshotRequest(pb::SnapshotRequest {
                scope: scope.to_string(),
            }),
            Frame::SnapshotChunk(c) => F::SnapshotChunk(pb::SnapshotChunk {
                scope: c.scope.to_string(),
                snapshot_id: c.snapshot_id,
                index: c.index,
                table: c.table.to_string(),
                rows: c.rows.iter().map(|(k, r)| r.to_proto(k)).collect(),
                watermarks: watermarks_to(&c.watermarks),
                last: c.last,
            }),
        };
        pb::ReplicationFrame { frame: Some(f) }
    }

    /// Bytes on the wire (protobuf body; the transport adds a 4-byte length).
    pub fn encoded_len(&self) -> usize {
        self.to_proto().encoded_len()
    }

    /// Bytes on the wire, estimated without encoding for mutation batches (payload
    /// plus a fixed envelope per entry): flow control and WAN accounting call this
    /// for every frame, and encoding a batch just to measure it would copy every value.
    /// Heartbeats, the most frequent frames, are measured exactly without encoding
    /// (see [`heartbeats_encoded_len`]).
    pub fn wire_bytes(&self) -> usize {
        match self {
            Frame::Mutations(es) => 8 + es.iter().map(LogEntry::wire_bytes).sum::<usize>(),
            Frame::GapFill(g) => 32 + g.entries.iter().map(LogEntry::wire_bytes).sum::<usize>(),
            Frame::Heartbeats(hbs) => heartbeats_encoded_len(hbs),
            _ => self.encoded_len(),
        }
    }

    pub fn class(&self) -> FrameClass {
        match self {
            Frame::Mutations(_) | Frame::GapFill(_) => FrameClass::Replication,
            Frame::SnapshotChunk(_) => FrameClass::Bulk,
            Frame::Heartbeats(_) | Frame::GapRequest(_) | Frame::SnapshotRequest { .. } => {
                FrameClass::Control
            }
        }
    }

    /// The name used in rejection counters and traces.
    /// Entries (mutations, gap fills), heartbeats or rows (snapshot chunks) carried;
    /// 1 for a request.
    pub fn items(&self) -> usize {
        match self {
            Frame::Mutations(es) => es.len(),
            Frame::Heartbeats(hbs) => hbs.len(),
            Frame::GapRequest(_) | Frame::SnapshotRequest { .. } => 1,
            Frame::GapFill(g) => g.entries.len(),
            Frame::SnapshotChunk(c) => c.rows.len(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Mutations(_) => "mutations",
            Frame::Heartbeats(_) => "heartbeats",
            Frame::GapRequest(_) => "gap_request",
            Frame::GapFill(_) => "gap_fill",
            Frame::SnapshotRequest { .. } => "snapshot_request",
            Frame::SnapshotChunk(_) => "snapshot_chunk",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_sizes_are_exact() {
        let hb = |seq: u64, ts: u64, applied: usize, purge: u64| Heartbeat {
            scope: ScopeId::global(),
            origin: "eu-west-1a".into(),
            sequence: seq,
            timestamp: Timestamp::from_u64(ts),
            applied: (0..applied)
                .map(|i| {
                    (
                        ReplicaId::new(format!("r{i}")),
                        Watermark {
                            sequence: (i as u64) << (7 * (i % 9)),
                            timestamp: Timestamp::from_u64(ts >> i),
                        },
                    )
                })
                .collect(),
            purge: Timestamp::from_u64(purge),
            tree_edge: seq % 2 == 1,
            report_after: seq / 3,
        };
        let cases = vec![
            vec![],
            vec![hb(0, 0, 0, 0)],
            vec![hb(1, 127, 0, 128)],
            vec![hb(u64::MAX, u64::MAX, 3, u64::MAX)],
            (0..200)
                .map(|i| hb(i * 1_000_003, i << 40, (i % 30) as usize, i))
                .collect(),
        ];
        for hbs in cases {
            let f = Frame::Heartbeats(hbs);
            assert_eq!(f.wire_bytes(), f.encoded_len(), "{f:?}");
        }
    }
}
