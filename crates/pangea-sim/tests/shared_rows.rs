//! Rows shared between the simulator's in-memory stores (`pangea_sim::shared_rows`,
//! through the core's `RowSharing` hook) are exact: stores that share hold, byte for
//! byte, what stores that do not hold, whatever the order, horizon, sweeps and
//! crashes — and they do share. (The row generators are those of pangea-core's
//! merge-rule property tests, tests/merge.rs.)

use bytes::Bytes;
use pangea_core::{
    Compaction, Limits, LogEntry, MemStorage, Mutation, RowApply, RowMutation, ScopeId, Storage,
    TimeRange, Timestamp, Version, WriteBatch,
};
use pangea_sim::shared_rows::SharedRows;
use pangea_topology::Deployment;
use pangea_topology::schema::{GcPolicy, Schema};
use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;

const NOW_MS: u64 = 60;
const ORIGINS: [&str; 3] = ["a", "b", "c"];
const FAMILIES: [&str; 3] = ["f", "g", "h"];
const COLUMNS: [&[u8]; 3] = [b"c1", b"c2", b"c3"];

fn schema() -> Schema {
    Schema::single_table(
        "t",
        &[
            (
                "f",
                GcPolicy {
                    max_versions: Some(2),
                    ttl_ms: None,
                    ..GcPolicy::default()
                },
            ),
            ("g", GcPolicy::default()),
            (
                "h",
                GcPolicy {
                    max_versions: Some(3),
                    ttl_ms: Some(25),
                    ..GcPolicy::default()
                },
            ),
        ],
    )
}

/// A deployment whose schema is `schema()`, for stores that take one.
fn deployment() -> Arc<Deployment> {
    let mut d = Deployment::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology/local-3-regions.toml"),
        None,
    )
    .unwrap();
    d.placement.schema = schema();
    Arc::new(d)
}

fn ts(ms: u64) -> Timestamp {
    Timestamp::new(ms, 0)
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let family = prop::sample::select(&FAMILIES[..]);
    let column = prop::sample::select(&COLUMNS[..]);
    prop_oneof![
        6 => (family.clone(), column.clone(), 0u8..4).prop_map(|(f, c, v)| Mutation::SetCell {
            family: f.into(),
            column: Bytes::from_static(c),
            value: Bytes::from(vec![v; 3]),
        }),
        2 => (family.clone(), column, 0u64..50, prop::option::of(1u64..30)).prop_map(|(f, c, start, len)| {
            Mutation::DeleteFromColumn {
                family: f.into(),
                column: Bytes::from_static(c),
                range: TimeRange { start: ts(start), end: len.map(|l| ts(start + l)) },
            }
        }),
        1 => family.prop_map(|f| Mutation::DeleteFromFamily { family: f.into() }),
        1 => Just(Mutation::DeleteFromRow),
    ]
}

/// A set of row mutations, each with its own version.
fn history() -> impl Strategy<Value = Vec<(Version, Vec<Mutation>)>> {
    prop::collection::btree_map(
        (1u64..50, 0usize..3),
        // Mostly a few mutations, sometimes many (with repeated cells: the last
        // set of a cell in one row mutation counts).
        prop_oneof![
            4 => prop::collection::vec(mutation(), 1..4),
            1 => prop::collection::vec(mutation(), 9..14),
        ],
        1..25,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|((ms, o), muts)| (Version::new(ts(ms), ORIGINS[o].into()), muts))
            .collect()
    })
}

/// Every index once, shuffled by `keys`, plus the duplicates `dups` names.
fn order(n: usize, keys: &[u32], dups: &[usize]) -> Vec<usize> {
    let mut o: Vec<usize> = (0..n).collect();
    o.sort_by_key(|&i| keys.get(i).copied().unwrap_or(0));
    for &d in dups {
        let at = d % (o.len() + 1);
        o.insert(at, d % n);
    }
    o
}

