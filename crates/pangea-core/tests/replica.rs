//! The replica state machine, specified by small scenarios in the quinn `Pair` style:
//! replicas in memory, frames moved by hand, time passed in.

use bytes::Bytes;
use pangea_core::frame::{Frame, FrameLimits, Heartbeat};
use pangea_core::read::{
    Consistency, Decision, PeerView, ReadRequest, Reason, RouteError, decide, plan_read,
};
use pangea_core::replica::{Config, Event, Reject, Replica};
use pangea_core::storage::{LogEntry, Storage};
use pangea_core::{
    Limits, MemStorage, Mutation, RowMutation, ScopeId, ScopeWatermarks, Timestamp, Token,
};
use pangea_proto::Message;
use pangea_topology::{RegionId, ReplicaId};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

mod common;
use common::{T0, at, deployment, pump, replica};

fn set(key: &str, value: &str) -> RowMutation {
    let m = Mutation::SetCell {
        family: "profile".into(),
        column: Bytes::from_static(b"p"),
        value: Bytes::from(value.to_owned()),
    };
    RowMutation::new("ad_profiles", key.to_owned(), vec![m], &Limits::default()).unwrap()
}

fn events(r: &mut Replica<MemStorage>) -> Vec<Event> {
    std::iter::from_fn(|| r.poll_event()).collect()
}

#[test]
fn a_write_is_acknowledged_only_after_flush_and_reaches_every_replica() {
    let d = deployment();
    let mut rs: BTreeMap<String, Replica<MemStorage>> = d
        .topology
        .replicas
        .keys()
        .map(|id| (id.to_string(), replica(&d, id.as_str())))
        .collect();
    let a = rs.get_mut("euw1-a").unwrap();
    let token = a.propose(at(1), set("us/1", "hello")).unwrap();
    assert!(
        !events(a).iter().any(|e| matches!(e, Event::Committed(_))),
        "not durable yet"
    );
    assert!(
        a.poll_transmit().is_none(),
        "nothing leaves before the flush"
    );
    a.flush(at(1)).unwrap();
    assert!(events(a).contains(&Event::Committed(token.clone())));
    pump(&mut rs, at(2));
    for (id, r) in &rs {
        let wm = r.watermarks(&ScopeId::global()).unwrap();
        assert!(wm.covers(&token), "{id} does not cover the write");
        let row = r.storage().get_row("ad_profiles", b"us/1").unwrap();
        assert_eq!(
            row.is_some(),
            d.topology.replicas[id.as_str()].role.stores_rows(),
            "{id}"
        );
    }
}

#[test]
fn a_lost_frame_is_repaired_from_a_neighbour() {
    let d = deployment();
    let mut a = replica(&d, "euw1-a");
    let mut b = replica(&d, "euw1-b");
    let t1 = a.propose(at(1), set("us/1", "one")).unwrap();
    a.flush(at(1)).unwrap();
    let t2 = a.propose(at(2), set("us/2", "two")).unwrap();
    a.flush(at(2)).unwrap();
    // Take the entries a sends to b, and lose the first.
    let entries: Vec<LogEntry> = std::iter::from_fn(|| a.poll_transmit())
        .filter(|t| t.to.as_str() == "euw1-b")
        .flat_map(|t| match t.frame {
            Frame::Mutations(es) => es,
            _ => vec![],
        })
        .collect();
    assert_eq!(entries.len(), 2);
    b.handle_frame(
        at(3),
        &"euw1-a".into(),
        Frame::Mutations(vec![entries[1].clone()]),
    )
    .unwrap();
    b.flush(at(3)).unwrap();
    assert!(
        !b.watermarks(&ScopeId::global()).unwrap().covers(&t2),
        "#2 waits for #1"
    );
    // After the grace period, b asks someone for #1; answer from a.
    let mut asked = None;
    for ms in (4..400).step_by(10) {
        b.handle_timeout(at(ms)).unwrap();
        for t in std::iter::from_fn(|| b.poll_transmit()) {
            if let Frame::GapRequest(g) = &t.frame {
                asked = Some((t.to.clone(), g.clone()));
            }
        }
        if asked.is_some() {
            break;
        }
    }
    let (to, gap) = asked.expect("a gap request");
    assert_eq!((gap.from, gap.to), (1, 1));
    assert_eq!(
        to.as_str(),
        "euw1-a",
        "the peer that sent the later entry is asked first"
    );
    a.handle_frame(at(300), &"euw1-b".into(), Frame::GapRequest(gap))
        .unwrap();
    let fill = std::iter::from_fn(|| a.poll_transmit())
        .find(|t| matches!(t.frame, Frame::GapFill(_)))
        .unwrap();
    b.handle_frame(at(301), &"euw1-a".into(), fill.frame)
        .unwrap();
    b.flush(at(301)).unwrap();
    let wm = b.watermarks(&ScopeId::global()).unwrap();
    assert!(wm.covers(&t1) && wm.covers(&t2));
}

/// Everything `a` has to send, marked sent; the log entries meant for `to`.
fn drain_entries_for(a: &mut Replica<MemStorage>, to: &ReplicaId) -> Vec<LogEntry> {
    let mut entries = Vec::new();
    while let Some(t) = a.poll_transmit() {
        a.handle_sent(&t.to, t.bytes);
        if let (true, Frame::Mutations(es)) = (t.to == *to, t.frame) {
            entries.extend(es);
        }
    }
    entries
}

/// A gap request that goes unanswered is asked again after a wait that doubles
/// each time (up to 8x): a slow answer (megabytes over a thin link) is not
/// buried under copies of itself. Here the only peer that stays alive (its
/// heartbeats arrive) never answers: at a fixed 200 ms, b would ask 50 times in
/// 10 s.
#[test]
fn unanswered_gap_requests_back_off() {
    let d = deployment();
    let mut a = replica(&d, "euw1-a");
    let mut b = replica(&d, "euw1-b");
    let b_id: ReplicaId = "euw1-b".into();
    for i in 0..3 {
        a.propose(at(1), set(&format!("us/{i}"), "v")).unwrap();
        a.flush(at(1)).unwrap();
    }
    let mut for_b = drain_entries_for(&mut a, &b_id);
    let last = for_b.pop().expect("entries for b");
    b.handle_frame(at(2), &"euw1-a".into(), Frame::Mutations(vec![last]))
        .unwrap();
    let mut asked_at = Vec::new();
    for ms in (10..10_000).step_by(10) {
        a.handle_timeout(at(ms)).unwrap();
        b.handle_timeout(at(ms)).unwrap();
        while let Some(t) = b.poll_transmit() {
            if matches!(t.frame, Frame::GapRequest(_)) {
                asked_at.push(ms);
            }
        }
        // Only a's heartbeats reach b: a stays alive and never answers.
        while let Some(t) = a.poll_transmit() {
            a.handle_sent(&t.to, t.bytes);
            if t.to == b_id && matches!(t.frame, Frame::Heartbeats(_)) {
                b.handle_frame(at(ms), &"euw1-a".into(), t.frame).unwrap();
            }
        }
    }
    let waits: Vec<u64> = asked_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        asked_at.len() <= 12,
        "asked {} times: {waits:?}",
        asked_at.len()
    );
    assert!(
        waits.iter().rev().take(3).all(|w| *w >= 1_600),
        "the waits grow to 8 x 200 ms: {waits:?}"
    );
}

