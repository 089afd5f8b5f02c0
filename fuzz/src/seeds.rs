//! The seed corpus: a few valid inputs per target, made with the real encoders (and
//! real replicas), so the fuzzer starts past the outer checks. Written to
//! `corpus/<target>/seed-*` by `cargo run --example gen_corpus`.

use crate::replication::frame_len;
use crate::{REPLICA, at, deployment};
use bytes::Bytes;
use pangea_core::frame::{Frame, GapRequest, SnapshotChunk};
use pangea_core::replica::{Config, Replica};
use pangea_core::{
    Limits, MemStorage, Mutation, ReplicaId, RowMutation, RowState, ScopeId, TimeRange, Timestamp,
    Token, Version,
};
use pangea_net::encode_frame;
use pangea_proto::v1 as pb;
use std::path::Path;

/// (target, file name, contents).
pub type Seed = (&'static str, String, Vec<u8>);

pub fn all() -> Vec<Seed> {
    let mut seeds = Vec::new();
    seeds.extend(tokens());
    seeds.extend(client_frames());
    seeds.extend(filters());
    seeds.extend(replication_frames());
    seeds.extend(topologies());
    seeds.extend(merges());
    seeds
}

fn set(key: &str, family: &str, value: &str) -> RowMutation {
    RowMutation::new(
        "ad_profiles",
        key.to_owned(),
        vec![Mutation::SetCell {
            family: family.into(),
            column: Bytes::from_static(b"p"),
            value: Bytes::from(value.to_owned()),
        }],
        &Limits::default(),
    )
    .expect("a valid mutation")
}

fn deletes(key: &str) -> RowMutation {
    RowMutation::new(
        "ad_profiles",
        key.to_owned(),
        vec![
            Mutation::SetCell {
                family: "events".into(),
                column: Bytes::from_static(b"click"),
                value: Bytes::from_static(b"1"),
            },
            Mutation::DeleteFromColumn {
                family: "events".into(),
                column: Bytes::from_static(b"view"),
                range: TimeRange {
                    start: Timestamp::new(crate::T0_MS, 0),
                    end: Some(Timestamp::new(crate::T0_MS + 10, 0)),
                },
            },
            Mutation::DeleteFromFamily {
                family: "profile".into(),
            },
        ],
        &Limits::default(),
    )
    .expect("a valid mutation")
}

fn frames<M: pangea_proto::Message>(msgs: &[M]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        out.extend_from_slice(&encode_frame(m).expect("encodes"));
    }
    out
}

fn tokens() -> Vec<Seed> {
    let t = |scope: &str, origin: &str, sequence, ms| Token {
        scope: scope.into(),
        origin: origin.into(),
        sequence,
        timestamp: Timestamp::new(ms, 3),
    };
    vec![
        (
            "token",
            "seed-global".into(),
            t("global", "euw1-a", 1, crate::T0_MS).encode().to_vec(),
        ),
        (
            "token",
            "seed-eu-resident".into(),
            t("eu-resident", "euw1-b", u64::MAX, u64::MAX >> 16)
                .encode()
                .to_vec(),
        ),
        (
            "token",
            "seed-long-names".into(),
            t(&"s".repeat(128), &"o".repeat(128), 42, 0)
                .encode()
                .to_vec(),
        ),
    ]
}

