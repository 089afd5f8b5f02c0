//! The merge rule (`pangea_core::row`) against a model.
//!
//! The input (decoded with `arbitrary`) is a set of row mutations to one row, each
//! at its own version (timestamp, origin), over three families whose GC policies
//! (max versions, TTL) the input chooses, plus orders, duplicates, a purge horizon and
//! a split. What docs/architecture.md and docs/invariants.md (I4, I5) promise, checked
//! here:
//!
//! - reads equal a model: a `BTreeMap` of cells holding every write ever made to each
//!   (family, column) with its version, and the deletes; a cell shows its newest
//!   `max_versions` versions *ever written* that no later delete covers and that
//!   have not expired, newest first (also through family and column filters and a
//!   versions-per-column limit);
//! - any order with duplicates gives byte-identical encodings (commutativity and
//!   idempotence), also when a faulty peer reuses a version for another write;
//! - the canonical encoding parses back to the same state;
//! - merging the states of two (overlapping) halves equals applying the whole set,
//!   either way round;
//! - compaction at a horizon that respects premise I5 never changes what a reader
//!   sees, now or after later writes.

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use pangea_core::{Mutation, ReadFilter, RowState, TimeRange, Timestamp, Version};
use pangea_proto::Message;
use pangea_topology::schema::{GcPolicy, Schema, TableSchema};
use std::collections::BTreeMap;
use std::sync::Arc;

const FAMILIES: [&str; 3] = ["f", "g", "h"];
const COLUMNS: [&[u8]; 3] = [b"a", b"b", b"c"];
const ORIGINS: [&str; 3] = ["r1", "r2", "r3"];
/// Wall time of every read (ms); write timestamps are in 0..64 ms.
const NOW_MS: u64 = 64;
const WRITES_MAX: usize = 32;
const OPS_MAX: usize = 4;

#[derive(Debug, Arbitrary)]
struct Input {
    gc: [Gc; 3],
    writes: Vec<Write>,
    order_a: Vec<u16>,
    order_b: Vec<u16>,
    dups: Vec<u8>,
    horizon: u8,
    split: u8,
    overlap: u8,
    filter_family: u8,
    filter_column: u8,
    versions: u8,
}

#[derive(Debug, Arbitrary)]
struct Gc {
    max_versions: Option<u8>,
    ttl_ms: Option<u8>,
}

#[derive(Debug, Arbitrary)]
struct Write {
    ms: u8,
    logical: bool,
    origin: u8,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Set {
        f: u8,
        c: u8,
        v: u8,
    },
    DeleteColumn {
        f: u8,
        c: u8,
        start: u8,
        len: Option<u8>,
    },
    DeleteFamily {
        f: u8,
    },
    DeleteRow,
}

type History = Vec<(Version, Vec<Mutation>)>;
/// (family, column) → visible versions, newest first.
type Cells = BTreeMap<(usize, usize), Vec<(Version, Vec<u8>)>>;

fn ts(ms: u64) -> Timestamp {
    Timestamp::new(ms, 0)
}

fn family(i: u8) -> usize {
    usize::from(i) % FAMILIES.len()
}

fn column(i: u8) -> usize {
    usize::from(i) % COLUMNS.len()
}

fn mutation(op: &Op) -> Mutation {
    match *op {
        Op::Set { f, c, v } => Mutation::SetCell {
            family: FAMILIES[family(f)].into(),
            column: Bytes::from_static(COLUMNS[column(c)]),
            value: Bytes::from(vec![v; 2]),
        },
        Op::DeleteColumn { f, c, start, len } => {
            let start = u64::from(start % 70);
            Mutation::DeleteFromColumn {
                family: FAMILIES[family(f)].into(),
                column: Bytes::from_static(COLUMNS[column(c)]),
                range: TimeRange {
                    start: ts(start),
                    end: len.map(|l| ts(start + 1 + u64::from(l % 40))),
                },
            }
        }
        Op::DeleteFamily { f } => Mutation::DeleteFromFamily {
            family: FAMILIES[family(f)].into(),
        },
        Op::DeleteRow => Mutation::DeleteFromRow,
    }
}

fn schema(gc: &[Gc; 3]) -> Schema {
    let policy = |g: &Gc| GcPolicy {
        max_versions: g.max_versions.map(|n| u32::from(n % 4) + 1),
        ttl_ms: g.ttl_ms.map(|t| u64::from(t % 64) + 1),
        ..GcPolicy::default()
    };
    Schema::single_table(
        "t",
        &[
            (FAMILIES[0], policy(&gc[0])),
            (FAMILIES[1], policy(&gc[1])),
            (FAMILIES[2], policy(&gc[2])),
        ],
    )
}

