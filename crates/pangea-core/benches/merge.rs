//! Merge-rule throughput: `cargo bench -p pangea-core --bench merge`.
//!
//! - `apply_set`: one SetCell into a profile row of 8 columns (max 3 versions);
//! - `rmw_1k`: the store's read-modify-write path for a 1 KiB profile: decode the
//!   stored row, apply, encode.

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pangea_core::{Mutation, RowState, Timestamp, Version};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::schema::{GcPolicy, Schema};

fn profile_row(schema: &Schema) -> RowState {
    let mut row = RowState::default();
    for i in 0..8u64 {
        let m = Mutation::SetCell {
            family: "p".into(),
            column: Bytes::from(format!("col{i}")),
            value: Bytes::from(vec![i as u8; 128]),
        };
        row.apply(
            &Version::new(Timestamp::new(1_000 + i, 0), "a".into()),
            &[m],
            schema.table("t"),
        );
    }
    row
}

fn bench(c: &mut Criterion) {
    let schema = Schema::single_table(
        "t",
        &[(
            "p",
            GcPolicy {
                max_versions: Some(3),
                ttl_ms: None,
                ..GcPolicy::default()
            },
        )],
    );
    let table = schema.table("t");
    let mut g = c.benchmark_group("merge");
    g.throughput(Throughput::Elements(1));
    let base = profile_row(&schema);
    let m = [Mutation::SetCell {
        family: "p".into(),
        column: Bytes::from_static(b"col3"),
        value: Bytes::from(vec![7u8; 128]),
    }];
    let mut t = 10_000u64;
    g.bench_function("apply_set", |b| {
        let mut row = base.clone();
        b.iter(|| {
            t += 1;
            row.apply(&Version::new(Timestamp::new(t, 0), "b".into()), &m, table);
        });
    });
    let stored = base.to_proto(&Bytes::new()).encode_to_vec();
    g.bench_function("rmw_1k", |b| {
        b.iter(|| {
            t += 1;
            let (_, mut row) =
                RowState::from_proto(pb::RowState::decode(&stored[..]).unwrap()).unwrap();
            row.apply(&Version::new(Timestamp::new(t, 0), "b".into()), &m, table);
            row.to_proto(&Bytes::new()).encode_to_vec()
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