/// A peer that asks again while the first answer has not left yet gets that one
/// answer, not a copy queued behind it.
#[test]
fn a_gap_asked_twice_before_its_answer_leaves_is_answered_once() {
    let d = deployment();
    let mut a = replica(&d, "euw1-a");
    let b_id: ReplicaId = "euw1-b".into();
    for i in 0..3 {
        a.propose(at(1), set(&format!("us/{i}"), "v")).unwrap();
        a.flush(at(1)).unwrap();
    }
    while let Some(t) = a.poll_transmit() {
        a.handle_sent(&t.to, t.bytes);
    }
    let ask = || {
        Frame::GapRequest(pangea_core::frame::GapRequest {
            scope: ScopeId::global(),
            origin: "euw1-a".into(),
            from: 1,
            to: 2,
        })
    };
    a.handle_frame(at(2), &b_id, ask()).unwrap();
    a.handle_frame(at(3), &b_id, ask()).unwrap();
    let fills = |a: &mut Replica<MemStorage>| {
        let mut n = 0;
        while let Some(t) = a.poll_transmit() {
            a.handle_sent(&t.to, t.bytes);
            n += usize::from(t.to == b_id && matches!(t.frame, Frame::GapFill(_)));
        }
        n
    };
    assert_eq!(fills(&mut a), 1);
    // Once it has left, a new request is answered again (the first may be lost).
    a.handle_frame(at(4), &b_id, ask()).unwrap();
    assert_eq!(fills(&mut a), 1);
}

/// A gap of large entries is answered in frames a peer can read (at most
/// `gap_fill_bytes_max`, far below the 17 MiB a peer reads), each answer leading
/// to the next request, until the requester has them all. Answered in one frame,
/// 40 entries of 1 MiB were a 40 MiB frame, which the peer refused, and the gap
/// was asked for again and again.
#[test]
fn a_gap_of_large_entries_is_filled_in_frames_a_peer_can_read() {
    let d = deployment();
    let mut a = replica(&d, "euw1-a");
    let mut b = replica(&d, "euw1-b");
    let b_id: ReplicaId = "euw1-b".into();
    let value = "x".repeat(1 << 20);
    let mut tokens = Vec::new();
    let mut for_b = Vec::new();
    for i in 0..40 {
        tokens.push(a.propose(at(1), set(&format!("us/{i}"), &value)).unwrap());
        a.flush(at(1)).unwrap();
        // Everything a sends is sent; what was meant for b is lost.
        for_b.extend(drain_entries_for(&mut a, &b_id));
    }
    assert_eq!(for_b.len(), 40);
    // b hears only the last entry, and so misses the 39 before it.
    let last = for_b.pop().expect("entries for b");
    b.handle_frame(at(2), &"euw1-a".into(), Frame::Mutations(vec![last]))
        .unwrap();
    let budget = Config::default().gap_fill_bytes_max;
    let mut fills = 0;
    let covered = |b: &Replica<MemStorage>| {
        let wm = b.watermarks(&ScopeId::global()).unwrap();
        tokens.iter().all(|t| wm.covers(t))
    };
    for ms in (10..5_000).step_by(20) {
        a.handle_timeout(at(ms)).unwrap();
        b.handle_timeout(at(ms)).unwrap();
        let asked: Vec<_> = std::iter::from_fn(|| b.poll_transmit()).collect();
        for t in asked.into_iter().filter(|t| t.to.as_str() == "euw1-a") {
            a.handle_frame(at(ms), &b_id, t.frame).unwrap();
        }
        while let Some(t) = a.poll_transmit() {
            a.handle_sent(&t.to, t.bytes);
            if t.to != b_id {
                continue;
            }
            if matches!(t.frame, Frame::GapFill(_)) {
                let bytes = t.frame.to_proto().encoded_len();
                // Within the budget, and below what a peer reads (17 MiB).
                assert!(
                    bytes <= budget + 4096 && bytes < 17 << 20,
                    "a gap fill of {bytes} bytes"
                );
                fills += 1;
            }
            b.handle_frame(at(ms), &"euw1-a".into(), t.frame).unwrap();
        }
        b.flush(at(ms)).unwrap();
        if covered(&b) {
            break;
        }
    }
    assert!(covered(&b), "b caught up after {fills} fills");
    assert!(fills >= 39 / (budget >> 20), "{fills} fills");
}

fn rejections(r: &mut Replica<MemStorage>) -> Vec<Reject> {
    events(r)
        .into_iter()
        .filter_map(|e| match e {
            Event::Rejected { reason, .. } => Some(reason),
            _ => None,
        })
        .collect()
}

#[test]
fn hostile_frames_are_refused_counted_and_change_nothing() {
    let d = deployment();
    let mut a = replica(&d, "euw1-a");
    let mut b = replica(&d, "use1-a");
    b.propose(at(1), set("us/1", "x")).unwrap();
    b.flush(at(1)).unwrap();
    let good = match std::iter::from_fn(|| b.poll_transmit())
        .find(|t| matches!(t.frame, Frame::Mutations(_)))
        .unwrap()
        .frame
    {
        Frame::Mutations(es) => es[0].clone(),
        _ => unreachable!(),
    };
    let from: ReplicaId = "use1-a".into();
    let before = a.storage().watermarks().unwrap();

    // A scope that does not exist here.
    let mut e = good.clone();
    e.scope = "nowhere".into();
    a.handle_frame(at(2), &from, Frame::Mutations(vec![e]))
        .unwrap();
    // A sequence far beyond the reorder window.
    let mut e = good.clone();
    e.sequence = 1_000_000;
    a.handle_frame(at(2), &from, Frame::Mutations(vec![e]))
        .unwrap();
    // A timestamp a minute in the future.
    let mut e = good.clone();
    e.timestamp = Timestamp::new(T0 + 60_000, 0);
    a.handle_frame(at(2), &from, Frame::Mutations(vec![e]))
        .unwrap();
    // A forged write of a's own stream.
    let mut e = good.clone();
    e.origin = "euw1-a".into();
    a.handle_frame(at(2), &from, Frame::Mutations(vec![e]))
        .unwrap();
    // A replica not in the topology.
    a.handle_frame(
        at(2),
        &"mallory".into(),
        Frame::Mutations(vec![good.clone()]),
    )
    .unwrap();
    // The restricted scope's heartbeat from outside the policy.
    let hb = Heartbeat {
        scope: "eu-resident".into(),
        origin: from.clone(),
        sequence: 0,
        timestamp: Timestamp::new(T0, 0),
        applied: Default::default(),
        purge: Timestamp::ZERO,
        tree_edge: true,
        report_after: 0,
    };
    a.handle_frame(at(2), &from, Frame::Heartbeats(vec![hb]))
        .unwrap();

    assert_eq!(
        rejections(&mut a),
        vec![
            Reject::UnknownScope,
            Reject::SequenceTooFarAhead,
            Reject::TimestampAhead,
            Reject::ForeignOwnSequence,
            Reject::UnknownPeer,
            Reject::NotInScope
        ]
    );
    assert_eq!(a.stats().rejected.values().sum::<u64>(), 6);
    a.flush(at(2)).unwrap();
    assert_eq!(a.storage().watermarks().unwrap(), before, "nothing applied");
    assert!(
        a.storage()
            .get_row("ad_profiles", b"us/1")
            .unwrap()
            .is_none()
    );
    // The honest entry still applies afterwards.
    a.handle_frame(at(3), &from, Frame::Mutations(vec![good]))
        .unwrap();
    assert!(
        a.storage()
            .get_row("ad_profiles", b"us/1")
            .unwrap()
            .is_some()
    );
}

#[test]
fn oversized_and_malformed_frames_fail_to_parse() {
    let limits = Limits::default();
    let fl = FrameLimits {
        entries_max: 2,
        ..Default::default()
    };
    let e = LogEntry {
        scope: ScopeId::global(),
        origin: "a".into(),
        sequence: 1,
        timestamp: Timestamp::ZERO,
        mutation: set("k", "v"),
    };
    let three = Frame::Mutations(vec![e.clone(), e.clone(), e.clone()]).to_proto();
    let err = Frame::from_proto(three, &limits, &fl).unwrap_err();
    assert!(err.to_string().contains("3 entries, limit 2"), "{err}");
    let empty = pangea_proto::v1::ReplicationFrame { frame: None };
    assert!(Frame::from_proto(empty, &limits, &fl).is_err());
    let mut zero = e;
    zero.sequence = 0;
    assert!(Frame::from_proto(Frame::Mutations(vec![zero]).to_proto(), &limits, &fl).is_err());
}

proptest! {
    /// Arbitrary bytes never panic the decoder, and whatever parses is bounded.
    #[test]
    fn frame_decoding_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(p) = pangea_proto::v1::ReplicationFrame::decode(&bytes[..]) {
            let _ = Frame::from_proto(p, &Limits::default(), &FrameLimits::default());
        }
    }
}