fn client_frames() -> Vec<Seed> {
    use pb::client_request::Request as R;
    let req = |request| pb::ClientRequest {
        deadline_us: 1_000_000,
        app_profile: "frontend".into(),
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        known_watermarks: 0,
        request: Some(request),
    };
    let mutate = |m: RowMutation| {
        req(R::Mutate(pb::MutateRequest {
            mutation: Some(m.to_proto()),
            ..Default::default()
        }))
    };
    let get = |key: &str, consistency: Option<pb::consistency::Mode>, filter| {
        req(R::Get(pb::GetRequest {
            table: "ad_profiles".into(),
            row_key: Bytes::from(key.to_owned()),
            filter,
            consistency: consistency.map(|mode| pb::Consistency { mode: Some(mode) }),
        }))
    };
    // The token the harness's replica returns for its first write (same replica,
    // same seed, same time as the harness's first frame).
    let mut r = Replica::new(
        ReplicaId::from(REPLICA),
        deployment(),
        Config::default(),
        MemStorage::new(),
        7,
        at(0),
    )
    .expect("replica");
    let token = r
        .propose(at(7), set("us/1", "profile", "hello"))
        .expect("propose");
    let filter = pb::RowFilter {
        families: vec!["profile".into()],
        columns: vec![pb::ColumnRef {
            family: "events".into(),
            column: Bytes::from_static(b"click"),
        }],
        versions_per_column: 2,
        cells: None,
    };
    use pb::consistency::Mode;
    let write_then_read = frames(&[
        mutate(set("us/1", "profile", "hello")),
        get("us/1", Some(Mode::WatermarkToken(token.encode())), None),
        get(
            "us/1",
            Some(Mode::BoundedStalenessMs(100)),
            Some(filter.clone()),
        ),
        get(
            "us/1",
            Some(Mode::RowAffinity(pb::consistency::RowAffinity {})),
            None,
        ),
    ]);
    let eu = frames(&[
        mutate(set("eu/7", "profile", "bonjour")),
        mutate(deletes("eu/7")),
        req(R::GetMany(pb::GetManyRequest {
            table: "ad_profiles".into(),
            row_keys: vec![Bytes::from_static(b"eu/7"), Bytes::from_static(b"eu/8")],
            filter: Some(filter),
            consistency: None,
            ..Default::default()
        })),
        req(R::ScanPrefix(pb::ScanPrefixRequest {
            table: "ad_profiles".into(),
            prefix: Bytes::from_static(b"eu/"),
            filter: None,
            consistency: Some(pb::Consistency {
                mode: Some(Mode::Eventual(pb::consistency::Eventual {})),
            }),
            limit: 1,
            resume_after: Bytes::new(),
            ..Default::default()
        })),
        req(R::Watermarks(pb::WatermarkRequest {
            scope: String::new(),
        })),
        req(R::LocationChanges(pb::LocationChangesRequest {
            cursor: Bytes::from_static(b"\x02\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0\x05"),
            limit: 2,
        })),
        // The EU rows' change stream from the start, then from a cursor at #1.
        req(R::Changes(pb::ChangesRequest {
            table: "ad_profiles".into(),
            prefix: Bytes::from_static(b"eu/"),
            from_earliest: true,
            limit: 10,
            ..Default::default()
        })),
        req(R::Changes(pb::ChangesRequest {
            table: "ad_profiles".into(),
            cursor: pangea_core::changes::Cursor::default().encode(),
            limit: 1,
            ..Default::default()
        })),
        // As a registered reader (a loader's; refused to others).
        req(R::Changes(pb::ChangesRequest {
            table: "ad_profiles".into(),
            limit: 1,
            reader: "pipeline".into(),
            ..Default::default()
        })),
    ]);
    // A loader's merge of a pre-versioned row, then reads of it.
    let mut merged = RowState::default();
    merged.apply(
        &Version::new(Timestamp::new(crate::T0_MS - 60_000, 0), "use1-a".into()),
        set("us/9", "profile", "old").mutations(),
        None,
    );
    let merge = RowMutation::new(
        "ad_profiles",
        "us/9",
        vec![Mutation::MergeRow(Box::new(merged.clone()))],
        &Limits::default(),
    )
    .expect("a valid merge");
    let mut merge = merge.to_proto();
    for m in &mut merge.mutations {
        if let Some(pb::mutation::Kind::MergeRow(r)) = &mut m.kind
            && let Some(state) = &mut r.state
        {
            state.key = Bytes::from_static(b"us/9");
        }
    }
    let loader = frames(&[
        req(R::Mutate(pb::MutateRequest {
            mutation: Some(merge),
            ..Default::default()
        })),
        get("us/9", None, None),
    ]);
    // What an operator may and may not do: watermarks, a scan of `_jobs`, a forged
    // location entry (refused to everyone).
    let forged = RowMutation::new(
        "_location",
        pangea_core::location::location_key("ad_profiles", b""),
        vec![Mutation::SetCell {
            family: "l".into(),
            column: Bytes::from_static(b"e"),
            value: Bytes::from_static(b"\x0a\x04nope"),
        }],
        &Limits::default(),
    )
    .expect("a valid mutation");
    let operator = frames(&[
        req(R::Watermarks(pb::WatermarkRequest {
            scope: String::new(),
        })),
        req(R::ScanPrefix(pb::ScanPrefixRequest {
            table: "_jobs".into(),
            limit: 10,
            ..Default::default()
        })),
        mutate(forged),
        get("us/1", None, None),
    ]);
    // Server-side cell filters (a tree of every kind of leaf) on a get, and a
    // reverse scan of a key range with a qualifier regex.
    use pangea_core::filter::{BytesRange, CellFilter, Pattern};
    let b = |s: &'static str| Bytes::from_static(s.as_bytes());
    let tree = CellFilter::Chain(vec![
        CellFilter::Interleave(vec![
            CellFilter::Family("events".into()),
            CellFilter::QualifierPrefix(b("cl")),
            CellFilter::QualifierRange(BytesRange::prefix(b"p")),
        ]),
        CellFilter::TimestampRange {
            start_ms: crate::T0_MS,
            end_ms: Some(crate::T0_MS + 60_000),
        },
        CellFilter::ValueRange(BytesRange {
            start: std::ops::Bound::Included(b("0")),
            end: std::ops::Bound::Excluded(b("z")),
        }),
        CellFilter::LatestPerColumn(2),
        CellFilter::CellsPerRowOffset(1),
        CellFilter::CellsPerRowLimit(3),
    ]);
    let regex = CellFilter::QualifierRegex(Pattern::new("c.*k|p").expect("a valid regex"));
    let with = |cells: CellFilter| pb::RowFilter {
        cells: Some(cells.to_proto()),
        versions_per_column: 3,
        ..Default::default()
    };
    let filters = frames(&[
        mutate(set("us/2", "profile", "hi")),
        mutate(deletes("us/3")),
        get("us/2", None, Some(with(tree))),
        req(R::ScanPrefix(pb::ScanPrefixRequest {
            table: "ad_profiles".into(),
            prefix: b("us/"),
            filter: Some(with(regex)),
            range: Some(
                BytesRange {
                    start: std::ops::Bound::Excluded(b("us/1")),
                    end: std::ops::Bound::Included(b("us/3")),
                }
                .to_proto(),
            ),
            reverse: true,
            limit: 1,
            resume_after: b("us/3"),
            row_sample: 0.5,
            keys_only: true,
            ..Default::default()
        })),
    ]);
    // The first byte picks the caller (`client::principal`): 0 a frontend client,
    // 1 a loader, 2 an operator.
    let as_caller = |who: u8, frames: Vec<u8>| [vec![who], frames].concat();
    vec![
        (
            "client_frame",
            "seed-write-then-read".into(),
            as_caller(0, write_then_read),
        ),
        ("client_frame", "seed-eu-rows".into(), as_caller(0, eu)),
        ("client_frame", "seed-filters".into(), as_caller(0, filters)),
        (
            "client_frame",
            "seed-loader-merge".into(),
            as_caller(1, loader),
        ),
        (
            "client_frame",
            "seed-operator".into(),
            as_caller(2, operator),
        ),
    ]
}