pub fn merge(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let schema = schema(&input.gc);
    let table = schema.table("t").expect("the table");
    // Every write; versions may repeat (a faulty peer).
    let all: History = input
        .writes
        .iter()
        .take(WRITES_MAX)
        .filter(|w| !w.ops.is_empty())
        .map(|w| {
            let v = Version::new(
                Timestamp::new(u64::from(w.ms % 64), u16::from(w.logical)),
                ORIGINS[usize::from(w.origin) % ORIGINS.len()].into(),
            );
            (v, w.ops.iter().take(OPS_MAX).map(mutation).collect())
        })
        .collect();
    if all.is_empty() {
        return;
    }
    // What the premise of I4 allows: one write per version.
    let mut unique: History = Vec::new();
    for (v, muts) in &all {
        if !unique.iter().any(|(u, _)| u == v) {
            unique.push((v.clone(), muts.clone()));
        }
    }
    let key = Bytes::from_static(b"row");
    let encode = |row: &RowState| row.to_proto(&key).encode_to_vec();

    // Order and duplicates do not matter, to the byte.
    let n = unique.len();
    let a = replay(&unique, &order(n, &input.order_a, &[]), table);
    let b = replay(&unique, &order(n, &input.order_b, &input.dups), table);
    assert_eq!(
        encode(&a),
        encode(&b),
        "two orders of the same writes differ"
    );
    // Reads equal the model.
    let expected = model(&unique, table);
    assert_eq!(
        visible(&a, &ReadFilter::everything(), table),
        expected,
        "reads differ from the model"
    );
    check_filters(&a, &expected, &input, table);
    // The canonical encoding parses back.
    let (k, parsed) = RowState::from_proto(a.to_proto(&key)).expect("our own encoding parses");
    assert_eq!(k, key);
    assert_eq!(
        parsed, a,
        "the encoding does not parse back to the same state"
    );

    // Merging the states of two halves equals applying the whole set.
    let cut = usize::from(input.split) % (n + 1);
    let back = usize::from(input.overlap % 3);
    let left: Vec<usize> = (0..cut).collect();
    let right: Vec<usize> = (cut.saturating_sub(back)..n).collect();
    let (l, r) = (
        replay(&unique, &left, table),
        replay(&unique, &right, table),
    );
    let mut lr = l.clone();
    lr.merge(&r, Some(table));
    assert_eq!(
        encode(&lr),
        encode(&a),
        "merge(left, right) differs from the whole"
    );
    let mut rl = r;
    rl.merge(&l, Some(table));
    assert_eq!(
        encode(&rl),
        encode(&a),
        "merge(right, left) differs from the whole"
    );

    check_compaction(&unique, &input, table, &a);

    // A faulty peer reusing versions: still order-free.
    if all.len() > unique.len() {
        let m = all.len();
        let a = replay(&all, &order(m, &input.order_a, &[]), table);
        let b = replay(&all, &order(m, &input.order_b, &input.dups), table);
        assert_eq!(encode(&a), encode(&b), "reused versions: two orders differ");
    }
}

/// Every index once, shuffled by `keys`, plus the duplicates `dups` names.
fn order(n: usize, keys: &[u16], dups: &[u8]) -> Vec<usize> {
    let mut o: Vec<usize> = (0..n).collect();
    o.sort_by_key(|&i| keys.get(i).copied().unwrap_or(0));
    for &d in dups.iter().take(8) {
        let d = usize::from(d);
        o.insert(d % (o.len() + 1), d % n);
    }
    o
}

fn replay(history: &History, order: &[usize], table: &TableSchema) -> RowState {
    let mut row = RowState::default();
    for &i in order {
        let (v, muts) = &history[i];
        row.apply(v, muts, Some(table));
    }
    row
}

/// What a reader must see, from the set of writes.
fn model(history: &History, table: &TableSchema) -> Cells {
    // Every write to each cell: the last set of the cell in each row mutation.
    let mut writes: BTreeMap<(usize, usize), BTreeMap<Version, Vec<u8>>> = BTreeMap::new();
    for (v, muts) in history {
        for m in muts {
            if let Mutation::SetCell {
                family,
                column,
                value,
            } = m
            {
                let f = FAMILIES
                    .iter()
                    .position(|x| **x == **family)
                    .expect("family");
                let c = COLUMNS
                    .iter()
                    .position(|x| *x == &column[..])
                    .expect("column");
                writes
                    .entry((f, c))
                    .or_default()
                    .insert(v.clone(), value.to_vec());
            }
        }
    }
    let deleted = |f: usize, c: usize, w: &Version| {
        history.iter().any(|(t, muts)| {
            w < t
                && muts.iter().any(|m| match m {
                    Mutation::DeleteFromRow => true,
                    Mutation::DeleteFromFamily { family } => **family == *FAMILIES[f],
                    Mutation::DeleteFromColumn {
                        family,
                        column,
                        range,
                    } => {
                        **family == *FAMILIES[f]
                            && &column[..] == COLUMNS[c]
                            && range.contains(w.timestamp)
                    }
                    Mutation::SetCell { .. }
                    | Mutation::MergeRow(_)
                    | Mutation::Increment { .. } => false,
                })
        })
    };
    let mut out = Cells::new();
    for ((f, c), versions) in writes {
        let gc = *table.family(FAMILIES[f]).expect("family");
        let kept = versions
            .into_iter()
            .rev()
            .take(gc.max_versions.map_or(usize::MAX, |n| n as usize));
        let live: Vec<_> = kept
            .filter(|(v, _)| !deleted(f, c, v))
            .filter(|(v, _)| {
                gc.ttl_ms
                    .is_none_or(|ttl| v.timestamp.wall_ms() + ttl > NOW_MS)
            })
            .collect();
        if !live.is_empty() {
            out.insert((f, c), live);
        }
    }
    out
}