/// The shared records are keyed on everything a result depends on: two entries
/// carrying one mutation at different versions, and compactions at horizons that
/// purge different tombstones, each get their own result; compactions that purge the
/// same ones share theirs.
#[test]
fn shared_rows_key_on_the_version_and_the_purge_cut() {
    let d = deployment();
    let limits = Limits::default();
    let set = RowMutation::new(
        "t",
        "k",
        vec![Mutation::SetCell {
            family: "f".into(),
            column: Bytes::from_static(b"c1"),
            value: Bytes::from_static(b"v"),
        }],
        &limits,
    )
    .unwrap();
    let delete_family = |f: &str| {
        RowMutation::new(
            "t",
            "k",
            vec![Mutation::DeleteFromFamily { family: f.into() }],
            &limits,
        )
        .unwrap()
    };
    // One origin, as ids are within a run.
    let origin: pangea_core::ReplicaId = "a".into();
    let entry = |mutation: &RowMutation, ms: u64| LogEntry {
        scope: ScopeId::global(),
        origin: origin.clone(),
        sequence: ms,
        timestamp: ts(ms),
        mutation: mutation.clone(),
    };
    // The same mutation twice (f keeps two versions), then tombstones at 10 and 20.
    let entries = [
        entry(&set, 30),
        entry(&set, 31),
        entry(&delete_family("g"), 10),
        entry(&delete_family("h"), 20),
    ];
    let shared = Arc::new(SharedRows::new());
    let mut stores: Vec<(MemStorage, MemStorage)> = (0..3)
        .map(|_| {
            let mut with = MemStorage::new();
            with.share_rows(shared.clone());
            (with, MemStorage::new())
        })
        .collect();
    let table: Arc<str> = "t".into();
    let rows = |s: &MemStorage| format!("{:?}", s.rows().collect::<Vec<_>>());
    // Horizons 15 and 17 purge the tombstone at 10; 25 purges both.
    for ((with, without), horizon) in stores.iter_mut().zip([15, 25, 17]) {
        // Before any version could expire under h's TTL (25 ms), so the purge cut
        // alone decides.
        let keep = Compaction {
            deployment: &d,
            horizon: ts(0),
            now_ms: 40,
        };
        for e in &entries {
            let a = RowApply {
                entry: e,
                compaction: keep,
            };
            with.apply_to_row(&a, WriteBatch::default()).unwrap();
            without.apply_to_row(&a, WriteBatch::default()).unwrap();
        }
        assert_eq!(rows(with), rows(without));
        let c = Compaction {
            deployment: &d,
            horizon: ts(horizon),
            now_ms: 40,
        };
        with.compact_rows(&table, vec![Bytes::from_static(b"k")], &c)
            .unwrap();
        without
            .compact_rows(&table, vec![Bytes::from_static(b"k")], &c)
            .unwrap();
        assert_eq!(rows(with), rows(without), "compacted at {horizon}");
    }
    assert_ne!(
        rows(&stores[0].0),
        rows(&stores[1].0),
        "25 purges more than 15"
    );
    // 4 applies and one compaction computed once, found by the two others; the
    // compaction at 25 computed on its own.
    assert_eq!(shared.stats(), (4 * 2 + 1, 4 + 2));
    // Stores 0 and 2 hold one row: the same mutation at two versions differs.
    for (i, ms) in [(0, 40), (2, 41)] {
        let e = entry(&set, ms);
        let a = RowApply {
            entry: &e,
            compaction: Compaction {
                deployment: &d,
                horizon: ts(0),
                now_ms: 40,
            },
        };
        let (with, without) = &mut stores[i];
        with.apply_to_row(&a, WriteBatch::default()).unwrap();
        without.apply_to_row(&a, WriteBatch::default()).unwrap();
        assert_eq!(rows(with), rows(without), "store {i}");
    }
}