/// Read filters: a tree of every kind of node, and a family list with versions.
fn filters() -> Vec<Seed> {
    use pangea_core::filter::{BytesRange, CellFilter, Pattern};
    use pangea_proto::Message as _;
    use std::ops::Bound;
    let tree = CellFilter::Chain(vec![
        CellFilter::Interleave(vec![
            CellFilter::QualifierPrefix(Bytes::from_static(b"click:")),
            CellFilter::QualifierRegex(Pattern::new("view:0[0-9]").expect("a valid regex")),
            CellFilter::Family("profile".into()),
        ]),
        CellFilter::QualifierRange(BytesRange::prefix(b"c")),
        CellFilter::TimestampRange {
            start_ms: crate::T0_MS,
            end_ms: Some(crate::T0_MS + 200),
        },
        CellFilter::ValueRange(BytesRange {
            start: Bound::Excluded(Bytes::from_static(b"0")),
            end: Bound::Unbounded,
        }),
        CellFilter::LatestPerColumn(2),
        CellFilter::CellsPerRowOffset(1),
        CellFilter::CellsPerRowLimit(5),
    ]);
    let with_tree = pangea_core::ReadFilter {
        versions_per_column: 2,
        cells: Some(tree),
        ..Default::default()
    };
    let families = pangea_core::ReadFilter {
        families: vec!["events".into()],
        versions_per_column: 3,
        ..Default::default()
    };
    vec![
        (
            "filter",
            "seed-tree".into(),
            with_tree.to_proto().encode_to_vec(),
        ),
        (
            "filter",
            "seed-families".into(),
            families.to_proto().encode_to_vec(),
        ),
    ]
}

/// The selector byte that makes `peer` the sender in the replication harness.
fn sender(peer: &str) -> u8 {
    let d = deployment();
    let i = d
        .topology
        .replicas
        .keys()
        .filter(|id| id.as_str() != REPLICA)
        .position(|id| id.as_str() == peer)
        .expect("a peer");
    u8::try_from(i).expect("few replicas")
}