fn visible(row: &RowState, filter: &ReadFilter, table: &TableSchema) -> Cells {
    let mut out = Cells::new();
    let Some(r) = row.read(&Bytes::from_static(b"row"), filter, Some(table), NOW_MS) else {
        return out;
    };
    assert!(!r.families.is_empty(), "a row read with no family");
    for fam in r.families {
        let f = FAMILIES
            .iter()
            .position(|x| *x == fam.name)
            .expect("a known family");
        assert!(!fam.cells.is_empty(), "a family read with no cell");
        for cell in fam.cells {
            let c = COLUMNS
                .iter()
                .position(|x| *x == &cell.column[..])
                .expect("a known column");
            let v = Version::new(
                Timestamp::from_u64(cell.timestamp),
                cell.origin.as_str().into(),
            );
            out.entry((f, c))
                .or_default()
                .push((v, cell.value.to_vec()));
        }
    }
    out
}

/// Reads through a family filter and a column filter, with a versions limit.
fn check_filters(row: &RowState, expected: &Cells, input: &Input, table: &TableSchema) {
    let per_column = u32::from(input.versions % 4);
    let limit = |cells: Vec<(Version, Vec<u8>)>| -> Vec<_> {
        cells.into_iter().take(per_column.max(1) as usize).collect()
    };
    let (f, c) = (family(input.filter_family), column(input.filter_column));
    let by_family = ReadFilter {
        families: vec![Arc::from(FAMILIES[f])],
        columns: vec![],
        versions_per_column: per_column,
        cells: None,
    };
    let want: Cells = expected
        .iter()
        .filter(|((ff, _), _)| *ff == f)
        .map(|(k, v)| (*k, limit(v.clone())))
        .collect();
    assert_eq!(visible(row, &by_family, table), want, "family filter");
    let by_column = ReadFilter {
        families: vec![],
        columns: vec![(Arc::from(FAMILIES[f]), Bytes::from_static(COLUMNS[c]))],
        versions_per_column: per_column,
        cells: None,
    };
    let want: Cells = expected
        .iter()
        .filter(|(k, _)| **k == (f, c))
        .map(|(k, v)| (*k, limit(v.clone())))
        .collect();
    assert_eq!(visible(row, &by_column, table), want, "column filter");
}

/// I5: compaction at a horizon, once every write at or below it is applied, never
/// changes what a reader sees, now or after the writes that follow.
fn check_compaction(history: &History, input: &Input, table: &TableSchema, whole: &RowState) {
    let horizon = ts(u64::from(input.horizon % 70));
    let mut o = order(history.len(), &input.order_a, &[]);
    o.sort_by_key(|&i| history[i].0.timestamp > horizon);
    let mut row = RowState::default();
    let mut applied: History = Vec::new();
    for (step, &i) in o.iter().enumerate() {
        row.apply(&history[i].0, &history[i].1, Some(table));
        applied.push(history[i].clone());
        let below_done = o[step + 1..]
            .iter()
            .all(|&j| history[j].0.timestamp > horizon);
        if below_done && (step + usize::from(input.split)) % 2 == 0 {
            compact(&mut row, table, horizon);
            assert_eq!(
                visible(&row, &ReadFilter::everything(), table),
                model(&applied, table),
                "compaction changed what a reader sees"
            );
        }
    }
    compact(&mut row, table, horizon);
    assert!(
        !row.compact(Some(table), horizon, NOW_MS),
        "a second compaction changed the row"
    );
    assert_eq!(
        visible(&row, &ReadFilter::everything(), table),
        model(history, table),
        "compaction changed what a reader sees"
    );
    let key = Bytes::from_static(b"row");
    assert_eq!(
        row.visible_digest(&key, Some(table), NOW_MS),
        whole.visible_digest(&key, Some(table), NOW_MS),
        "compaction changed the content digest"
    );
}

/// Compacts `row` and checks that `RowState::compact` tells whether it changed.
fn compact(row: &mut RowState, table: &TableSchema, horizon: Timestamp) {
    let before = row.clone();
    let changed = row.compact(Some(table), horizon, NOW_MS);
    assert_eq!(changed, *row != before, "compact misreported a change");
}