/// Two replicas that applied two writes in different orders hold equal rows in
/// different `Arc`s; the next row either computes is found equal to the other's and
/// shared, so the write after that is computed once for both.
#[test]
fn shared_rows_join_again_once_equal() {
    let d = deployment();
    let origin: pangea_core::ReplicaId = "a".into();
    let set = |ms: u64, column: &'static [u8]| LogEntry {
        scope: ScopeId::global(),
        origin: origin.clone(),
        sequence: ms,
        timestamp: ts(ms),
        mutation: RowMutation::new(
            "t",
            "k",
            vec![Mutation::SetCell {
                family: "g".into(),
                column: Bytes::from_static(column),
                value: Bytes::from_static(b"v"),
            }],
            &Limits::default(),
        )
        .unwrap(),
    };
    let (e1, e2, e3, e4) = (set(1, b"c1"), set(2, b"c2"), set(3, b"c3"), set(4, b"c1"));
    let shared = Arc::new(SharedRows::new());
    let (mut a, mut b) = (MemStorage::new(), MemStorage::new());
    a.share_rows(shared.clone());
    b.share_rows(shared.clone());
    let apply = |s: &mut MemStorage, e: &LogEntry| {
        let compaction = Compaction {
            deployment: &d,
            horizon: ts(0),
            now_ms: 40,
        };
        s.apply_to_row(
            &RowApply {
                entry: e,
                compaction,
            },
            WriteBatch::default(),
        )
        .unwrap();
    };
    for e in [&e1, &e2] {
        apply(&mut a, e);
    }
    for e in [&e2, &e1] {
        apply(&mut b, e);
    }
    assert_eq!(shared.stats(), (0, 4), "four different (row, entry) pairs");
    apply(&mut a, &e3);
    apply(&mut b, &e3);
    assert_eq!(
        shared.stats(),
        (0, 6),
        "b's row is not a's, so e3 is computed twice"
    );
    apply(&mut a, &e4);
    apply(&mut b, &e4);
    assert_eq!(
        shared.stats(),
        (1, 7),
        "but then b holds a's row, and finds e4"
    );
    assert_eq!(
        format!("{:?}", a.rows().collect::<Vec<_>>()),
        format!("{:?}", b.rows().collect::<Vec<_>>())
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Stores that share rows (the simulator's) hold exactly what stores that do not
    /// hold, whatever order each applies the writes in, whatever its horizon, with
    /// sweeps and a crash in between; and they do share.
    #[test]
    fn shared_rows_hold_what_unshared_rows_hold(
        history in history(),
        keys in prop::collection::vec(any::<u32>(), 25),
        horizons in prop::collection::vec(0u64..60, 3),
        sweep_every in 2usize..6,
    ) {
        let d = deployment();
        let shared = Arc::new(SharedRows::new());
        let n = history.len();
        // Two replicas apply in the same order (the second finds every change the
        // first made), the third in its own.
        let orders = [(0..n).collect(), (0..n).collect(), order(n, &keys, &[])];
        let table: Arc<str> = "t".into();
        let row_key = |i: usize| Bytes::from(format!("k{}", i % 2));
        // Every replica gets the same entries (sharing their mutations, as copies of
        // one entry do).
        let entries: Vec<LogEntry> = history
            .iter()
            .enumerate()
            .map(|(i, (v, muts))| LogEntry {
                scope: ScopeId::global(),
                origin: v.origin.clone(),
                sequence: i as u64 + 1,
                timestamp: v.timestamp,
                mutation: RowMutation::new("t", row_key(i), muts.clone(), &Limits::default()).unwrap(),
            })
            .collect();
        for (r, order) in orders.iter().enumerate() {
            let crash_model = r == 2;
            let (mut with, mut without) = (MemStorage::new(), MemStorage::new());
            with.share_rows(shared.clone());
            with.set_crash_model(crash_model);
            without.set_crash_model(crash_model);
            let mut synced = None;
            for (step, &i) in order.iter().enumerate() {
                let entry = &entries[i];
                let compaction = Compaction { deployment: &d, horizon: ts(horizons[r] + step as u64), now_ms: NOW_MS };
                let a = RowApply { entry, compaction };
                for s in [&mut with, &mut without] {
                    s.apply_to_row(&a, WriteBatch::default()).unwrap();
                    if step % sweep_every == 0 {
                        s.compact_rows(&table, vec![row_key(0), row_key(1)], &compaction).unwrap();
                    }
                }
                prop_assert_eq!(with.rows().collect::<Vec<_>>(), without.rows().collect::<Vec<_>>());
                if crash_model && step == n / 2 {
                    with.sync().unwrap();
                    without.sync().unwrap();
                    synced = Some(format!("{:?}", without.rows().collect::<Vec<_>>()));
                }
            }
            if let Some(synced) = synced {
                with.crash();
                prop_assert_eq!(format!("{:?}", with.rows().collect::<Vec<_>>()), synced);
            }
        }
        let (hits, _) = shared.stats();
        prop_assert!(hits >= 1, "the second replica found the first one's rows");
    }
}
