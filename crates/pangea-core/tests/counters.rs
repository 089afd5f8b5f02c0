//! Property tests of counters (the `row` module's counters; docs/invariants.md, I4
//! and I5 for counters):
//! - any order of the same set of increments and deletes, with duplicates, gives
//!   byte-identical row state whose counters equal a brute-force sum;
//! - folding at any horizon that respects I5, at any moments, and delivering old
//!   increments again after the fold, never changes a counter;
//! - replicas that folded at different horizons merge into the same state, both
//!   ways, and snapshot parts merge back to the row.

use bytes::Bytes;
use pangea_core::row::{COUNTER_BUCKET_MS, count_of};
use pangea_core::{Mutation, ReadFilter, RowState, TimeRange, Timestamp, Version};
use pangea_proto::Message;
use pangea_topology::schema::{FamilyKind, GcPolicy, Schema, TableSchema};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Increments are 10 s apart at most 400 s in; "w" keeps them 2 minutes (past
/// the end of their minute), so at `NOW_MS` those of the last few minutes count.
const STEP_MS: u64 = 10_000;
const NOW_MS: u64 = 400_000;
const TTL_MS: u64 = 120_000;
const ORIGINS: [&str; 3] = ["a", "b", "c"];
/// "n": a counter kept for ever, "w": one with a TTL.
const COUNTERS: [&str; 2] = ["n", "w"];
const COLUMNS: [&[u8]; 2] = [b"c1", b"c2"];

fn schema() -> Schema {
    let counter = |ttl_ms| GcPolicy {
        ttl_ms,
        kind: FamilyKind::Counter,
        ..GcPolicy::default()
    };
    Schema::single_table(
        "t",
        &[
            ("n", counter(None)),
            ("w", counter(Some(TTL_MS))),
            ("p", GcPolicy::default()),
        ],
    )
}

fn table(schema: &Schema) -> &TableSchema {
    schema.table("t").unwrap()
}

fn ts(step: u64) -> Timestamp {
    Timestamp::new(step * STEP_MS, 0)
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let family = prop::sample::select(&COUNTERS[..]);
    let column = prop::sample::select(&COLUMNS[..]);
    prop_oneof![
        8 => (family.clone(), column.clone(), -3i64..=3).prop_map(|(f, c, delta)| {
            Mutation::Increment { family: f.into(), column: Bytes::from_static(c), delta }
        }),
        // A range is refused before it reaches a counter; one that does deletes
        // the whole counter, alike everywhere.
        1 => (family.clone(), column.clone(), 0u64..40, prop::option::of(1u64..10)).prop_map(
            |(f, c, start, len)| Mutation::DeleteFromColumn {
                family: f.into(),
                column: Bytes::from_static(c),
                range: TimeRange { start: ts(start), end: len.map(|l| ts(start + l)) },
            }
        ),
        // Refused before too; ignored alike everywhere.
        1 => (family.clone(), column).prop_map(|(f, c)| Mutation::SetCell {
            family: f.into(),
            column: Bytes::from_static(c),
            value: Bytes::from_static(b"12345678"),
        }),
        1 => family.prop_map(|f| Mutation::DeleteFromFamily { family: f.into() }),
        1 => Just(Mutation::DeleteFromRow),
    ]
}

type History = Vec<(Version, Vec<Mutation>)>;

/// A set of row mutations, each with its own version.
fn history() -> impl Strategy<Value = History> {
    prop::collection::btree_map(
        (1u64..40, 0usize..3),
        prop::collection::vec(mutation(), 1..4),
        1..30,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|((step, o), muts)| (Version::new(ts(step), ORIGINS[o].into()), muts))
            .collect()
    })
}