#[test]
fn restart_restores_streams_and_never_reuses_a_sequence() {
    let d = deployment();
    let mut a = replica(&d, "euw1-a");
    let t1 = a.propose(at(1), set("us/1", "one")).unwrap();
    a.flush(at(1)).unwrap();
    let lost = a.propose(at(2), set("us/2", "lost")).unwrap();
    // Crash before the flush: the second write was never acknowledged nor sent.
    let mut storage = a.into_storage();
    storage.crash();
    let mut a = Replica::new("euw1-a".into(), d, Config::default(), storage, 8, at(3)).unwrap();
    assert!(a.watermarks(&ScopeId::global()).unwrap().covers(&t1));
    let t2 = a.propose(at(4), set("us/3", "new")).unwrap();
    assert_eq!(
        t2.sequence, lost.sequence,
        "the lost write's number is free: nobody ever saw it"
    );
    assert!(t2.timestamp > t1.timestamp);
}

/// Every replica of `d` on an empty store.
fn all_replicas(d: &Arc<pangea_topology::Deployment>) -> BTreeMap<String, Replica<MemStorage>> {
    d.topology
        .replicas
        .keys()
        .map(|id| (id.to_string(), replica(d, id.as_str())))
        .collect()
}

/// Runs timers and moves frames every 50 ms from `from_ms` to `to_ms`.
fn run(rs: &mut BTreeMap<String, Replica<MemStorage>>, from_ms: u64, to_ms: u64) {
    for ms in (from_ms..=to_ms).step_by(50) {
        for r in rs.values_mut() {
            r.handle_timeout(at(ms)).unwrap();
        }
        pump(rs, at(ms));
    }
}

/// `euw1-a` wrote three rows that every replica applied, then lost its store and
/// came back empty under its old id; the rest of the cluster carried on.
fn euw1_a_came_back_empty(relearn: bool) -> (BTreeMap<String, Replica<MemStorage>>, Vec<Token>) {
    let d = deployment();
    let mut rs = all_replicas(&d);
    let a = rs.get_mut("euw1-a").unwrap();
    let old: Vec<Token> = (1..=3)
        .map(|i| a.propose(at(10), set(&format!("us/{i}"), "old")).unwrap())
        .collect();
    run(&mut rs, 10, 600);
    let mut fresh = Replica::new(
        "euw1-a".into(),
        d,
        Config::default(),
        MemStorage::new(),
        9,
        at(700),
    )
    .unwrap();
    if relearn {
        fresh.relearn_own_streams(at(700));
    }
    rs.insert("euw1-a".into(), fresh);
    (rs, old)
}

#[test]
fn a_replica_back_with_an_empty_store_relearns_its_stream_before_it_writes() {
    let (mut rs, old) = euw1_a_came_back_empty(true);
    let global = ScopeId::global();
    let a = rs.get_mut("euw1-a").unwrap();
    assert!(a.relearning_scopes().any(|s| *s == global));
    assert!(
        matches!(
            a.propose(at(700), set("us/new", "new")),
            Err(pangea_core::Error::OwnStreamUnknown { .. })
        ),
        "no write before it knows where its stream stands"
    );
    run(&mut rs, 700, 3_000);
    let a = rs.get_mut("euw1-a").unwrap();
    assert_eq!(a.relearning_scopes().count(), 0, "relearned everywhere");
    assert!(events(a).contains(&Event::OwnStreamLearned {
        scope: global.clone(),
        sequence: 3
    }));
    // Its old writes are back, from its peers.
    let wm = a.watermarks(&global).unwrap();
    for t in &old {
        assert!(wm.covers(t), "{t:?} not relearned");
    }
    assert!(
        a.storage()
            .get_row("ad_profiles", b"us/2")
            .unwrap()
            .is_some()
    );
    // A new write takes the next sequence, and every peer applies it.
    let new = a.propose(at(3_000), set("us/new", "new")).unwrap();
    assert_eq!(new.sequence, 4);
    run(&mut rs, 3_000, 3_500);
    for (id, r) in &rs {
        assert!(
            r.watermarks(&global).unwrap().covers(&new),
            "{id} did not apply the new write"
        );
        if r.deployment().topology.replicas[id.as_str()]
            .role
            .stores_rows()
        {
            assert!(
                r.storage()
                    .get_row("ad_profiles", b"us/new")
                    .unwrap()
                    .is_some(),
                "{id} lacks the new row"
            );
        }
    }
}

