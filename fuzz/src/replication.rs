//! Replication frames: what a replica does with the bytes of a peer's stream.
//!
//! The input's first byte picks the sending peer (any replica of the topology but
//! the receiver); the rest is the stream. As `pangea-node`'s `peers::read_stream`
//! does after the Hello: read a length-prefixed `pb::ReplicationFrame`
//! (`pangea_net::decode_frame` with `FRAME_BYTES_MAX`), parse it with the stream's
//! `LinkDecoder` (condensed heartbeats) under the replica's limits, and hand it to
//! `Replica::handle_frame`; a malformed frame is `Replica::note_malformed`, an
//! oversized prefix or malformed heartbeats end the stream. Between frames the harness plays the driver:
//! time advances, the replica flushes and fires its timers, and what it sends is
//! drained.
//!
//! Checked besides "no panic": with in-memory storage the replica's calls never
//! fail; durable watermarks never go backwards (I6); every frame the replica sends
//! encodes within the frame limit and parses back, on the receiving side (through a
//! `LinkEncoder`/`LinkDecoder` pair per receiver), to the same frame.

use crate::{REPLICA, at, deployment};
use pangea_core::frame::Frame;
use pangea_core::link::{LinkDecoder, LinkEncoder};
use pangea_core::replica::{Config, Now, Replica};
use pangea_core::storage::Watermark;
use pangea_core::{MemStorage, ReplicaId, ScopeId, Storage};
use pangea_net::{FRAME_BYTES_MAX, decode_frame, encode_frame};
use pangea_proto::v1 as pb;
use std::collections::BTreeMap;

/// Milliseconds between two frames of the stream: past the 5 ms heartbeat forwarding
/// delay, and every few frames past the heartbeat interval and gap grace.
const STEP_MS: u64 = 23;

pub fn replication_frame(data: &[u8]) {
    let Some((&sel, mut stream)) = data.split_first() else {
        return;
    };
    let d = deployment();
    let me = ReplicaId::from(REPLICA);
    let others: Vec<&ReplicaId> = d.topology.replicas.keys().filter(|id| **id != me).collect();
    let from = others[usize::from(sel) % others.len()].clone();
    let mut r = Replica::new(
        me,
        d.clone(),
        Config::default(),
        MemStorage::new(),
        7,
        at(0),
    )
    .expect("an in-memory replica opens");
    let (limits, frame_limits) = (r.config().limits, r.config().frame_limits);
    let mut durable = BTreeMap::new();
    let mut decoder = LinkDecoder::default();
    let mut links = Links::default();
    let mut ms = 0;
    loop {
        ms += STEP_MS;
        let now = at(ms);
        let used = match decode_frame::<pb::ReplicationFrame>(stream, FRAME_BYTES_MAX) {
            // The stream ends inside a frame (or at a boundary).
            Ok(None) => break,
            Ok(Some((p, used))) => {
                let stateful = matches!(p.frame, Some(pb::replication_frame::Frame::Heartbeats(_)));
                match decoder.decode(p, &limits, &frame_limits) {
                    Ok(frame) => r
                        .handle_frame(now, &from, frame)
                        .expect("handle_frame on in-memory storage"),
                    // The node closes the link: the decoder is out of step.
                    Err(_) if stateful => {
                        r.note_malformed(&from);
                        break;
                    }
                    Err(_) => r.note_malformed(&from),
                }
                used
            }
            // The node stops reading: the stream cannot be resynchronized.
            Err(pangea_net::Error::FrameTooLarge { .. }) => {
                r.note_malformed(&from);
                break;
            }
            // The whole body was read; the next frame follows it.
            Err(pangea_net::Error::FrameDecode(_)) => {
                r.note_malformed(&from);
                frame_len(stream)
            }
            Err(e) => panic!("decode_frame returned a transport error: {e}"),
        };
        stream = &stream[used..];
        drive(&mut r, now, &mut links);
        check_durable_watermarks(&r, &mut durable);
    }
    // Let timers run out (gap requests, suspicion, compaction) once more.
    let now = at(ms + 1_500);
    r.handle_timeout(now).expect("handle_timeout");
    drive(&mut r, now, &mut links);
    check_durable_watermarks(&r, &mut durable);
}

/// The bytes of a frame whose prefix and body are all in `buf`.
pub(crate) fn frame_len(buf: &[u8]) -> usize {
    let header: [u8; 4] = buf[..4].try_into().expect("a whole prefix");
    4 + u32::from_be_bytes(header) as usize
}

/// Per receiver, both ends of the stream the replica sends it.
pub(crate) type Links = BTreeMap<ReplicaId, (LinkEncoder, LinkDecoder)>;

/// One turn of the driver: timers, flush, then what the replica sends and reports.
pub(crate) fn drive(r: &mut Replica<MemStorage>, now: Now, links: &mut Links) {
    r.handle_timeout(now)
        .expect("handle_timeout on in-memory storage");
    r.flush(now).expect("flush on in-memory storage");
    while let Some(t) = r.poll_transmit() {
        let link = links.entry(t.to.clone()).or_default();
        check_outgoing(&t.frame, link);
        r.handle_sent(&t.to, t.bytes);
    }
    while r.poll_event().is_some() {}
}

/// What a replica sends must be what its peers accept: within the byte limit, and
/// parsed back to the same frame.
fn check_outgoing(frame: &Frame, (encoder, decoder): &mut (LinkEncoder, LinkDecoder)) {
    let p = encoder.encode(frame);
    let bytes = encode_frame(&p).expect("an outgoing frame encodes");
    let (decoded, used) = decode_frame::<pb::ReplicationFrame>(&bytes, FRAME_BYTES_MAX)
        .expect("an outgoing frame is within FRAME_BYTES_MAX")
        .expect("a whole frame");
    assert_eq!(used, bytes.len());
    let config = Config::default();
    let back = decoder
        .decode(decoded, &config.limits, &config.frame_limits)
        .unwrap_or_else(|e| panic!("a peer refuses the frame we send ({e}): {frame:?}"));
    assert_eq!(&back, frame, "an outgoing frame changes on the wire");
}

/// I6: durable watermarks, as storage holds them, never go backwards.
fn check_durable_watermarks(
    r: &Replica<MemStorage>,
    seen: &mut BTreeMap<(ScopeId, ReplicaId), Watermark>,
) {
    let now: BTreeMap<_, _> = r
        .storage()
        .watermarks()
        .expect("watermarks of in-memory storage")
        .into_iter()
        .map(|(s, o, w)| ((s, o), w))
        .collect();
    for (key, before) in seen.iter() {
        let after = now
            .get(key)
            .unwrap_or_else(|| panic!("durable watermark {key:?} disappeared"));
        assert!(
            after.sequence >= before.sequence && after.timestamp >= before.timestamp,
            "durable watermark {key:?} went backwards: {before:?} -> {after:?}"
        );
    }
    *seen = now;
}
