//! Property tests of the merge rule (docs/invariants.md, I4 and I5):
//! - any order of the same set of row mutations, with duplicates, gives byte-identical
//!   row state and the same content digest;
//! - what a reader sees always equals a brute-force model computed from the whole set,
//!   whatever compactions (GC and tombstone purge) ran in between, so GC and purge
//!   never resurrect a deleted or overwritten value.

use bytes::Bytes;
use pangea_core::{
    Limits, Mutation, ReadFilter, RowMutation, RowState, TimeRange, Timestamp, Version,
};
use pangea_proto::Message;
use pangea_topology::schema::{EventTimeWindow, GcPolicy, Schema, TableSchema};
use proptest::prelude::*;
use std::collections::BTreeMap;

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

fn table(schema: &Schema) -> &TableSchema {
    schema.table("t").unwrap()
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

/// Applies `order` (indices into `history`, repeats allowed) to a fresh row.
fn replay(history: &[(Version, Vec<Mutation>)], order: &[usize], schema: &Schema) -> RowState {
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

type Visible = BTreeMap<(String, Vec<u8>), Vec<(Version, Vec<u8>)>>;

/// What a reader must see, computed by brute force from the whole set.
fn model(history: &[(Version, Vec<Mutation>)], schema: &Schema) -> Visible {
    let t = table(schema);
    let mut out = Visible::new();
    for family in FAMILIES {
        let gc = *t.family(family).unwrap();
        for column in COLUMNS {
            // Every write to the cell: the last set of the cell in each row mutation.
            let mut writes: Vec<(Version, Vec<u8>)> = Vec::new();
            for (v, muts) in history {
                let last = muts.iter().rev().find_map(|m| match m {
                    Mutation::SetCell {
                        family: f,
                        column: c,
                        value,
                    } if &**f == family && &c[..] == column => Some(value.to_vec()),
                    _ => None,
                });
                if let Some(value) = last {
                    writes.push((v.clone(), value));
                }
            }
            // Newest first; of two writes at one version (event times can
            // meet), the greater value.
            writes.sort_by(|a, b| b.cmp(a));
            writes.dedup_by(|later, kept| later.0 == kept.0);
            if let Some(n) = gc.max_versions {
                writes.truncate(n as usize);
            }
            let deleted = |w: &Version| {
                history.iter().any(|(t, muts)| {
                    w < t
                        && muts.iter().any(|m| match m {
                            Mutation::DeleteFromRow => true,
                            Mutation::DeleteFromFamily { family: f } => &**f == family,
                            Mutation::DeleteFromColumn {
                                family: f,
                                column: c,
                                range,
                            } => &**f == family && &c[..] == column && range.contains(w.timestamp),
                            Mutation::SetCell { .. }
                            | Mutation::MergeRow(_)
                            | Mutation::Increment { .. } => false,
                        })
                })
            };
            let expired = |w: &Version| {
                gc.ttl_ms
                    .is_some_and(|ttl| w.timestamp.wall_ms() + ttl <= NOW_MS)
            };
            let live: Vec<_> = writes
                .into_iter()
                .filter(|(v, _)| !deleted(v) && !expired(v))
                .collect();
            if !live.is_empty() {
                out.insert((family.to_owned(), column.to_vec()), live);
            }
        }
    }
    out
}

fn visible(row: &RowState, schema: &Schema) -> Visible {
    let mut out = Visible::new();
    let key = Bytes::from_static(b"k");
    if let Some(r) = row.read(&key, &ReadFilter::everything(), Some(table(schema)), NOW_MS) {
        for fam in r.families {
            for cell in fam.cells {
                out.entry((fam.name.clone(), cell.column.to_vec()))
                    .or_default()
                    .push((
                        Version::new(
                            Timestamp::from_u64(cell.timestamp),
                            cell.origin.as_str().into(),
                        ),
                        cell.value.to_vec(),
                    ));
            }
        }
    }
    out
}

/// How far back the event-time table's window reaches (and ahead: 5 ms).
const PAST_MS: u64 = 20;

/// [`schema`] with an event-time window on its table.
fn event_schema() -> Schema {
    let mut s = schema();
    s.tables.get_mut("t").unwrap().event_time = Some(EventTimeWindow {
        past_ms: PAST_MS,
        future_ms: 5,
    });
    s
}

/// Writes logged at distinct (ms, origin), some of them carrying an event time
/// anywhere in the window around their log time: (log version, the version
/// their cells and deletes take, mutations).
fn event_history() -> impl Strategy<Value = Vec<(Version, Version, Vec<Mutation>)>> {
    prop::collection::btree_map(
        (1u64..50, 0usize..3),
        (
            prop::option::of(0u64..=PAST_MS + 5),
            prop::collection::vec(mutation(), 1..4),
        ),
        1..25,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|((ms, o), (back, muts))| {
                let logged = Version::new(ts(ms), ORIGINS[o].into());
                let mut rm = RowMutation::new("t", "k", muts, &Limits::default()).unwrap();
                if let Some(back) = back {
                    // Event time 0 is refused: no version is at or below the
                    // horizon's floor, `Timestamp::ZERO`.
                    rm = rm.at_event_time((ms + 5).saturating_sub(back).max(1));
                }
                (
                    logged.clone(),
                    rm.cell_version(&logged),
                    rm.mutations().to_vec(),
                )
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// I4: order and duplicates do not matter, to the byte.
    #[test]
    fn any_order_with_duplicates_gives_identical_rows(
        history in history(),
        keys_a in prop::collection::vec(any::<u32>(), 25),
        keys_b in prop::collection::vec(any::<u32>(), 25),
        dups in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let schema = schema();
        let n = history.len();
        let a = replay(&history, &order(n, &keys_a, &[]), &schema);
        let b = replay(&history, &order(n, &keys_b, &dups), &schema);
        let key = Bytes::from_static(b"k");
        prop_assert_eq!(a.to_proto(&key).encode_to_vec(), b.to_proto(&key).encode_to_vec());
        prop_assert_eq!(
            a.visible_digest(&key, Some(table(&schema)), NOW_MS),
            b.visible_digest(&key, Some(table(&schema)), NOW_MS)
        );
        prop_assert_eq!(visible(&a, &schema), model(&history, &schema));
        // The canonical encoding parses back to the same state.
        let (k, parsed) = RowState::from_proto(a.to_proto(&key)).unwrap();
        prop_assert_eq!(k, key);
        prop_assert_eq!(parsed, a);
    }

    /// I5: compactions at any horizon that respects the premise (every write applied
    /// later is newer than the horizon) never change what a reader sees.
    #[test]
    fn gc_and_purge_never_resurrect(
        history in history(),
        keys in prop::collection::vec(any::<u32>(), 25),
        horizon_ms in 0u64..50,
        compact_every in 1usize..5,
    ) {
        let schema = schema();
        let t = Some(table(&schema));
        let horizon = ts(horizon_ms);
        // Writes at or below the horizon first (in shuffled order), the rest later.
        let mut o = order(history.len(), &keys, &[]);
        o.sort_by_key(|&i| history[i].0.timestamp > horizon);
        let mut row = RowState::default();
        let mut applied = Vec::new();
        for (step, &i) in o.iter().enumerate() {
            let (v, muts) = &history[i];
            row.apply(v, muts, t);
            applied.push(history[i].clone());
            // Compacting at the horizon is allowed only once everything at or below
            // it has been applied.
            let below_done = o[step + 1..].iter().all(|&j| history[j].0.timestamp > horizon);
            if below_done && step % compact_every == 0 {
                let before = row.clone();
                let needs = row.needs_compact(t, horizon, NOW_MS);
                let changed = row.compact(t, horizon, NOW_MS);
                prop_assert_eq!(changed, row != before, "compact says whether the row changed");
                prop_assert_eq!(needs, changed, "needs_compact foretells compact");
                prop_assert_eq!(visible(&row, &schema), model(&applied, &schema));
            }
        }
        let before = row.clone();
        let changed = row.compact(t, horizon, NOW_MS);
        prop_assert_eq!(changed, row != before, "compact says whether the row changed");
        prop_assert!(!row.compact(t, horizon, NOW_MS), "a second compaction changes nothing");
        prop_assert_eq!(visible(&row, &schema), model(&history, &schema));
        let key = Bytes::from_static(b"k");
        let plain = replay(&history, &(0..history.len()).collect::<Vec<_>>(), &schema);
        prop_assert_eq!(
            row.visible_digest(&key, t, NOW_MS),
            plain.visible_digest(&key, t, NOW_MS)
        );
    }

    /// I4 and I5 with event times: writes whose cells take event times up to
    /// `PAST_MS` before their log time (and, arriving after the replica's purge
    /// horizon passed their log time's predecessors, possibly older than that
    /// horizon) give identical rows in any order, and compaction at the
    /// replica's horizon never changes what a reader sees.
    #[test]
    fn event_times_merge_and_purge_like_clock_times(
        history in event_history(),
        keys in prop::collection::vec(any::<u32>(), 25),
        keys_b in prop::collection::vec(any::<u32>(), 25),
        horizon_ms in 0u64..50,
        compact_every in 1usize..5,
    ) {
        let schema = event_schema();
        let t = Some(table(&schema));
        let cells: Vec<(Version, Vec<Mutation>)> =
            history.iter().map(|(_, cell, m)| (cell.clone(), m.clone())).collect();
        let key = Bytes::from_static(b"k");
        let n = history.len();
        let a = replay(&cells, &order(n, &keys, &[]), &schema);
        let b = replay(&cells, &order(n, &keys_b, &[0, 3]), &schema);
        prop_assert_eq!(a.to_proto(&key).encode_to_vec(), b.to_proto(&key).encode_to_vec());
        prop_assert_eq!(visible(&a, &schema), model(&cells, &schema));
        // The replica's horizon is in log time: writes logged at or below it
        // first, the rest later (their event times may be older than it).
        let horizon = ts(horizon_ms);
        let mut o = order(n, &keys, &[]);
        o.sort_by_key(|&i| history[i].0.timestamp > horizon);
        let mut row = RowState::default();
        let mut applied = Vec::new();
        for (step, &i) in o.iter().enumerate() {
            row.apply(&cells[i].0, &cells[i].1, t);
            applied.push(cells[i].clone());
            let below_done = o[step + 1..].iter().all(|&j| history[j].0.timestamp > horizon);
            if below_done && step % compact_every == 0 {
                let needs = row.needs_compact(t, horizon, NOW_MS);
                prop_assert_eq!(needs, row.compact(t, horizon, NOW_MS), "needs_compact foretells compact");
                prop_assert_eq!(visible(&row, &schema), model(&applied, &schema));
            }
        }
        row.compact(t, horizon, NOW_MS);
        prop_assert_eq!(visible(&row, &schema), model(&cells, &schema));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// A sweep copies only the rows `needs_compact` names: it says exactly whether
    /// `compact` would change the row, at any horizon and time (the premise of I5
    /// is not needed for that).
    #[test]
    fn needs_compact_is_exact(history in history(), horizon_ms in 0u64..60, now in 0u64..120) {
        let schema = schema();
        let t = Some(table(&schema));
        let row = replay(&history, &(0..history.len()).collect::<Vec<_>>(), &schema);
        let mut compacted = row.clone();
        let changed = compacted.compact(t, ts(horizon_ms), now);
        prop_assert_eq!(changed, compacted != row);
        prop_assert_eq!(row.needs_compact(t, ts(horizon_ms), now), changed);
        prop_assert!(!compacted.needs_compact(t, ts(horizon_ms), now));
    }

    /// Stores that share rows share compactions between replicas whose horizons
    /// differ but cut the row alike (`purge_cut`): the compacted rows are equal.
    #[test]
    fn compaction_depends_on_the_horizon_only_through_its_cut(
        history in history(),
        h1 in 0u64..60,
        h2 in 0u64..60,
        now in 0u64..120,
    ) {
        let schema = schema();
        let t = Some(table(&schema));
        let row = replay(&history, &(0..history.len()).collect::<Vec<_>>(), &schema);
        let cut1 = row.purge_cut(t, ts(h1), now);
        let cut2 = row.purge_cut(t, ts(h2), now);
        let (mut a, mut b) = (row.clone(), row);
        a.compact(t, ts(h1), now);
        b.compact(t, ts(h2), now);
        if cut1.is_some() && cut1 == cut2 {
            prop_assert_eq!(&a, &b);
        }
        // Without a TTL in play the cut is known, and exact: different cuts
        // compact differently whenever one of them purges something.
        if let (Some(c1), Some(c2)) = (cut1, cut2) && c1 != c2 {
            prop_assert_ne!(&a, &b);
        }
    }

    /// Snapshots and migration backfills merge row states: merging the states of two
    /// halves of a history equals applying the whole history, to the byte.
    #[test]
    fn merging_states_equals_applying_the_union(history in history(), split in any::<prop::sample::Index>(), overlap: bool) {
        let schema = schema();
        let n = history.len();
        let cut = split.index(n + 1);
        let left: Vec<usize> = (0..cut).collect();
        // With overlap, both halves saw some of the same writes.
        let right: Vec<usize> = if overlap { (cut.saturating_sub(2)..n).collect() } else { (cut..n).collect() };
        let mut a = replay(&history, &left, &schema);
        let b = replay(&history, &right, &schema);
        a.merge(&b, Some(table(&schema)));
        let whole = replay(&history, &(0..n).collect::<Vec<_>>(), &schema);
        let key = Bytes::from_static(b"k");
        prop_assert_eq!(a.to_proto(&key).encode_to_vec(), whole.to_proto(&key).encode_to_vec());
        // And as a write: a MergeRow mutation carries a state into another row.
        let mut c = replay(&history, &left, &schema);
        c.apply(&Version::new(ts(99), "z".into()), &[Mutation::MergeRow(Box::new(b))], Some(table(&schema)));
        prop_assert_eq!(c, whole);
    }

    /// Snapshots split rows larger than a chunk: merging the parts, in any order,
    /// into an empty row (and compacting after each, as installing a chunk does)
    /// gives the row back, to the byte; every part but one-version ones stays
    /// within the size asked.
    #[test]
    fn split_parts_merge_back_to_the_row(
        history in history(),
        max in 1usize..16,
        keys in prop::collection::vec(any::<u32>(), 0..40),
        horizon_ms in 0u64..60,
    ) {
        let schema = schema();
        let whole = replay(&history, &(0..history.len()).collect::<Vec<_>>(), &schema);
        let parts = whole.split(max);
        prop_assert!(!parts.is_empty());
        // A part over the size holds one version larger than it: here a cell is
        // 5 bytes (a 2-byte column, a 3-byte value).
        for p in &parts {
            prop_assert!(p.value_bytes() <= max.max(5), "{p:?}");
        }
        if whole.value_bytes() <= max {
            prop_assert_eq!(parts.len(), 1);
        }
        let order = order(parts.len(), &keys, &[]);
        let mut back = RowState::default();
        for &i in &order {
            back.merge(&parts[i], Some(table(&schema)));
        }
        let key = Bytes::from_static(b"k");
        prop_assert_eq!(back.to_proto(&key).encode_to_vec(), whole.to_proto(&key).encode_to_vec());
        // Compacting after each part as the receiver does equals compacting the row.
        let horizon = ts(horizon_ms);
        let mut installed = RowState::default();
        for &i in &order {
            installed.merge(&parts[i], Some(table(&schema)));
            installed.compact(Some(table(&schema)), horizon, 200);
        }
        let mut compacted = whole;
        compacted.compact(Some(table(&schema)), horizon, 200);
        prop_assert_eq!(installed, compacted);
    }

    /// A replica answers point reads from `encode_latest` until the time it returns:
    /// the encoding is the newest-version read, and every read before that time
    /// gives the same bytes; the first read at it (a cell expired) does not. The
    /// simulator's answer size, `latest_value_bytes`, counts that read's cells.
    #[test]
    fn encoded_latest_read_holds_until_its_time(history in history(), now in 0u64..120, later in 0u64..120) {
        let schema = schema();
        let row = replay(&history, &(0..history.len()).collect::<Vec<_>>(), &schema);
        let key = Bytes::from_static(b"k");
        let t = Some(table(&schema));
        let read_at = |ms: u64| row.read(&key, &ReadFilter::default(), t, ms).map(|r| r.encode_to_vec());
        let read_bytes = row.read(&key, &ReadFilter::default(), t, now).map_or(0, |r| {
            r.families.iter().flat_map(|f| &f.cells).map(|c| c.column.len() + c.value.len()).sum()
        });
        prop_assert_eq!(row.latest_value_bytes(t, now), read_bytes);
        let (encoded, until_ms) = row.encode_latest(&key, t, now);
        let encoded = encoded.map(|b| b.to_vec());
        prop_assert_eq!(&encoded, &read_at(now));
        prop_assert!(until_ms > now);
        let at = now + later;
        if at < until_ms {
            prop_assert_eq!(&encoded, &read_at(at));
        }
        if until_ms < u64::MAX {
            prop_assert_ne!(&encoded, &read_at(until_ms));
        }
    }
}

#[test]
fn delete_then_older_write_stays_deleted() {
    let schema = schema();
    let t = Some(table(&schema));
    let mut row = RowState::default();
    let set = |v: u8| {
        vec![Mutation::SetCell {
            family: "g".into(),
            column: Bytes::from_static(b"c"),
            value: Bytes::from(vec![v]),
        }]
    };
    row.apply(
        &Version::new(ts(10), "a".into()),
        &[Mutation::DeleteFromRow],
        t,
    );
    row.apply(&Version::new(ts(5), "b".into()), &set(1), t);
    assert!(
        row.read(&Bytes::from_static(b"k"), &ReadFilter::default(), t, NOW_MS)
            .is_none()
    );
    row.apply(&Version::new(ts(11), "b".into()), &set(2), t);
    let r = row
        .read(&Bytes::from_static(b"k"), &ReadFilter::default(), t, NOW_MS)
        .unwrap();
    assert_eq!(r.families[0].cells[0].value, Bytes::from(vec![2]));
}

#[test]
fn equal_timestamps_break_ties_by_origin() {
    let schema = schema();
    let t = Some(table(&schema));
    let set = |v: u8| {
        vec![Mutation::SetCell {
            family: "g".into(),
            column: Bytes::from_static(b"c"),
            value: Bytes::from(vec![v]),
        }]
    };
    for order in [[0, 1], [1, 0]] {
        let writes = [
            (Version::new(ts(10), "a".into()), set(1)),
            (Version::new(ts(10), "b".into()), set(2)),
        ];
        let mut row = RowState::default();
        for i in order {
            row.apply(&writes[i].0, &writes[i].1, t);
        }
        let r = row
            .read(&Bytes::from_static(b"k"), &ReadFilter::default(), t, NOW_MS)
            .unwrap();
        assert_eq!(r.families[0].cells[0].origin, "b");
    }
}

#[test]
fn deleting_the_newest_does_not_resurrect_beyond_max_versions() {
    // Family f keeps 2 versions: after writes at 1, 2, 3 the one at 1 is gone for
    // good, even when 3 is deleted.
    let schema = schema();
    let t = Some(table(&schema));
    let mut row = RowState::default();
    for ms in 1..=3u64 {
        let m = Mutation::SetCell {
            family: "f".into(),
            column: Bytes::from_static(b"c"),
            value: Bytes::from(vec![ms as u8]),
        };
        row.apply(&Version::new(ts(ms), "a".into()), &[m], t);
    }
    let del = Mutation::DeleteFromColumn {
        family: "f".into(),
        column: Bytes::from_static(b"c"),
        range: TimeRange {
            start: ts(3),
            end: Some(ts(4)),
        },
    };
    row.apply(&Version::new(ts(9), "a".into()), &[del], t);
    let r = row
        .read(
            &Bytes::from_static(b"k"),
            &ReadFilter::everything(),
            t,
            NOW_MS,
        )
        .unwrap();
    let values: Vec<_> = r.families[0].cells.iter().map(|c| c.value[0]).collect();
    assert_eq!(values, vec![2]);
}
