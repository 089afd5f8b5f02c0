//! Read filters: the `RowFilter` a client sends, decoded by the replica
//! (`ReadFilter::from_proto`, with its `CellFilter` tree) and run on a row.
//!
//! Decoding must refuse any input with an error, never panic (nor build a regex
//! beyond its limits); a filter it accepts encodes back to itself, and running it
//! on a wide row returns a subset of the row's cells, in row order, at most
//! `versions_per_column` of each column, the same with and without the columns
//! the read skips ahead of the filter.

use bytes::Bytes;
use pangea_core::filter::{FILTER_DEPTH_MAX, FILTER_NODES_MAX};
use pangea_core::{ReadFilter, RowState, Timestamp, Version};
use pangea_proto::Message as _;
use pangea_proto::v1 as pb;
use std::sync::LazyLock;

/// A row of two families: `events` with 40 columns (`click:NN`, `view:NN`) of
/// three versions each, `profile` with one cell.
static ROW: LazyLock<RowState> = LazyLock::new(|| {
    let mut row = RowState::default();
    for n in 0..40u64 {
        for v in 0..3u64 {
            let kind = if n % 4 == 0 { "click" } else { "view" };
            row.apply(
                &Version::new(Timestamp::new(crate::T0_MS + n * 10 + v, 0), "r1".into()),
                &[pangea_core::Mutation::SetCell {
                    family: "events".into(),
                    column: Bytes::from(format!("{kind}:{n:02}")),
                    value: Bytes::from(format!("{v}")),
                }],
                None,
            );
        }
    }
    row.apply(
        &Version::new(Timestamp::new(crate::T0_MS, 0), "r1".into()),
        &[pangea_core::Mutation::SetCell {
            family: "profile".into(),
            column: Bytes::from_static(b"p"),
            value: Bytes::from_static(b"hello"),
        }],
        None,
    );
    row
});

pub fn filter(data: &[u8]) {
    let Ok(p) = pb::RowFilter::decode(data) else {
        return;
    };
    let Ok(f) = ReadFilter::from_proto(p) else {
        return;
    };
    if let Some(cells) = &f.cells {
        let (nodes, depth) = size(&cells.to_proto());
        assert!(nodes <= FILTER_NODES_MAX && depth <= FILTER_DEPTH_MAX);
    }
    assert_eq!(
        ReadFilter::from_proto(f.to_proto()).as_ref(),
        Ok(&f),
        "filter round trip"
    );
    let key = Bytes::from_static(b"k");
    let now = crate::T0_MS + 1_000;
    let got = ROW.read(&key, &f, None, now);
    // The read skips columns the filter's leading tests drop; the tree run on
    // every cell of the selected columns must give the same answer.
    if let Some(cells) = &f.cells {
        let every = ReadFilter {
            versions_per_column: u32::MAX,
            cells: None,
            ..f.clone()
        };
        let unskipped = ROW
            .read(&key, &every, None, now)
            .and_then(|row| cells.apply(row, f.versions_per_column.max(1) as usize));
        assert_eq!(got, unskipped, "skipping columns changed the answer");
    }
    let Some(got) = got else {
        return;
    };
    let all = ROW
        .read(&key, &ReadFilter::everything(), None, now)
        .expect("the row has cells");
    let cells = |r: &pb::Row| -> Vec<(String, Bytes, u64)> {
        r.families
            .iter()
            .flat_map(|f| {
                f.cells
                    .iter()
                    .map(|c| (f.name.clone(), c.column.clone(), c.timestamp))
            })
            .collect()
    };
    let (got, all) = (cells(&got), cells(&all));
    // A subsequence of the row's cells: each found after the previous.
    let mut rest = all.iter();
    for c in &got {
        assert!(
            rest.any(|a| a == c),
            "{c:?} not in row order, or not the row's"
        );
    }
    let per_column = f.versions_per_column.max(1) as usize;
    for c in &got {
        let same = got.iter().filter(|o| o.0 == c.0 && o.1 == c.1).count();
        assert!(
            same <= per_column,
            "{same} versions of {c:?}, limit {per_column}"
        );
    }
}

/// Nodes and depth of a filter tree.
fn size(f: &pb::CellFilter) -> (usize, usize) {
    use pb::cell_filter::Filter;
    let children = match &f.filter {
        Some(Filter::Chain(c)) => &c.filters[..],
        Some(Filter::Interleave(c)) => &c.filters[..],
        _ => &[],
    };
    children
        .iter()
        .map(size)
        .fold((1, 1), |(n, d), (cn, cd)| (n + cn, d.max(cd + 1)))
}
