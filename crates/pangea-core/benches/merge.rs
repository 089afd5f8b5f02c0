//! Merge-rule throughput: `cargo bench -p pangea-core --bench merge`.
//!
//! - `apply_set`: one SetCell into a profile row of 8 columns (max 3 versions);
//! - `rmw_1k`: the store's read-modify-write path for a 1 KiB profile: decode the
//!   stored row, apply, encode;
//! - `counter_increment`: one Increment into a frequency-cap counter at steady
//!   state (8 origins folded, 16 recent increments, a 24 h TTL);
//! - `counter_fold_64`: compaction folding 64 increments of 8 origins;
//! - `counter_merge`: a snapshot merge of two replicas' states of one counter,
//!   folded at different horizons;
//! - `filter_*`: reads of a wide row (1,000 event columns of 100 B, one in 20 a
//!   click) through server-side filters: `filter_none` (every cell),
//!   `filter_prefix` (QualifierPrefix "click:"), `filter_regex` (a regex that
//!   keeps the same columns), `filter_chain` (prefix, timestamp range, latest 1,
//!   cells-per-row limit 10).

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
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
    counters(c);
    filters(c);
}

/// A counter row: `n` increments of 8 origins, one a second from `from_s`.
fn counter_row(schema: &Schema, from_s: u64, n: u64) -> RowState {
    let mut row = RowState::default();
    for i in 0..n {
        let m = Mutation::Increment {
            family: "c".into(),
            column: Bytes::from_static(b"camp-17"),
            delta: 1,
        };
        let origin = format!("replica-{}", i % 8);
        row.apply(
            &Version::new(
                Timestamp::new((from_s + i) * 1_000, 0),
                origin.as_str().into(),
            ),
            &[m],
            schema.table("t"),
        );
    }
    row
}

fn counters(c: &mut Criterion) {
    use pangea_topology::schema::FamilyKind;
    let schema = Schema::single_table(
        "t",
        &[(
            "c",
            GcPolicy {
                ttl_ms: Some(24 * 3_600_000),
                kind: FamilyKind::Counter,
                ..GcPolicy::default()
            },
        )],
    );
    let table = schema.table("t");
    let now_ms = 1_000_000;
    let mut g = c.benchmark_group("merge");
    g.throughput(Throughput::Elements(1));
    // Steady state: everything older than 16 s folded.
    let mut steady = counter_row(&schema, 900, 100);
    steady.compact(table, Timestamp::new(984_000, 0), now_ms);
    let m = [Mutation::Increment {
        family: "c".into(),
        column: Bytes::from_static(b"camp-17"),
        delta: 1,
    }];
    let mut t = 1_000_000u64;
    // A fresh copy of the steady row each time (compaction keeps it this size).
    g.bench_function("counter_increment", |b| {
        b.iter_batched(
            || steady.clone(),
            |mut row| {
                t += 1;
                row.apply(&Version::new(Timestamp::new(t, 0), "b".into()), &m, table);
                row
            },
            BatchSize::SmallInput,
        );
    });
    let unfolded = counter_row(&schema, 900, 64);
    g.bench_function("counter_fold_64", |b| {
        b.iter_batched(
            || unfolded.clone(),
            |mut row| {
                row.compact(table, Timestamp::new(990_000, 0), now_ms);
                row
            },
            BatchSize::SmallInput,
        );
    });
    let mut a = counter_row(&schema, 900, 100);
    a.compact(table, Timestamp::new(960_000, 0), now_ms);
    let mut other = counter_row(&schema, 900, 100);
    other.compact(table, Timestamp::new(980_000, 0), now_ms);
    g.bench_function("counter_merge", |b| {
        b.iter_batched(
            || a.clone(),
            |mut row| {
                row.merge(&other, table);
                row
            },
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

/// A user's event row, Algolia-style: `<kind>:<n>` columns, one in 20 a click.
fn wide_row(schema: &Schema) -> RowState {
    let mut row = RowState::default();
    for n in 0..1_000u64 {
        let kind = if n.is_multiple_of(20) {
            "click"
        } else {
            "view"
        };
        let m = Mutation::SetCell {
            family: "p".into(),
            column: Bytes::from(format!("{kind}:{n:06}")),
            value: Bytes::from(vec![b'x'; 100]),
        };
        row.apply(
            &Version::new(Timestamp::new(1_000 + n, 0), "a".into()),
            &[m],
            schema.table("t"),
        );
    }
    row
}

fn filters(c: &mut Criterion) {
    use pangea_core::ReadFilter;
    use pangea_core::filter::{CellFilter, Pattern};
    let schema = Schema::single_table("t", &[("p", GcPolicy::default())]);
    let table = schema.table("t");
    let row = wide_row(&schema);
    let key = Bytes::from_static(b"u/1");
    let mut g = c.benchmark_group("merge");
    g.throughput(Throughput::Elements(1));
    let prefix = CellFilter::QualifierPrefix(Bytes::from_static(b"click:"));
    let cases = [
        ("filter_none", None),
        ("filter_prefix", Some(prefix.clone())),
        (
            "filter_regex",
            Some(CellFilter::QualifierRegex(
                Pattern::new("click:[0-9]+").expect("a valid regex"),
            )),
        ),
        (
            "filter_chain",
            Some(CellFilter::Chain(vec![
                prefix,
                CellFilter::TimestampRange {
                    start_ms: 1_100,
                    end_ms: None,
                },
                CellFilter::LatestPerColumn(1),
                CellFilter::CellsPerRowLimit(10),
            ])),
        ),
    ];
    for (name, cells) in cases {
        let f = ReadFilter {
            cells,
            ..ReadFilter::default()
        };
        g.bench_function(name, |b| b.iter(|| row.read(&key, &f, table, 10_000)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