/// What the real replica `peer` sends to the harness's replica while it writes.
fn stream_from(peer: &str, writes: &[RowMutation]) -> Vec<u8> {
    let mut p = Replica::new(
        ReplicaId::from(peer),
        deployment(),
        Config::default(),
        MemStorage::new(),
        11,
        at(0),
    )
    .expect("replica");
    let mut out = vec![sender(peer)];
    let mut ms = 0;
    // As the node sends them: heartbeats condensed on the stream.
    let mut link = pangea_core::link::LinkEncoder::default();
    let mut take = |p: &mut Replica<MemStorage>, out: &mut Vec<u8>, ms: u64| {
        p.handle_timeout(at(ms)).expect("timeout");
        p.flush(at(ms)).expect("flush");
        while let Some(t) = p.poll_transmit() {
            p.handle_sent(&t.to, t.bytes);
            if t.to.as_str() == REPLICA {
                out.extend_from_slice(&encode_frame(&link.encode(&t.frame)).expect("encodes"));
            }
        }
    };
    for w in writes {
        ms += 3;
        p.propose(at(ms), w.clone()).expect("propose");
        take(&mut p, &mut out, ms);
    }
    for _ in 0..3 {
        ms += 60;
        take(&mut p, &mut out, ms);
    }
    out
}

fn replication_frames() -> Vec<Seed> {
    let writes = [
        set("us/1", "profile", "a"),
        set("eu/1", "profile", "b"),
        deletes("us/1"),
        set("us/2", "events", "c"),
    ];
    let from_b = stream_from("euw1-b", &writes);
    let from_us = stream_from("use1-a", &[writes[0].clone(), writes[3].clone()]);
    // Control and bulk frames, by hand.
    let global = ScopeId::global();
    let mut row = RowState::default();
    let w = set("us/9", "profile", "snap");
    row.apply(
        &Version::new(Timestamp::new(crate::T0_MS, 1), "euw1-b".into()),
        w.mutations(),
        deployment().placement.schema.table("ad_profiles"),
    );
    let control = [
        Frame::GapRequest(GapRequest {
            scope: global.clone(),
            origin: REPLICA.into(),
            from: 1,
            to: 3,
        }),
        Frame::SnapshotRequest {
            scope: global.clone(),
        },
        Frame::SnapshotChunk(SnapshotChunk {
            scope: global,
            snapshot_id: 1,
            index: 0,
            table: "ad_profiles".into(),
            rows: vec![(Bytes::from_static(b"us/9"), row)],
            watermarks: vec![(
                "euw1-b".into(),
                pangea_core::Watermark {
                    sequence: 1,
                    timestamp: Timestamp::new(crate::T0_MS, 1),
                },
            )],
            last: true,
        }),
    ];
    let mut control_stream = vec![sender("euw1-b")];
    control_stream.extend(frames(
        &control.iter().map(Frame::to_proto).collect::<Vec<_>>(),
    ));
    for s in [&from_b, &from_us, &control_stream] {
        // Whole frames only.
        let mut rest = &s[1..];
        while !rest.is_empty() {
            rest = &rest[frame_len(rest)..];
        }
    }
    vec![
        (
            "replication_frame",
            "seed-writes-from-euw1-b".into(),
            from_b,
        ),
        (
            "replication_frame",
            "seed-writes-from-use1-a".into(),
            from_us,
        ),
        (
            "replication_frame",
            "seed-control-and-snapshot".into(),
            control_stream,
        ),
    ]
}

fn topologies() -> Vec<Seed> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology");
    let read = |name: &str| {
        std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("topology/{name}: {e}"))
    };
    let mut seeds = Vec::new();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("topology/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    for name in &names {
        seeds.push(("topology", format!("seed-{name}"), read(name)));
    }
    for (t, p) in [
        ("four-continents.toml", "placement.toml"),
        ("local-3-regions.toml", "local-3-regions.placement.toml"),
        ("single-replica.toml", "single-replica.placement.toml"),
    ] {
        let mut both = read(t);
        both.push(0);
        both.extend(read(p));
        seeds.push(("topology", format!("seed-{t}+{p}"), both));
    }
    seeds
}

fn merges() -> Vec<Seed> {
    // Pseudo-random bytes (xorshift): `arbitrary` turns any bytes into an input.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..4)
        .map(|i| {
            let len = 96 << i;
            let bytes = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            ("merge", format!("seed-{len}"), bytes)
        })
        .collect()
}