#[test]
fn without_relearning_an_empty_replica_reuses_its_sequences_and_its_writes_are_lost() {
    // What `relearn_own_streams` prevents: peers take the new write for a
    // duplicate of the old one of the same sequence, and drop it.
    let (mut rs, old) = euw1_a_came_back_empty(false);
    let a = rs.get_mut("euw1-a").unwrap();
    let new = a.propose(at(700), set("us/new", "new")).unwrap();
    assert_eq!(new.sequence, old[0].sequence, "sequence 1 again");
    run(&mut rs, 700, 1_500);
    let b = &rs["euw1-b"];
    assert!(
        b.storage()
            .get_row("ad_profiles", b"us/new")
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_lost_origin_stops_holding_bounded_reads_back_once_the_replicas_heard_vouch() {
    let d = deployment();
    let global = ScopeId::global();
    let mut rs = all_replicas(&d);
    let lost = ReplicaId::from("apne1-b");
    let o = rs.get_mut(lost.as_str()).unwrap();
    for i in 1..=3 {
        o.propose(at(10), set(&format!("us/{i}"), "v")).unwrap();
    }
    run(&mut rs, 10, 600);
    rs.remove(lost.as_str());
    run(&mut rs, 600, 4_000);
    let bounded = Consistency::BoundedStaleness { max_ms: 2_000 };
    let now_ms = T0 + 4_000;
    let r = &rs["euw1-a"];
    let wm = r.watermarks(&global).unwrap();
    assert_eq!(
        wm.get(&lost).sequence,
        3,
        "it has all the lost origin wrote"
    );
    assert!(
        decide_staleness(wm.low_watermark(), now_ms) > 3_000,
        "the lost origin's watermark stopped"
    );
    assert!(
        decide_staleness(wm.fresh_as_of(&lost), now_ms) <= 1_100,
        "vouched for by the replicas it hears, within two gossip periods"
    );
    assert_eq!(decide(&bounded, &wm, now_ms), Decision::Serve);
    assert_eq!(
        ScopeWatermarks::from_proto(&wm.to_proto()).freshness(),
        wm.freshness(),
        "clients see the same freshness"
    );

    // Cut off from everyone, a replica vouches for nobody: its freshness stops
    // and bounded reads go elsewhere.
    let mut alone: BTreeMap<String, Replica<MemStorage>> = BTreeMap::new();
    alone.insert("euw1-a".into(), rs.remove("euw1-a").unwrap());
    run(&mut alone, 4_000, 8_000);
    let wm = alone["euw1-a"].watermarks(&global).unwrap();
    assert!(matches!(
        decide(&bounded, &wm, T0 + 8_000),
        Decision::TooStale { lag_ms, .. } if lag_ms >= 3_000
    ));
}

/// A partition heals: the replicas of the far side, heard again, report writes of
/// an origin the near side counted fresh by vouching. The promise is about the
/// replicas heard since `t − d`, so the near replica stays fresh up to the moment
/// it heard them again — bounded reads keep answering while gap repair fetches
/// the writes — and no later: a bound shorter than the time since refuses.
#[test]
fn a_replica_heard_again_holds_bounded_reads_to_its_writes_from_then_on() {
    let d = deployment();
    let global = ScopeId::global();
    let mut rs = all_replicas(&d);
    run(&mut rs, 0, 600);
    // apne1 is cut off from the rest; use1-a writes on the other side.
    let mut near: BTreeMap<String, Replica<MemStorage>> = BTreeMap::new();
    for id in ["apne1-a", "apne1-b"] {
        near.insert(id.into(), rs.remove(id).unwrap());
    }
    let writer = ReplicaId::from("use1-a");
    for i in 1..=5 {
        let w = rs.get_mut(writer.as_str()).unwrap();
        w.propose(at(700 + i), set(&format!("us/{i}"), "v"))
            .unwrap();
    }
    for ms in (650..=4_000).step_by(50) {
        for side in [&mut rs, &mut near] {
            for r in side.values_mut() {
                r.handle_timeout(at(ms)).unwrap();
            }
            pump(side, at(ms));
        }
    }
    let bounded = Consistency::BoundedStaleness { max_ms: 2_000 };
    let wm = near["apne1-a"].watermarks(&global).unwrap();
    assert_eq!(
        wm.get(&writer).sequence,
        0,
        "the far side's writes are not here"
    );
    assert_eq!(
        decide(&bounded, &wm, T0 + 4_000),
        Decision::Serve,
        "the near side vouches for the far side's origins"
    );

    // The heal, with only heartbeats getting through (the writes' frames and
    // gap repair held back), until apne1-a hears the far side again.
    rs.append(&mut near);
    let mut heal = 4_000;
    let mut heard = false;
    while !heard {
        heal += 50;
        assert!(heal < 8_000, "apne1-a never heard the far side again");
        let ids: Vec<String> = rs.keys().cloned().collect();
        for id in &ids {
            let r = rs.get_mut(id).unwrap();
            r.handle_timeout(at(heal)).unwrap();
            r.flush(at(heal)).unwrap();
            for t in std::iter::from_fn(|| r.poll_transmit()).collect::<Vec<_>>() {
                rs.get_mut(id).unwrap().handle_sent(&t.to, t.bytes);
                if !matches!(t.frame, Frame::Heartbeats(_)) {
                    continue;
                }
                heard |= t.to.as_str() == "apne1-a" && !id.starts_with("apne1");
                if let Some(to) = rs.get_mut(t.to.as_str()) {
                    to.handle_frame(at(heal), &ReplicaId::from(id.as_str()), t.frame)
                        .unwrap();
                }
            }
        }
    }
    let r = &rs["apne1-a"];
    let wm = r.watermarks(&global).unwrap();
    assert_eq!(wm.get(&writer).sequence, 0, "still without them");
    assert!(
        wm.fresh_as_of(&writer).wall_ms() <= T0 + heal,
        "vouched no later than the heal: {:?}",
        wm.fresh_as_of(&writer)
    );
    assert_eq!(decide(&bounded, &wm, T0 + heal + 100), Decision::Serve);
    assert!(matches!(
        decide(&bounded, &wm, T0 + heal + 2_100),
        Decision::TooStale { .. }
    ));

    // Once every frame goes through, gap repair brings the writes within the
    // bound.
    run(&mut rs, heal, heal + 1_000);
    let wm = rs["apne1-a"].watermarks(&global).unwrap();
    assert_eq!(wm.get(&writer).sequence, 5);
    assert_eq!(decide(&bounded, &wm, T0 + heal + 1_000), Decision::Serve);
}

fn decide_staleness(t: Timestamp, now_ms: u64) -> u64 {
    pangea_core::read::staleness_ms(t, now_ms)
}

struct View(BTreeMap<ReplicaId, ScopeWatermarks>);

impl PeerView for View {
    fn rtt_ms(&self, _: &ReplicaId) -> Option<f64> {
        None
    }
    fn is_down(&self, r: &ReplicaId) -> bool {
        r.as_str() == "apne1-b"
    }
    fn covers(&self, r: &ReplicaId, token: &Token) -> bool {
        self.0.get(r).is_some_and(|w| w.covers(token))
    }
    fn freshness(&self, r: &ReplicaId, _: &ScopeId) -> Option<Timestamp> {
        self.0.get(r).map(ScopeWatermarks::freshness)
    }
}

#[test]
fn read_plans_follow_mode_profile_and_placement() {
    let d = deployment();
    let t = &d.topology;
    let frontend = &t.app_profiles["frontend"];
    let tokyo: RegionId = "ap-northeast-1".into();
    let view = View(BTreeMap::new());
    let plan = |key: &str, c: &Consistency, profile, view: &View| {
        plan_read(
            &d,
            &ReadRequest {
                client_region: &tokyo,
                profile,
                table: "ad_profiles",
                key: key.as_bytes(),
                consistency: c,
                deadline: None,
            },
            view,
            T0,
        )
    };
    // Eventual from Tokyo: the healthy Tokyo replica first, the failing one last.
    let p = plan("x/1", &Consistency::Eventual, frontend, &view).unwrap();
    assert_eq!(p.primary[0].replica.as_str(), "apne1-a");
    assert_eq!(p.primary.last().unwrap().replica.as_str(), "apne1-b");
    // A global row homed in us-east-1 is still read in Tokyo, where it is too...
    let p = plan("us/1", &Consistency::Eventual, frontend, &view).unwrap();
    assert_eq!(p.primary[0].replica.as_str(), "apne1-a");
    // ...but when the caller's region holds no replica of the row, the home region
    // goes first: from us-east-1, an EU-resident row homed in eu-west-1 is read there.
    let virginia: RegionId = "us-east-1".into();
    let req = ReadRequest {
        client_region: &virginia,
        profile: frontend,
        table: "ad_profiles",
        key: b"eu/1",
        consistency: &Consistency::Eventual,
        deadline: None,
    };
    let p = plan_read(&d, &req, &view, T0).unwrap();
    assert_eq!(
        d.topology.replicas[&p.primary[0].replica].region.as_str(),
        "eu-west-1"
    );
    assert_eq!(p.primary[0].reason, Reason::Home);
    // An EU-resident row never plans a replica outside eu-west-1.
    let p = plan("eu/1", &Consistency::Eventual, frontend, &view).unwrap();
    assert!(
        p.primary
            .iter()
            .all(|c| d.topology.replicas[&c.replica].region.as_str() == "eu-west-1")
    );
    // ...and a region-local Tokyo frontend has no replica allowed for it: fail closed.
    let local = &t.app_profiles["frontend-local"];
    assert!(matches!(
        plan("eu/1", &Consistency::Eventual, local, &view),
        Err(RouteError::NoEligibleReplica { .. })
    ));
    // Batch work goes to the batch replica only.
    let batch = &t.app_profiles["batch-training"];
    let p = plan("x/1", &Consistency::Eventual, batch, &view).unwrap();
    assert_eq!(
        p.primary
            .iter()
            .map(|c| c.replica.as_str())
            .collect::<Vec<_>>(),
        ["use1-batch"]
    );
    // Row affinity: the rendezvous replica of the caller's region, if healthy.
    let p = plan("x/7", &Consistency::RowAffinity, frontend, &view).unwrap();
    assert_eq!(
        Some(&p.primary[0].replica),
        d.affinity_replica(&tokyo, b"x/7")
            .filter(|r| r.as_str() != "apne1-b")
    );
    // Watermark: fall back to the origin and to replicas known to cover the token.
    let token = Token {
        scope: ScopeId::global(),
        origin: "use1-a".into(),
        sequence: 5,
        timestamp: Timestamp::new(T0, 0),
    };
    let view = View(BTreeMap::from([("euw1-b".into(), known_fresh())]));
    let p = plan("x/1", &Consistency::Watermark(token), frontend, &view).unwrap();
    let fb: Vec<_> = p
        .fallback
        .iter()
        .map(|c| (c.replica.as_str(), c.reason))
        .collect();
    assert_eq!(
        fb,
        [
            ("use1-a", Reason::OriginFallback),
            ("euw1-b", Reason::Covered)
        ]
    );
    // Bounded staleness: a replica known to be fresh goes first — unless its
    // round trip does not fit in the call's deadline (Tokyo to Virginia, in 20
    // ms), when the nearest, whose freshness is unknown, keeps its place.
    let view = View(BTreeMap::from([("use1-a".into(), known_fresh())]));
    let bounded = Consistency::BoundedStaleness { max_ms: 2_000 };
    let p = plan("x/1", &bounded, frontend, &view).unwrap();
    assert_eq!(
        (p.primary[0].replica.as_str(), p.primary[0].reason),
        ("use1-a", Reason::Fresh)
    );
    let in_20ms = plan_read(
        &d,
        &ReadRequest {
            client_region: &tokyo,
            profile: frontend,
            table: "ad_profiles",
            key: b"x/1",
            consistency: &bounded,
            deadline: Some(std::time::Duration::from_millis(20)),
        },
        &view,
        T0,
    )
    .unwrap();
    assert_eq!(in_20ms.primary[0].replica.as_str(), "apne1-a");
    assert!(in_20ms.primary.iter().all(|c| c.reason != Reason::Fresh));
}

/// What a replica that has applied use1-a's writes up to now reports.
fn known_fresh() -> ScopeWatermarks {
    let mut known = ScopeWatermarks::new(ScopeId::global());
    known.insert(
        "use1-a".into(),
        pangea_core::Watermark {
            sequence: 9,
            timestamp: Timestamp::new(T0, 0),
        },
    );
    known
}

#[test]
fn decisions_compare_sequences_and_staleness() {
    let mut wm = ScopeWatermarks::new(ScopeId::global());
    wm.insert(
        "a".into(),
        pangea_core::Watermark {
            sequence: 4,
            timestamp: Timestamp::new(T0 - 300, 0),
        },
    );
    wm.insert(
        "b".into(),
        pangea_core::Watermark {
            sequence: 9,
            timestamp: Timestamp::new(T0 - 100, 0),
        },
    );
    let token = |seq| Token {
        scope: ScopeId::global(),
        origin: "a".into(),
        sequence: seq,
        timestamp: Timestamp::new(T0 + 10_000, 0),
    };
    // Covered by sequence even though the token's timestamp is "in the future".
    assert_eq!(
        decide(&Consistency::Watermark(token(4)), &wm, T0),
        Decision::Serve
    );
    assert_eq!(
        decide(&Consistency::Watermark(token(5)), &wm, T0),
        Decision::NotCovered {
            origin: "a".into(),
            have: 4,
            need: 5
        }
    );
    assert_eq!(
        decide(&Consistency::BoundedStaleness { max_ms: 500 }, &wm, T0),
        Decision::Serve
    );
    assert_eq!(
        decide(&Consistency::BoundedStaleness { max_ms: 200 }, &wm, T0),
        Decision::TooStale {
            lag_ms: 300,
            max_ms: 200
        }
    );
    // As of a time: served once every origin is fresh as of it (origin "a",
    // 300 ms behind, holds it back); refused as a bound of `now - T` would be.
    assert_eq!(
        decide(&Consistency::AsOf { ms: T0 - 300 }, &wm, T0),
        Decision::Serve
    );
    assert_eq!(
        decide(&Consistency::AsOf { ms: T0 - 200 }, &wm, T0),
        Decision::TooStale {
            lag_ms: 300,
            max_ms: 200
        }
    );
    assert_eq!(
        Consistency::AsOf { ms: T0 - 200 }.staleness_bound_ms(T0),
        Some(200)
    );
}

/// I1, the clock fence: a replica whose clock is more than `max_offset` behind most of
/// the peers it hears from refuses writes, naming the offset, and takes them again
/// once its clock agrees; one peer far off fences nobody else; a single peer
/// heard fences nobody; late heartbeats do not pass for a clock ahead.
#[test]
fn a_replica_whose_clock_disagrees_with_most_peers_refuses_writes() {
    use pangea_core::Error;
    use pangea_core::hlc::ClockError;
    let d = deployment();
    let hb = |origin: &str, wall_ms: u64| Heartbeat {
        scope: "global".into(),
        origin: origin.into(),
        sequence: 0,
        timestamp: Timestamp::new(wall_ms, 0),
        applied: Default::default(),
        purge: Timestamp::ZERO,
        tree_edge: true,
        report_after: 0,
    };
    let hear = |r: &mut Replica<MemStorage>, now_ms: u64, peer: &str, offset_ms: i64| {
        let wall = (T0 + now_ms) as i64 + offset_ms;
        r.handle_frame(
            at(now_ms),
            &peer.into(),
            Frame::Heartbeats(vec![hb(peer, wall as u64)]),
        )
        .unwrap();
    };

    // use1-a's clock is 2 s behind three peers.
    let mut a = replica(&d, "use1-a");
    for p in ["use1-b", "euw1-a", "apne1-a"] {
        hear(&mut a, 100, p, 2_000);
    }
    let err = a.propose(at(101), set("g/1", "x")).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Clock(ClockError::Fenced {
                offset_ms: -2_000,
                peers_off: 3,
                peers_heard: 3,
                ..
            })
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("-2000 ms off 3 of the 3 peers"),
        "{err}"
    );
    // Its clock is fixed: the peers agree again. The fence lifts once no reading in
    // the window (two half-windows of 5 s) disagrees.
    for p in ["use1-b", "euw1-a", "apne1-a"] {
        hear(&mut a, 200, p, 3);
    }
    assert!(
        a.clock_fence(at(201)).is_some(),
        "the window still remembers"
    );
    for t in [5_300, 10_400] {
        for p in ["use1-b", "euw1-a", "apne1-a"] {
            hear(&mut a, t, p, 3);
        }
    }
    assert_eq!(a.clock_fence(at(10_401)), None);
    a.propose(at(10_401), set("g/1", "x")).unwrap();

    // One peer far ahead, two agreeing: the odd one out is the peer, not us.
    let mut b = replica(&d, "use1-b");
    hear(&mut b, 100, "use1-a", 5_000);
    hear(&mut b, 100, "euw1-a", -2);
    hear(&mut b, 100, "apne1-a", 4);
    assert_eq!(b.clock_fence(at(101)), None);
    b.propose(at(101), set("g/2", "y")).unwrap();

    // A single peer heard, far off: nobody can tell whose clock is wrong.
    let mut c = replica(&d, "euw1-a");
    hear(&mut c, 100, "use1-a", 5_000);
    assert_eq!(c.clock_fence(at(101)), None);
    // Heartbeats older than the window do not count.
    let mut e = replica(&d, "euw1-b");
    for p in ["use1-b", "euw1-a", "apne1-a"] {
        hear(&mut e, 100, p, 2_000);
    }
    assert!(e.clock_fence(at(101)).is_some());
    assert_eq!(
        e.clock_fence(at(100 + 10_001)),
        None,
        "old heartbeats expire"
    );

    // A backlog of late heartbeats (after a pause or a partition) reads as peers far
    // behind; their fresh heartbeats in the same window show the clocks agree.
    let mut f = replica(&d, "apne1-b");
    for p in ["use1-b", "euw1-a", "apne1-a"] {
        hear(&mut f, 100, p, 1);
        hear(&mut f, 2_000, p, -1_500);
    }
    assert_eq!(
        f.clock_fence(at(2_001)),
        None,
        "late heartbeats are not a clock"
    );
    // Every peer reading far behind (our clock ahead, or only late heartbeats): not
    // fenced here; the peers refuse our timestamps instead (I1, above).
    let mut g = replica(&d, "apne1-a");
    for p in ["use1-b", "euw1-a", "apne1-b"] {
        hear(&mut g, 100, p, -2_000);
    }
    assert_eq!(g.clock_fence(at(101)), None);
}

/// I8's inbound neighbours: a replica forwards to a member outside its tree only
/// while that member's own heartbeats say it holds this replica as a tree
/// neighbour (`tree_edge`). The same heartbeat without the flag, or relayed by the
/// member for another origin, adopts nobody; an adoption lapses when the flagged
/// heartbeats stop.
#[test]
fn only_a_senders_own_tree_edge_heartbeat_makes_it_an_inbound_neighbour() {
    let d = deployment();
    let tree = d.tree(&ScopeId::global(), None);
    let me: ReplicaId = "euw1-a".into();
    // A member that is not our tree neighbour, and a third origin.
    let (far, other) = {
        let mut outside = d
            .topology
            .replicas
            .keys()
            .filter(|r| **r != me && !tree.neighbours(&me).contains(r));
        (
            outside.next().unwrap().clone(),
            outside.next().unwrap().clone(),
        )
    };
    let hb = |origin: &ReplicaId, tree_edge: bool, ms: u64| Heartbeat {
        scope: ScopeId::global(),
        origin: origin.clone(),
        sequence: 0,
        timestamp: Timestamp::new(T0 + ms, 0),
        applied: Default::default(),
        purge: Timestamp::ZERO,
        tree_edge,
        report_after: 0,
    };
    let mut a = replica(&d, me.as_str());
    // Whether a write proposed at `ms` is sent to `far`.
    let sends_to_far = |a: &mut Replica<MemStorage>, ms: u64| {
        a.propose(at(ms), set(&format!("us/{ms}"), "x")).unwrap();
        a.flush(at(ms)).unwrap();
        std::iter::from_fn(|| a.poll_transmit())
            .any(|t| t.to == far && matches!(t.frame, Frame::Mutations(_)))
    };
    assert!(!sends_to_far(&mut a, 1), "not a tree neighbour");
    let frame = |hbs| Frame::Heartbeats(hbs);
    a.handle_frame(at(2), &far, frame(vec![hb(&far, false, 2)]))
        .unwrap();
    assert!(!sends_to_far(&mut a, 3), "its heartbeat without the flag");
    a.handle_frame(at(4), &far, frame(vec![hb(&other, true, 4)]))
        .unwrap();
    assert!(
        !sends_to_far(&mut a, 5),
        "another origin's heartbeat, relayed"
    );
    a.handle_frame(at(6), &far, frame(vec![hb(&far, true, 6)]))
        .unwrap();
    assert!(sends_to_far(&mut a, 7), "it holds us as a tree neighbour");
    // No flagged heartbeat for longer than the adoption lasts: forgotten.
    let lapse_ms = 10_000;
    a.handle_timeout(at(lapse_ms)).unwrap();
    assert!(!sends_to_far(&mut a, lapse_ms + 1), "the adoption lapsed");
}

/// Probes of suspected members do not ask them to forward to us (`tree_edge`
/// unset): hearing the probe is what heals a cut tree, while adopting every prober
/// made each replica forward a healed partition's backlog to the whole other side.
#[test]
fn probes_of_suspected_members_do_not_ask_for_a_feed() {
    let d = deployment();
    let mut a = replica(&d, "euw1-a");
    // Nobody is heard: every peer is suspected within a few suspicion delays (the
    // nearest on the tree first), and the probe rounds after that reach each of them.
    let mut probed = BTreeMap::new();
    for ms in (0..=8_000).step_by(50) {
        a.handle_timeout(at(ms)).unwrap();
        a.flush(at(ms)).unwrap();
        let out: Vec<_> = std::iter::from_fn(|| a.poll_transmit()).collect();
        for t in out {
            a.handle_sent(&t.to, t.bytes);
            if let Frame::Heartbeats(hbs) = t.frame
                && ms > 6_000
            {
                for hb in hbs {
                    *probed.entry(t.to.clone()).or_insert(false) |= hb.tree_edge;
                }
            }
        }
    }
    assert_eq!(a.suspected().count(), d.topology.replicas.len() - 1);
    assert_eq!(probed.len(), d.topology.replicas.len() - 1, "{probed:?}");
    assert!(probed.values().all(|flag| !flag), "{probed:?}");
}

/// A `MemStorage` whose sync fails while `failing` is set (a disk that refuses an
/// fsync): everything else goes to the store.
struct FlakySync {
    inner: MemStorage,
    failing: bool,
}

impl Storage for FlakySync {
    fn get_row(
        &self,
        table: &str,
        key: &[u8],
    ) -> Result<Option<pangea_core::RowState>, pangea_core::StorageError> {
        self.inner.get_row(table, key)
    }

    fn scan_range(
        &self,
        table: &str,
        range: &pangea_core::BytesRange,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Bytes, pangea_core::RowState)>, pangea_core::StorageError> {
        self.inner.scan_range(table, range, reverse, limit)
    }

    fn tables(&self) -> Result<Vec<Arc<str>>, pangea_core::StorageError> {
        self.inner.tables()
    }

    fn write(
        &mut self,
        batch: pangea_core::storage::WriteBatch,
    ) -> Result<(), pangea_core::StorageError> {
        self.inner.write(batch)
    }

    fn sync(&mut self) -> Result<(), pangea_core::StorageError> {
        if self.failing {
            return Err(pangea_core::StorageError::Io {
                doing: "syncing the journal",
                source: pangea_core::EngineError::new(std::io::Error::other("fsync refused")),
            });
        }
        self.inner.sync()
    }

    fn read_log(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
        from: u64,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Vec<LogEntry>, pangea_core::StorageError> {
        self.inner
            .read_log(scope, origin, from, max_entries, max_bytes)
    }

    fn log_bounds(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
    ) -> Result<Option<(u64, u64)>, pangea_core::StorageError> {
        self.inner.log_bounds(scope, origin)
    }

    fn watermarks(
        &self,
    ) -> Result<Vec<(ScopeId, ReplicaId, pangea_core::Watermark)>, pangea_core::StorageError> {
        self.inner.watermarks()
    }

    fn meta(&self, key: &str) -> Result<Option<Bytes>, pangea_core::StorageError> {
        self.inner.meta(key)
    }
}

/// A flush whose sync fails acknowledges nothing and advertises nothing new; the
/// next flush that syncs does both.
#[test]
fn a_failed_flush_advances_nothing_and_the_next_one_does() {
    let d = deployment();
    let mut r = Replica::new(
        "euw1-a".into(),
        d,
        Config::default(),
        FlakySync {
            inner: MemStorage::new(),
            failing: false,
        },
        7,
        at(0),
    )
    .unwrap();
    r.flush(at(0)).unwrap();
    let drained = |r: &mut Replica<FlakySync>| std::iter::from_fn(|| r.poll_event()).count();
    drained(&mut r);
    let global = ScopeId::global();
    let before = r.watermarks(&global).unwrap();
    let token = r.propose(at(1), set("us/1", "hello")).unwrap();
    r.storage_mut().failing = true;
    assert!(r.flush(at(1)).is_err());
    let after_failure: Vec<Event> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(
        !after_failure
            .iter()
            .any(|e| matches!(e, Event::Committed(_) | Event::WatermarkAdvanced { .. })),
        "{after_failure:?}"
    );
    assert_eq!(
        r.watermarks(&global).unwrap(),
        before,
        "nothing new is durable"
    );
    assert!(!r.watermarks(&global).unwrap().covers(&token));
    r.storage_mut().failing = false;
    r.flush(at(2)).unwrap();
    let after: Vec<Event> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(
        after.contains(&Event::Committed(token.clone())),
        "{after:?}"
    );
    assert!(
        after.iter().any(|e| matches!(
            e,
            Event::WatermarkAdvanced { origin, watermark, .. }
                if *origin == token.origin && watermark.sequence == token.sequence
        )),
        "{after:?}"
    );
    assert!(r.watermarks(&global).unwrap().covers(&token));
}

/// A write that would take its row past `Limits::row_bytes_max` is refused at the
/// origin with an error naming the row's size after it and the limit; one that
/// replaces cells (`profile` keeps one version) or deletes is measured by what the
/// row would hold, not by what the write adds.
#[test]
fn a_write_that_would_grow_its_row_past_the_limit_is_refused() {
    let d = deployment();
    let config = Config {
        limits: Limits {
            row_bytes_max: 1_000,
            ..Limits::default()
        },
        ..Config::default()
    };
    let mut r = Replica::new("euw1-a".into(), d, config, MemStorage::new(), 7, at(0)).unwrap();
    let cell = |column: &str, bytes: usize| {
        let m = Mutation::SetCell {
            family: "profile".into(),
            column: Bytes::from(column.to_owned()),
            value: Bytes::from(vec![b'x'; bytes]),
        };
        RowMutation::new("ad_profiles", "g/big", vec![m], &Limits::default()).unwrap()
    };
    r.propose(at(1), cell("a", 599)).unwrap(); // 600 bytes held
    // Replacing `a` keeps the row at 600 + 0: allowed although 600 + 600 > 1,000.
    r.propose(at(2), cell("a", 599)).unwrap();
    let e = r.propose(at(3), cell("b", 599)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "row after the write is 1200 bytes, limit 1000",
        "{e:?}"
    );
    assert_eq!(
        r.storage()
            .row_value_bytes("ad_profiles", b"g/big")
            .unwrap(),
        600
    );
    // Within the limit it goes.
    r.propose(at(4), cell("b", 399)).unwrap();
    assert_eq!(
        r.storage()
            .row_value_bytes("ad_profiles", b"g/big")
            .unwrap(),
        1_000
    );
    // Deletes never grow a row: they are not even measured.
    let del = RowMutation::new(
        "ad_profiles",
        "g/big",
        vec![Mutation::DeleteFromRow],
        &Limits::default(),
    )
    .unwrap();
    r.propose(at(5), del).unwrap();
}

/// A write whose client waits for other regions: the origin's heartbeats ask for
/// reports (`want_reports`), and every replica that applied the write says so in
/// its next heartbeat instead of its next periodic report, here never (applied
/// gossip every million heartbeats). `regions_applied` reads the answers.
#[test]
fn replicas_report_a_write_a_client_waits_for_at_once() {
    let d = deployment();
    let config = Config {
        applied_gossip_every: 1_000_000,
        ..Config::default()
    };
    let mut rs: BTreeMap<String, Replica<MemStorage>> = d
        .topology
        .replicas
        .keys()
        .map(|id| {
            let r = Replica::new(
                id.clone(),
                d.clone(),
                config.clone(),
                MemStorage::new(),
                7,
                at(0),
            );
            (id.to_string(), r.unwrap())
        })
        .collect();
    // The one periodic report (the first heartbeat) goes by.
    run(&mut rs, 0, 200);
    let global = ScopeId::global();
    let a = rs.get_mut("euw1-a").unwrap();
    let t = a.propose(at(210), set("us/1", "v")).unwrap();
    run(&mut rs, 250, 1_000);
    let a = &rs["euw1-a"];
    let (reached, all) = a
        .regions_applied(&global, &a.id().clone(), t.sequence)
        .unwrap();
    let regions = |names: &[&str]| names.iter().map(|n| RegionId::new(*n)).collect();
    assert_eq!(all, regions(&["ap-northeast-1", "eu-west-1", "us-east-1"]));
    assert_eq!(
        reached,
        regions(&["eu-west-1"]),
        "only the origin knows, unasked"
    );
    rs.get_mut("euw1-a")
        .unwrap()
        .want_reports(&global, t.sequence);
    // The request and the reports travel with heartbeats, relayed hop by hop
    // along the tree (a hop a round here): four rounds, not a periodic report.
    run(&mut rs, 1_050, 1_250);
    let a = &rs["euw1-a"];
    let (reached, _) = a
        .regions_applied(&global, &a.id().clone(), t.sequence)
        .unwrap();
    assert_eq!(reached, all, "asked, every region reported");
    // Asked for a write not applied anywhere else yet: no region but the origin.
    let a = rs.get_mut("euw1-a").unwrap();
    let t2 = a.propose(at(1_160), set("us/2", "v")).unwrap();
    let (reached, _) = a
        .regions_applied(&global, &a.id().clone(), t2.sequence)
        .unwrap();
    assert!(
        reached.is_empty(),
        "not even durable at the origin: {reached:?}"
    );
}

/// A log every member has applied is purged in slices of at most 2,000 entries,
/// the next one due 10 ms after a slice that stopped at the budget, until it is
/// all gone: a replica taking in a bulk load is never held up by one purge of
/// everything a second brought.
#[test]
fn a_long_applied_log_is_purged_in_slices() {
    // Without a change stream (the local cluster's ad_profiles keeps its log
    // an hour for one), the log goes as soon as every member has applied it.
    let mut d = (*deployment()).clone();
    for t in d.placement.schema.tables.values_mut() {
        t.change_retention_ms = None;
    }
    let d = Arc::new(d);
    let mut rs = all_replicas(&d);
    let a = rs.get_mut("euw1-a").unwrap();
    let mut last = None;
    for i in 0..5_000 {
        last = Some(a.propose(at(1), set(&format!("us/{i:05}"), "v")).unwrap());
        if i % 500 == 499 {
            a.flush(at(1)).unwrap();
        }
    }
    let last = last.unwrap();
    pump(&mut rs, at(2));
    let origin = ReplicaId::from("euw1-a");
    let bounds = |rs: &BTreeMap<String, Replica<MemStorage>>| {
        rs["euw1-a"]
            .storage()
            .log_bounds(&last.scope, &origin)
            .unwrap()
    };
    assert_eq!(bounds(&rs), Some((1, 5_000)));
    // Timers every 5 ms, so that a purge's next slice is seen on time.
    let mut firsts = vec![1];
    let mut ms = 3;
    while ms < 10_000 && bounds(&rs).is_some() {
        for r in rs.values_mut() {
            r.handle_timeout(at(ms)).unwrap();
        }
        pump(&mut rs, at(ms));
        let first = bounds(&rs).map_or(5_001, |(f, _)| f);
        if first != *firsts.last().unwrap() {
            firsts.push(first);
            // A slice that stopped at its budget has its next one due soon.
            if first <= 5_000 {
                let due = rs["euw1-a"].poll_timeout().unwrap();
                assert!(due <= at(ms).mono_us + 10_000, "next slice due at {due}");
            }
        }
        ms += 5;
    }
    assert_eq!(
        firsts,
        vec![1, 2_001, 4_001, 5_001],
        "purged in slices of 2,000, then the rest"
    );
}

/// Event time (the row module): a table that declares a window takes a
/// write's own timestamp within it, refuses one outside with an error naming
/// the table, the time and the bound, and every replica stores the cells at
/// the event time (so the family's TTL counts from it), while the write is
/// logged, replicated and covered by tokens at the clock's time.
#[test]
fn event_times_are_taken_within_the_window_and_are_the_cells_version_everywhere() {
    use pangea_core::{Error, ReadFilter};
    use pangea_topology::schema::EventTimeWindow;
    const DAY: u64 = 86_400_000;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    let mut dep = pangea_topology::Deployment::load(
        &root.join("local-3-regions.toml"),
        Some(&root.join("local-3-regions.placement.toml")),
    )
    .unwrap();
    // A table without a window refuses event times.
    let window = dep.placement.schema.tables.get_mut("ad_profiles").unwrap();
    assert!(window.event_time.is_some(), "the shipped file declares one");
    window.event_time = None;
    let event = |family: &str, column: &str, ms: u64| {
        let m = Mutation::SetCell {
            family: family.into(),
            column: Bytes::from(column.to_owned()),
            value: Bytes::from_static(b"v"),
        };
        RowMutation::new("ad_profiles", "us/7", vec![m], &Limits::default())
            .unwrap()
            .at_event_time(ms)
    };
    let d = Arc::new(dep.clone());
    let mut r = replica(&d, "use1-a");
    let e = r
        .propose(at(1), event("events", "click:1", T0))
        .unwrap_err();
    assert!(
        matches!(e, Error::EventTime { .. }) && e.to_string().contains("takes no event times"),
        "{e}"
    );
    dep.placement
        .schema
        .tables
        .get_mut("ad_profiles")
        .unwrap()
        .event_time = Some(EventTimeWindow {
        past_ms: 90 * DAY,
        future_ms: 60_000,
    });
    let d = Arc::new(dep);
    let mut rs: BTreeMap<String, Replica<MemStorage>> = d
        .topology
        .replicas
        .keys()
        .map(|id| (id.to_string(), replica(&d, id.as_str())))
        .collect();
    let now = at(10);
    let a = rs.get_mut("use1-a").unwrap();
    // 91 days back and two minutes ahead are outside; the errors say by how much.
    for (ms, needle) in [
        (T0 - 91 * DAY, "at most 7776000000 ms back"),
        (T0 + 10 + 120_000, "at most 60000 ms ahead"),
    ] {
        let e = a.propose(now, event("events", "click:x", ms)).unwrap_err();
        assert!(e.to_string().contains(needle), "{e}");
        assert!(e.to_string().contains("\"ad_profiles\""), "{e}");
    }
    // An increment keeps the clock's time.
    let inc = RowMutation::new(
        "ad_profiles",
        "us/7",
        vec![Mutation::Increment {
            family: "impressions".into(),
            column: Bytes::from_static(b"c"),
            delta: 1,
        }],
        &Limits::default(),
    )
    .unwrap()
    .at_event_time(T0);
    let e = a.propose(now, inc).unwrap_err();
    assert!(e.to_string().contains("an increment"), "{e}");
    assert_eq!(a.storage().get_row("ad_profiles", b"us/7").unwrap(), None);
    // Within the window: an event 40 days old (past the family's 30-day TTL)
    // and one of an hour ago.
    let old = a
        .propose(now, event("events", "click:old", T0 - 40 * DAY))
        .unwrap();
    let recent = a
        .propose(now, event("events", "click:recent", T0 - 3_600_000))
        .unwrap();
    assert!(old.timestamp.wall_ms() >= T0 && recent.timestamp > old.timestamp);
    pump(&mut rs, at(20));
    let table = d.placement.schema.table("ad_profiles");
    for (id, r) in &rs {
        if !d.topology.replicas[id.as_str()].role.stores_rows() {
            continue;
        }
        let wm = r.watermarks(&ScopeId::global()).unwrap();
        assert!(wm.covers(&recent), "{id}");
        let row = r
            .storage()
            .get_row("ad_profiles", b"us/7")
            .unwrap()
            .unwrap();
        let read = row
            .read(
                &Bytes::from_static(b"us/7"),
                &ReadFilter::everything(),
                table,
                T0 + 20,
            )
            .unwrap();
        let cells: Vec<_> = read.families[0]
            .cells
            .iter()
            .map(|c| {
                (
                    c.column.to_vec(),
                    Timestamp::from_u64(c.timestamp).wall_ms(),
                )
            })
            .collect();
        // The 40-day-old event is past its TTL from the start: never shown.
        assert_eq!(
            cells,
            vec![(b"click:recent".to_vec(), T0 - 3_600_000)],
            "{id}"
        );
    }
}

/// Every replica of a deployment whose `ad_profiles` keeps its change stream
/// for 3 s, after euw1-a wrote `us/0`..`us/9` and every replica applied them.
fn ten_writes_kept_for_3s() -> (
    Arc<pangea_topology::Deployment>,
    BTreeMap<String, Replica<MemStorage>>,
    Vec<Token>,
) {
    let mut d = (*deployment()).clone();
    let table = d.placement.schema.tables.get_mut("ad_profiles").unwrap();
    table.change_retention_ms = Some(3_000);
    let d = Arc::new(d);
    let mut rs = all_replicas(&d);
    let a = rs.get_mut("euw1-a").unwrap();
    let tokens: Vec<Token> = (0..10)
        .map(|i| a.propose(at(1), set(&format!("us/{i}"), "v")).unwrap())
        .collect();
    pump(&mut rs, at(2));
    (d, rs, tokens)
}

/// Change streams (the `changes` module): with a table's `changes.retention`,
/// an origin's log keeps entries every member applied until they are that old,
/// a reader from the start sees each write once in its order, and once the
/// retention has passed the log is purged and a cursor from before it is
/// refused by name rather than answered with a gap.
#[test]
fn a_change_stream_reads_the_log_kept_for_its_retention() {
    use pangea_core::changes::{self, ChangesError, Cursor, Query, Stream};
    let (_, mut rs, tokens) = ten_writes_kept_for_3s();
    // Every member has applied them; two compactions later they are kept.
    run(&mut rs, 50, 2_000);
    let (scope, origin) = (&tokens[0].scope, ReplicaId::from("euw1-a"));
    let bounds = |rs: &BTreeMap<String, Replica<MemStorage>>, id: &str| {
        rs[id].storage().log_bounds(scope, &origin).unwrap()
    };
    assert_eq!(bounds(&rs, "euw1-a"), Some((1, 10)));
    assert_eq!(
        bounds(&rs, "use1-a"),
        Some((1, 10)),
        "kept where applied too"
    );
    let q = Query {
        table: "ad_profiles",
        prefix: b"us/",
        limit: 100,
        scan_max: 10_000,
        bytes_max: 1 << 20,
    };
    // A page of use1-a's stream from `from`.
    let read_at = |rs: &BTreeMap<String, Replica<MemStorage>>, from: &Cursor| {
        let r = &rs["use1-a"];
        let streams: Vec<Stream> = r
            .watermarks(scope)
            .unwrap()
            .iter()
            .map(|(o, w)| Stream {
                scope: scope.clone(),
                origin: o.clone(),
                durable: w.sequence,
            })
            .collect();
        changes::read(r.storage(), &streams, from, &q)
    };
    let page = read_at(&rs, &Cursor::default()).unwrap();
    let seen: Vec<u64> = page.changes.iter().map(|c| c.sequence).collect();
    assert_eq!(seen, (1..=10).collect::<Vec<_>>());
    assert_eq!(page.changes[3].mutation.row_key().as_ref(), b"us/3");
    assert_eq!(page.changes[3].timestamp, tokens[3].timestamp);
    // Past the retention: purged, and the old cursor is refused.
    run(&mut rs, 2_050, 4_500);
    assert_eq!(bounds(&rs, "use1-a"), None);
    let err = read_at(&rs, &Cursor::default()).unwrap_err();
    assert!(
        matches!(err, ChangesError::Expired { read: 0, .. }),
        "{err}"
    );
    // The cursor the reader had kept reads on.
    let page = read_at(&rs, &page.cursor).unwrap();
    assert!(page.changes.is_empty() && !page.more);
}

/// Registered readers (`changes::Readers`): a reader registered at a cursor
/// holds the log entries after it past the retention, so it reads on from
/// there; once it registers further on, compaction purges what it has read.
/// The registration survives a restart (replica metadata).
#[test]
fn a_registered_reader_holds_the_log_past_the_retention() {
    use pangea_core::changes::{Cursor, Stream};
    let (d, mut rs, tokens) = ten_writes_kept_for_3s();
    let (scope, origin) = (tokens[0].scope.clone(), ReplicaId::from("euw1-a"));
    // use1-a's reader has read the first four.
    let read_up_to = |q: u64| {
        Cursor::at(&[Stream {
            scope: scope.clone(),
            origin: origin.clone(),
            durable: q,
        }])
    };
    rs.get_mut("use1-a")
        .unwrap()
        .register_reader(at(3), "pipeline", read_up_to(4))
        .unwrap();
    let bounds = |rs: &BTreeMap<String, Replica<MemStorage>>, id: &str| {
        rs[id].storage().log_bounds(&scope, &origin).unwrap()
    };
    // Past the retention: purged elsewhere, held after the reader's cursor here.
    run(&mut rs, 50, 4_500);
    assert_eq!(bounds(&rs, "use1-b"), None);
    assert_eq!(bounds(&rs, "use1-a"), Some((5, 10)));
    // A restart keeps the registration.
    let r = rs.remove("use1-a").unwrap();
    let reopened = Replica::new(
        "use1-a".into(),
        d,
        r.config().clone(),
        r.into_storage(),
        7,
        at(4_600),
    )
    .unwrap();
    assert_eq!(reopened.readers().iter().count(), 1);
    rs.insert("use1-a".into(), reopened);
    run(&mut rs, 4_600, 5_000);
    assert_eq!(bounds(&rs, "use1-a"), Some((5, 10)));
    // It read on: the rest goes.
    rs.get_mut("use1-a")
        .unwrap()
        .register_reader(at(5_001), "pipeline", read_up_to(10))
        .unwrap();
    run(&mut rs, 5_001, 7_000);
    assert_eq!(bounds(&rs, "use1-a"), None);
}