fn replay(history: &History, order: &[usize], schema: &Schema) -> RowState {
    let mut row = RowState::default();
    for &i in order {
        let (v, muts) = &history[i];
        row.apply(v, muts, Some(table(schema)));
    }
    row
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

/// Per counter: its value and the version of the newest increment counted.
type Counts = BTreeMap<(String, Vec<u8>), (i64, Version)>;

/// What a reader must see: each counter the sum of its increments that no later
/// delete covers and that have not expired (by the end of their minute plus the
/// TTL), computed from the whole set.
fn model(history: &History, schema: &Schema) -> Counts {
    let t = table(schema);
    let mut out = Counts::new();
    for family in COUNTERS {
        let ttl = t.family(family).unwrap().ttl_ms;
        for column in COLUMNS {
            let deleted = |w: &Version| {
                history.iter().any(|(t, muts)| {
                    w < t
                        && muts.iter().any(|m| match m {
                            Mutation::DeleteFromRow => true,
                            Mutation::DeleteFromFamily { family: f } => &**f == family,
                            Mutation::DeleteFromColumn {
                                family: f,
                                column: c,
                                ..
                            } => &**f == family && &c[..] == column,
                            _ => false,
                        })
                })
            };
            let expired = |w: &Version| {
                ttl.is_some_and(|ttl| {
                    let bucket = w.timestamp.wall_ms() / COUNTER_BUCKET_MS * COUNTER_BUCKET_MS;
                    bucket + COUNTER_BUCKET_MS + ttl <= NOW_MS
                })
            };
            for (v, muts) in history {
                let deltas: Vec<i64> = muts
                    .iter()
                    .filter_map(|m| match m {
                        Mutation::Increment {
                            family: f,
                            column: c,
                            delta,
                        } if &**f == family && &c[..] == column => Some(*delta),
                        _ => None,
                    })
                    .collect();
                if deltas.is_empty() || deleted(v) || expired(v) {
                    continue;
                }
                let e = out
                    .entry((family.to_owned(), column.to_vec()))
                    .or_insert((0, v.clone()));
                e.0 += deltas.iter().sum::<i64>();
                e.1 = e.1.clone().max(v.clone());
            }
        }
    }
    out
}

fn counts(row: &RowState, schema: &Schema) -> Counts {
    let mut out = Counts::new();
    let key = Bytes::from_static(b"k");
    if let Some(r) = row.read(&key, &ReadFilter::everything(), Some(table(schema)), NOW_MS) {
        for fam in r.families {
            assert!(COUNTERS.contains(&fam.name.as_str()), "{fam:?}");
            for cell in fam.cells {
                let v = Version::new(
                    Timestamp::from_u64(cell.timestamp),
                    cell.origin.as_str().into(),
                );
                let prior = out.insert(
                    (fam.name.clone(), cell.column.to_vec()),
                    (count_of(&cell.value), v),
                );
                assert!(prior.is_none(), "a counter reads as one cell");
            }
        }
    }
    out
}

fn bytes(row: &RowState) -> Vec<u8> {
    row.to_proto(&Bytes::from_static(b"k")).encode_to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// I4 for counters: order and duplicates do not matter, to the byte, and a
    /// counter is the sum of its increments.
    #[test]
    fn any_order_with_duplicates_counts_each_increment_once(
        history in history(),
        keys_a in prop::collection::vec(any::<u32>(), 30),
        keys_b in prop::collection::vec(any::<u32>(), 30),
        dups in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let schema = schema();
        let n = history.len();
        let a = replay(&history, &order(n, &keys_a, &[]), &schema);
        let b = replay(&history, &order(n, &keys_b, &dups), &schema);
        prop_assert_eq!(bytes(&a), bytes(&b));
        prop_assert_eq!(counts(&a, &schema), model(&history, &schema));
        let (_, parsed) = RowState::from_proto(a.to_proto(&Bytes::from_static(b"k"))).unwrap();
        prop_assert_eq!(parsed, a);
    }

    /// I5 for counters: folding at a horizon every later write is newer than, at
    /// any moments, and old increments delivered again after it (gap repair,
    /// a peer's retry), never change a counter; compaction says exactly when it
    /// changes the row, and a second one changes nothing.
    #[test]
    fn folds_never_change_a_counter(
        history in history(),
        keys in prop::collection::vec(any::<u32>(), 30),
        horizon_step in 0u64..40,
        compact_every in 1usize..4,
        again in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let schema = schema();
        let t = Some(table(&schema));
        let horizon = ts(horizon_step);
        let mut o = order(history.len(), &keys, &[]);
        o.sort_by_key(|&i| history[i].0.timestamp > horizon);
        let mut row = RowState::default();
        let mut applied = Vec::new();
        for (step, &i) in o.iter().enumerate() {
            let (v, muts) = &history[i];
            row.apply(v, muts, t);
            applied.push(history[i].clone());
            let below_done = o[step + 1..].iter().all(|&j| history[j].0.timestamp > horizon);
            if below_done && step % compact_every == 0 {
                let before = row.clone();
                let needs = row.needs_compact(t, horizon, NOW_MS);
                let changed = row.compact(t, horizon, NOW_MS);
                prop_assert_eq!(changed, row != before);
                prop_assert_eq!(needs, changed, "needs_compact foretells compact");
                prop_assert_eq!(counts(&row, &schema), model(&applied, &schema));
                // Increments applied before arrive again: a fold counts them
                // once. (Streams filter repeats by sequence anyway; one deleted
                // and purged since is outside I5's premise, as for any cell.)
                for &k in &again {
                    let (v, muts) = &applied[k % applied.len()];
                    let deleted_since = applied.iter().any(|(w, ms)| {
                        w > v && ms.iter().any(|m| !matches!(m, Mutation::Increment { .. }))
                    });
                    if deleted_since {
                        continue;
                    }
                    let incs: Vec<Mutation> = muts
                        .iter()
                        .filter(|m| matches!(m, Mutation::Increment { .. }))
                        .cloned()
                        .collect();
                    row.apply(v, &incs, t);
                    prop_assert_eq!(counts(&row, &schema), model(&applied, &schema), "a repeat counted");
                }
            }
        }
        row.compact(t, horizon, NOW_MS);
        prop_assert!(!row.compact(t, horizon, NOW_MS), "a second compaction changes nothing");
        prop_assert_eq!(counts(&row, &schema), model(&history, &schema));
    }

    /// Two replicas that folded at different horizons (each after every write at
    /// or below its own, I5) hold the same counters, and merging either into the
    /// other (a snapshot) gives the same state to the byte, whose counters are
    /// still the sums.
    #[test]
    fn replicas_folded_at_different_horizons_merge_alike(
        history in history(),
        keys_a in prop::collection::vec(any::<u32>(), 30),
        keys_b in prop::collection::vec(any::<u32>(), 30),
        h_a in 0u64..40,
        h_b in 0u64..40,
    ) {
        let schema = schema();
        let t = Some(table(&schema));
        let replica = |keys: &[u32], h: u64| {
            let mut row = replay(&history, &order(history.len(), keys, &[]), &schema);
            row.compact(t, ts(h), NOW_MS);
            row
        };
        let (a, b) = (replica(&keys_a, h_a), replica(&keys_b, h_b));
        prop_assert_eq!(counts(&a, &schema), model(&history, &schema));
        prop_assert_eq!(counts(&b, &schema), model(&history, &schema));
        let mut ab = a.clone();
        ab.merge(&b, t);
        let mut ba = b.clone();
        ba.merge(&a, t);
        prop_assert_eq!(bytes(&ab), bytes(&ba));
        prop_assert_eq!(counts(&ab, &schema), model(&history, &schema));
        // A replica that has only writes newer than a's horizon (a new one, I5)
        // takes a's folded state as a snapshot.
        let newer: Vec<usize> = (0..history.len()).filter(|&i| history[i].0.timestamp > ts(h_a)).collect();
        let mut part = replay(&history, &newer, &schema);
        part.merge(&a, t);
        prop_assert_eq!(counts(&part, &schema), model(&history, &schema));
    }

    /// Snapshot parts of a folded row merge back to it, and a compaction sweep's
    /// answers hold: `needs_compact` exact at any horizon and time, the answer
    /// size what a read returns.
    #[test]
    fn parts_sizes_and_sweeps(
        history in history(),
        h in 0u64..40,
        max in 1usize..24,
        sweep_h in 0u64..45,
        now in 0u64..700_000,
        later in 0u64..300_000,
    ) {
        let schema = schema();
        let t = Some(table(&schema));
        let mut row = replay(&history, &(0..history.len()).collect::<Vec<_>>(), &schema);
        row.compact(t, ts(h), NOW_MS);
        let mut back = RowState::default();
        for p in row.split(max).iter().rev() {
            back.merge(p, t);
        }
        prop_assert_eq!(bytes(&back), bytes(&row));
        let mut compacted = row.clone();
        let changed = compacted.compact(t, ts(sweep_h), now);
        prop_assert_eq!(changed, compacted != row);
        prop_assert_eq!(row.needs_compact(t, ts(sweep_h), now), changed);
        let key = Bytes::from_static(b"k");
        let read_bytes = row.read(&key, &ReadFilter::default(), t, now).map_or(0, |r| {
            r.families.iter().flat_map(|f| &f.cells).map(|c| c.column.len() + c.value.len()).sum()
        });
        prop_assert_eq!(row.latest_value_bytes(t, now), read_bytes);
        // The answer holds until its time (at it, an increment stops counting,
        // which may or may not change the sum).
        let (encoded, until_ms) = row.encode_latest(&key, t, now);
        prop_assert!(until_ms > now);
        let at = now + later;
        if at < until_ms {
            let then = row.read(&key, &ReadFilter::default(), t, at).map(|r| r.encode_to_vec());
            prop_assert_eq!(encoded.map(|b| b.to_vec()), then);
        }
    }
}

/// Increments of one cell in one row mutation count as one increment of their
/// sum; a counter wraps at 64 bits rather than failing.
#[test]
fn one_mutation_sums_and_counters_wrap() {
    let schema = schema();
    let t = Some(table(&schema));
    let inc = |delta| Mutation::Increment {
        family: "n".into(),
        column: Bytes::from_static(b"c"),
        delta,
    };
    let mut row = RowState::default();
    row.apply(&Version::new(ts(1), "a".into()), &[inc(2), inc(3)], t);
    row.apply(&Version::new(ts(2), "b".into()), &[inc(i64::MAX)], t);
    let got = counts(&row, &schema);
    let (value, newest) = &got[&("n".to_owned(), b"c".to_vec())];
    assert_eq!(*value, 5i64.wrapping_add(i64::MAX));
    assert_eq!(*newest, Version::new(ts(2), "b".into()));
}

/// Increments to a family this replica's schema does not know yet (a counter
/// family added by an apply that has not reached it) are kept, so once its
/// schema has the family it counts what the others do; a family known to hold
/// cells ignores them, alike everywhere.
#[test]
fn increments_before_the_schema_knows_the_family_are_kept() {
    let knows = schema();
    let new = Schema::single_table("t", &[("p", GcPolicy::default())]);
    let inc = |delta| Mutation::Increment {
        family: "n".into(),
        column: Bytes::from_static(b"c"),
        delta,
    };
    let (mut a, mut b) = (RowState::default(), RowState::default());
    for (i, o) in ["a", "b", "c"].into_iter().enumerate() {
        let v = Version::new(ts(i as u64 + 1), o.into());
        a.apply(&v, &[inc(2)], Some(table(&knows)));
        b.apply(&v, &[inc(2)], new.table("t"));
    }
    assert_eq!(counts(&a, &knows), counts(&b, &knows));
    assert_eq!(counts(&b, &knows)[&("n".to_owned(), b"c".to_vec())].0, 6);
    // A snapshot from a replica that folded reaches one that does not know the
    // family: the fold is kept too.
    a.compact(Some(table(&knows)), ts(10), NOW_MS);
    let mut c = RowState::default();
    c.merge(&a, new.table("t"));
    assert_eq!(counts(&c, &knows), counts(&a, &knows));
    // Into a family of cells, increments are ignored (the write path refuses them).
    let mut d = RowState::default();
    d.apply(
        &Version::new(ts(1), "a".into()),
        &[Mutation::Increment {
            family: "p".into(),
            column: Bytes::from_static(b"c"),
            delta: 1,
        }],
        Some(table(&knows)),
    );
    assert!(d.is_empty());
}

/// A folded count from a store or a peer must fit its newest increment: reach
/// at least it, and sit in its minute's bucket (or 0).
#[test]
fn malformed_folds_are_refused() {
    let schema = schema();
    let t = Some(table(&schema));
    let mut row = RowState::default();
    let inc = Mutation::Increment {
        family: "n".into(),
        column: Bytes::from_static(b"c"),
        delta: 1,
    };
    row.apply(&Version::new(ts(7), "a".into()), &[inc], t);
    row.compact(t, ts(9), NOW_MS);
    let key = Bytes::from_static(b"k");
    let good = row.to_proto(&key);
    assert!(RowState::from_proto(good.clone()).is_ok());
    let fold = |p: &mut pangea_proto::v1::RowState| p.families[0].columns[0].folded[0].clone();
    let mut short = good.clone();
    let mut f = fold(&mut short);
    f.up_to = f.newest.as_ref().unwrap().timestamp - 1;
    short.families[0].columns[0].folded[0] = f;
    assert!(
        RowState::from_proto(short).is_err(),
        "reach below its newest"
    );
    let mut elsewhere = good;
    let mut f = fold(&mut elsewhere);
    f.bucket_ms += 2 * COUNTER_BUCKET_MS;
    elsewhere.families[0].columns[0].folded[0] = f;
    assert!(
        RowState::from_proto(elsewhere).is_err(),
        "bucket not its minute"
    );
}
