//! Server-side cell filters: which cells of a row a read returns, beyond the
//! family and column lists of [`ReadFilter`](crate::ReadFilter) — Bigtable's
//! `RowFilter` tree, run by the replica so that a wide row's unwanted cells never
//! cross the network.
//!
//! A filter sees a row's live cells (not deleted, not expired) in row order:
//! family name, then column, then newest version first. Leaves keep the cells
//! that match; a [`CellFilter::Chain`] runs its filters one after another, each on
//! what the previous one kept; a [`CellFilter::Interleave`] runs each of its
//! filters on the same input and keeps what any of them kept (once: unlike
//! Bigtable's, an interleave never returns a cell twice). Counters are one cell
//! per column, whose value is the sum.
//!
//! A filter from a request is checked when it is decoded, before any row is read:
//! at most [`FILTER_NODES_MAX`] filters, nested at most [`FILTER_DEPTH_MAX`] deep,
//! regular expressions of at most [`REGEX_BYTES_MAX`] bytes, compiled by the
//! `regex` crate (finite automata: matching is linear in the qualifier, whatever
//! the pattern) within [`REGEX_COMPILED_MAX`] bytes. An error names the filter by
//! its path in the tree, e.g. `cells.chain[1].qualifier_regex`.

use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use pangea_proto::v1 as pb;

use crate::Error;
use crate::hlc::Timestamp;

/// Most filters in one request's tree (leaves, chains and interleaves).
pub const FILTER_NODES_MAX: usize = 64;
/// Deepest nesting of chains and interleaves (the tree's root is depth 1).
pub const FILTER_DEPTH_MAX: usize = 8;
/// Longest regular expression, in bytes of its source.
pub const REGEX_BYTES_MAX: usize = 1024;
/// Most memory a compiled regular expression (and its lazy DFA) may take.
pub const REGEX_COMPILED_MAX: usize = 1 << 20;

/// Whether the row `key` is in a row sample of `fraction` (in (0, 1]): the xxh3-64
/// hash of the key, over 2^64, is below the fraction. The same rows on every
/// replica, page and run, so a sample pages and repeats.
pub fn in_sample(key: &[u8], fraction: f64) -> bool {
    // At 1 every key (a hash near 2^64 rounds up to it as a float).
    fraction >= 1.0 || (xxhash_rust::xxh3::xxh3_64(key) as f64) < fraction * 2f64.powi(64)
}

/// One node of a filter tree; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellFilter {
    /// Each filter in turn, on what the previous one kept (empty: every cell).
    Chain(Vec<CellFilter>),
    /// What any of the filters keeps from the same input, in row order, each
    /// cell once (empty: no cell).
    Interleave(Vec<CellFilter>),
    /// Cells of this family.
    Family(Arc<str>),
    /// Cells whose column qualifier starts with these bytes.
    QualifierPrefix(Bytes),
    /// Cells whose column qualifier falls in the range.
    QualifierRange(BytesRange),
    /// Cells whose whole column qualifier matches the expression.
    QualifierRegex(Pattern),
    /// Cells written in `[start_ms, end_ms)`, wall milliseconds since the Unix
    /// epoch of their version's timestamp (`end_ms` `None`: no end).
    TimestampRange { start_ms: u64, end_ms: Option<u64> },
    /// Cells whose value falls in the range (bytewise order).
    ValueRange(BytesRange),
    /// The newest `n` cells of each column.
    LatestPerColumn(u32),
    /// The row's cells after the first `n`.
    CellsPerRowOffset(u32),
    /// The row's first `n` cells.
    CellsPerRowLimit(u32),
}

/// A range of byte strings (row keys, qualifiers, values), each end included,
/// excluded or absent, as Bigtable's `RowRange`, `ColumnRange` and `ValueRange`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BytesRange {
    pub start: Bound<Bytes>,
    pub end: Bound<Bytes>,
}

impl Default for BytesRange {
    fn default() -> Self {
        BytesRange::ALL
    }
}

impl BytesRange {
    /// Every byte string.
    pub const ALL: BytesRange = BytesRange {
        start: Bound::Unbounded,
        end: Bound::Unbounded,
    };

    pub fn contains(&self, b: &[u8]) -> bool {
        let above = match &self.start {
            Bound::Included(s) => b >= &s[..],
            Bound::Excluded(s) => b > &s[..],
            Bound::Unbounded => true,
        };
        above && self.below_end(b)
    }

    /// Whether `b` is before the range's end (the test a forward scan stops on).
    pub fn below_end(&self, b: &[u8]) -> bool {
        match &self.end {
            Bound::Included(e) => b <= &e[..],
            Bound::Excluded(e) => b < &e[..],
            Bound::Unbounded => true,
        }
    }

    /// Whether `b` is after the range's start (the test a reverse scan stops on).
    pub fn above_start(&self, b: &[u8]) -> bool {
        match &self.start {
            Bound::Included(s) => b >= &s[..],
            Bound::Excluded(s) => b > &s[..],
            Bound::Unbounded => true,
        }
    }

    /// Every byte string that starts with `prefix`.
    pub fn prefix(prefix: &[u8]) -> BytesRange {
        if prefix.is_empty() {
            return BytesRange::ALL;
        }
        // The prefix's successor: the last byte that is not 0xff, plus one, with
        // what follows it dropped; none when every byte is 0xff.
        let end = match prefix.iter().rposition(|&b| b != 0xff) {
            Some(i) => {
                let mut e = prefix[..=i].to_vec();
                e[i] += 1;
                Bound::Excluded(Bytes::from(e))
            }
            None => Bound::Unbounded,
        };
        BytesRange {
            start: Bound::Included(Bytes::copy_from_slice(prefix)),
            end,
        }
    }

    /// The strings in both ranges.
    pub fn intersect(&self, other: &BytesRange) -> BytesRange {
        let start = match (&self.start, &other.start) {
            (Bound::Unbounded, b) | (b, Bound::Unbounded) => b.clone(),
            (a, b) => {
                let (ka, kb) = (bound_key(a), bound_key(b));
                // The higher start; at a tie, the excluding one.
                if ka > kb || (ka == kb && matches!(a, Bound::Excluded(_))) {
                    a.clone()
                } else {
                    b.clone()
                }
            }
        };
        let end = match (&self.end, &other.end) {
            (Bound::Unbounded, b) | (b, Bound::Unbounded) => b.clone(),
            (a, b) => {
                let (ka, kb) = (bound_key(a), bound_key(b));
                if ka < kb || (ka == kb && matches!(a, Bound::Excluded(_))) {
                    a.clone()
                } else {
                    b.clone()
                }
            }
        };
        BytesRange { start, end }
    }

    /// Whether no byte string is in the range.
    pub fn is_empty(&self) -> bool {
        match (&self.start, &self.end) {
            (Bound::Unbounded, _) | (_, Bound::Unbounded) => false,
            (Bound::Included(s), Bound::Included(e)) => s > e,
            (s, e) => bound_key(s) >= bound_key(e),
        }
    }

    pub fn to_proto(&self) -> pb::BytesRange {
        use pb::bytes_range::{End, Start};
        pb::BytesRange {
            start: match &self.start {
                Bound::Included(s) => Some(Start::StartClosed(s.clone())),
                Bound::Excluded(s) => Some(Start::StartOpen(s.clone())),
                Bound::Unbounded => None,
            },
            end: match &self.end {
                Bound::Included(e) => Some(End::EndClosed(e.clone())),
                Bound::Excluded(e) => Some(End::EndOpen(e.clone())),
                Bound::Unbounded => None,
            },
        }
    }

    pub fn from_proto(p: pb::BytesRange) -> BytesRange {
        use pb::bytes_range::{End, Start};
        BytesRange {
            start: match p.start {
                Some(Start::StartClosed(s)) => Bound::Included(s),
                Some(Start::StartOpen(s)) => Bound::Excluded(s),
                None => Bound::Unbounded,
            },
            end: match p.end {
                Some(End::EndClosed(e)) => Bound::Included(e),
                Some(End::EndOpen(e)) => Bound::Excluded(e),
                None => Bound::Unbounded,
            },
        }
    }
}

fn bound_key(b: &Bound<Bytes>) -> &[u8] {
    match b {
        Bound::Included(k) | Bound::Excluded(k) => k,
        Bound::Unbounded => &[],
    }
}

/// A compiled regular expression that must match a whole qualifier; compares by
/// its source.
#[derive(Clone)]
pub struct Pattern {
    source: Arc<str>,
    whole: regex::bytes::Regex,
}

impl Pattern {
    /// Compiles `source` (the `regex` crate's syntax, close to RE2's; bytes, not
    /// Unicode: `.` is any one byte, newlines included).
    pub fn new(source: &str) -> Result<Pattern, String> {
        if source.len() > REGEX_BYTES_MAX {
            return Err(format!(
                "is {} bytes, limit {REGEX_BYTES_MAX}",
                source.len()
            ));
        }
        let build = |pattern: &str| {
            regex::bytes::RegexBuilder::new(pattern)
                .unicode(false)
                .dot_matches_new_line(true)
                .size_limit(REGEX_COMPILED_MAX)
                .dfa_size_limit(REGEX_COMPILED_MAX)
                .build()
                .map_err(|e| e.to_string())
        };
        // Compiled alone first: only a pattern that parses by itself is wrapped
        // (`a)|(b` would otherwise change meaning inside the anchors).
        build(source)?;
        Ok(Pattern {
            source: source.into(),
            whole: build(&format!("^(?:{source})$"))?,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn matches(&self, b: &[u8]) -> bool {
        self.whole.is_match(b)
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Pattern {}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pattern({:?})", self.source)
    }
}

impl CellFilter {
    /// Decodes and checks a request's filter; `path` names it in errors
    /// (e.g. `"cells"`).
    pub fn from_proto(p: pb::CellFilter, path: &str) -> Result<CellFilter, Error> {
        let mut nodes = 0;
        decode(p, path, 1, &mut nodes)
            .map_err(|(at, why)| Error::malformed("RowFilter", format!("{at}: {why}")))
    }

    pub fn to_proto(&self) -> pb::CellFilter {
        use pb::cell_filter::{Chain, Filter, Interleave, TimestampRange};
        let f = match self {
            CellFilter::Chain(fs) => Filter::Chain(Chain {
                filters: fs.iter().map(CellFilter::to_proto).collect(),
            }),
            CellFilter::Interleave(fs) => Filter::Interleave(Interleave {
                filters: fs.iter().map(CellFilter::to_proto).collect(),
            }),
            CellFilter::Family(f) => Filter::Family(f.to_string()),
            CellFilter::QualifierPrefix(p) => Filter::QualifierPrefix(p.clone()),
            CellFilter::QualifierRange(r) => Filter::QualifierRange(r.to_proto()),
            CellFilter::QualifierRegex(p) => Filter::QualifierRegex(p.source().to_owned()),
            CellFilter::TimestampRange { start_ms, end_ms } => {
                Filter::TimestampRange(TimestampRange {
                    start_ms: *start_ms,
                    end_ms: end_ms.unwrap_or(0),
                })
            }
            CellFilter::ValueRange(r) => Filter::ValueRange(r.to_proto()),
            CellFilter::LatestPerColumn(n) => Filter::LatestPerColumn(*n),
            CellFilter::CellsPerRowOffset(n) => Filter::CellsPerRowOffset(*n),
            CellFilter::CellsPerRowLimit(n) => Filter::CellsPerRowLimit(*n),
        };
        pb::CellFilter { filter: Some(f) }
    }

    /// Whether a column of `family` named `column` can have a cell this filter
    /// keeps, as far as the column tests that see every cell of the column tell
    /// (those of a chain before its first filter that counts cells, of every
    /// branch of an interleave); `true` when unsure. Skipping the columns it
    /// refuses before the filter runs changes no answer (those tests would drop
    /// them first), and a wide row's other columns are never copied.
    pub fn column_may_pass(&self, family: &str, column: &[u8]) -> bool {
        match self {
            // A chain's filters up to its first one that is not per cell (which
            // would see the skipped cells: a cells-per-row limit counts them) see
            // exactly the cells the ones before them kept.
            CellFilter::Chain(fs) => {
                for f in fs {
                    if !f.column_may_pass(family, column) {
                        return false;
                    }
                    if !f.per_cell() {
                        break;
                    }
                }
                true
            }
            CellFilter::Interleave(fs) => {
                fs.is_empty() || fs.iter().any(|f| f.column_may_pass(family, column))
            }
            CellFilter::Family(_)
            | CellFilter::QualifierPrefix(_)
            | CellFilter::QualifierRange(_)
            | CellFilter::QualifierRegex(_) => self.column_passes(family, column),
            _ => true,
        }
    }

    /// Whether the filter keeps or drops each cell by the cell alone (not by
    /// the cells around it, as a per-row or per-column count does).
    fn per_cell(&self) -> bool {
        match self {
            CellFilter::Chain(fs) | CellFilter::Interleave(fs) => {
                fs.iter().all(CellFilter::per_cell)
            }
            CellFilter::Family(_)
            | CellFilter::QualifierPrefix(_)
            | CellFilter::QualifierRange(_)
            | CellFilter::QualifierRegex(_)
            | CellFilter::TimestampRange { .. }
            | CellFilter::ValueRange(_) => true,
            CellFilter::LatestPerColumn(_)
            | CellFilter::CellsPerRowOffset(_)
            | CellFilter::CellsPerRowLimit(_) => false,
        }
    }

    /// For a filter that tests only families and qualifiers: whether it keeps the
    /// cells of this column.
    fn column_passes(&self, family: &str, column: &[u8]) -> bool {
        match self {
            CellFilter::Chain(fs) => fs.iter().all(|f| f.column_passes(family, column)),
            CellFilter::Interleave(fs) => fs.iter().any(|f| f.column_passes(family, column)),
            CellFilter::Family(f) => &**f == family,
            CellFilter::QualifierPrefix(p) => column.starts_with(p),
            CellFilter::QualifierRange(r) => r.contains(column),
            CellFilter::QualifierRegex(p) => p.matches(column),
            _ => true,
        }
    }

    /// The row's cells this filter keeps, then at most `per_column` of each
    /// column (the newest of those kept). `row` holds every live version of the
    /// columns the read selected, in row order. `None` when no cell is left.
    pub fn apply(&self, mut row: pb::Row, per_column: usize) -> Option<pb::Row> {
        let mut cells: Vec<Flat> = Vec::new();
        for (f, fam) in row.families.iter_mut().enumerate() {
            cells.extend(std::mem::take(&mut fam.cells).into_iter().map(|cell| Flat {
                family: f,
                cell,
                kept: false,
            }));
        }
        let names: Vec<&str> = row.families.iter().map(|f| f.name.as_str()).collect();
        let all = (0..cells.len()).collect();
        let kept = self.select(&cells, &names, all);
        // Newest `per_column` of each column kept: cells of a column are adjacent.
        let mut run: Option<(usize, usize)> = None;
        let mut count = 0;
        for i in kept {
            let here = (cells[i].family, i);
            let same = run
                .is_some_and(|(f, j)| f == here.0 && cells[j].cell.column == cells[i].cell.column);
            if !same {
                run = Some(here);
                count = 0;
            }
            if count < per_column {
                cells[i].kept = true;
                count += 1;
            }
        }
        drop(names);
        for c in cells.into_iter().filter(|c| c.kept) {
            row.families[c.family].cells.push(c.cell);
        }
        row.families.retain(|f| !f.cells.is_empty());
        (!row.families.is_empty()).then_some(row)
    }

    /// The indices of `input` (ascending: row order) this filter keeps.
    fn select(&self, cells: &[Flat], names: &[&str], input: Vec<usize>) -> Vec<usize> {
        let keep = |pred: &dyn Fn(&Flat) -> bool| -> Vec<usize> {
            input.iter().copied().filter(|&i| pred(&cells[i])).collect()
        };
        match self {
            CellFilter::Chain(fs) => fs.iter().fold(input, |acc, f| f.select(cells, names, acc)),
            CellFilter::Interleave(fs) => {
                let mut out: Vec<usize> = fs
                    .iter()
                    .flat_map(|f| f.select(cells, names, input.clone()))
                    .collect();
                out.sort_unstable();
                out.dedup();
                out
            }
            CellFilter::Family(name) => keep(&|c| names[c.family] == &**name),
            CellFilter::QualifierPrefix(p) => keep(&|c| c.cell.column.starts_with(p)),
            CellFilter::QualifierRange(r) => keep(&|c| r.contains(&c.cell.column)),
            CellFilter::QualifierRegex(p) => keep(&|c| p.matches(&c.cell.column)),
            CellFilter::TimestampRange { start_ms, end_ms } => keep(&|c| {
                let ms = Timestamp::from_u64(c.cell.timestamp).wall_ms();
                ms >= *start_ms && end_ms.is_none_or(|end| ms < end)
            }),
            CellFilter::ValueRange(r) => keep(&|c| r.contains(&c.cell.value)),
            CellFilter::LatestPerColumn(n) => {
                let mut out = Vec::with_capacity(input.len());
                let mut prev: Option<usize> = None;
                let mut count = 0;
                for i in input {
                    let same = prev.is_some_and(|j| {
                        cells[j].family == cells[i].family
                            && cells[j].cell.column == cells[i].cell.column
                    });
                    count = if same { count + 1 } else { 1 };
                    prev = Some(i);
                    if count <= *n {
                        out.push(i);
                    }
                }
                out
            }
            CellFilter::CellsPerRowOffset(n) => input.into_iter().skip(*n as usize).collect(),
            CellFilter::CellsPerRowLimit(n) => input.into_iter().take(*n as usize).collect(),
        }
    }
}

/// One cell of the row being filtered, with its family's index.
struct Flat {
    family: usize,
    cell: pb::Cell,
    kept: bool,
}

type DecodeError = (String, String);

fn decode(
    p: pb::CellFilter,
    path: &str,
    depth: usize,
    nodes: &mut usize,
) -> Result<CellFilter, DecodeError> {
    use pb::cell_filter::Filter;
    *nodes += 1;
    if *nodes > FILTER_NODES_MAX {
        return Err((
            path.to_owned(),
            format!("the filter has more than {FILTER_NODES_MAX} nodes (the limit)"),
        ));
    }
    let at = |leaf: &str| format!("{path}.{leaf}");
    let branches = |fs: Vec<pb::CellFilter>, kind: &str, nodes: &mut usize| {
        if depth >= FILTER_DEPTH_MAX {
            return Err((
                at(kind),
                format!("nested deeper than {FILTER_DEPTH_MAX} (the limit)"),
            ));
        }
        fs.into_iter()
            .enumerate()
            .map(|(i, f)| decode(f, &format!("{path}.{kind}[{i}]"), depth + 1, nodes))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match p.filter {
        None => return Err((path.to_owned(), "no filter set in the oneof".into())),
        Some(Filter::Chain(c)) => CellFilter::Chain(branches(c.filters, "chain", nodes)?),
        Some(Filter::Interleave(c)) => {
            CellFilter::Interleave(branches(c.filters, "interleave", nodes)?)
        }
        Some(Filter::Family(f)) => {
            if f.is_empty() {
                return Err((at("family"), "is empty".into()));
            }
            CellFilter::Family(f.as_str().into())
        }
        Some(Filter::QualifierPrefix(p)) => CellFilter::QualifierPrefix(p),
        Some(Filter::QualifierRange(r)) => CellFilter::QualifierRange(BytesRange::from_proto(r)),
        Some(Filter::QualifierRegex(r)) => CellFilter::QualifierRegex(
            Pattern::new(&r).map_err(|why| (at("qualifier_regex"), why))?,
        ),
        Some(Filter::TimestampRange(t)) => {
            let end_ms = (t.end_ms != 0).then_some(t.end_ms);
            if end_ms.is_some_and(|end| end <= t.start_ms) {
                return Err((
                    at("timestamp_range"),
                    format!("[{}, {}) is empty", t.start_ms, t.end_ms),
                ));
            }
            CellFilter::TimestampRange {
                start_ms: t.start_ms,
                end_ms,
            }
        }
        Some(Filter::ValueRange(r)) => CellFilter::ValueRange(BytesRange::from_proto(r)),
        Some(Filter::LatestPerColumn(n)) => CellFilter::LatestPerColumn(n),
        Some(Filter::CellsPerRowOffset(n)) => CellFilter::CellsPerRowOffset(n),
        Some(Filter::CellsPerRowLimit(n)) => CellFilter::CellsPerRowLimit(n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(column: &str, ts_ms: u64, value: &str) -> pb::Cell {
        pb::Cell {
            column: Bytes::copy_from_slice(column.as_bytes()),
            timestamp: Timestamp::new(ts_ms, 0).as_u64(),
            origin: "r1".into(),
            value: Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    /// Family `a`: e:1 (two versions), e:2, x; family `b`: e:3.
    fn row() -> pb::Row {
        pb::Row {
            key: Bytes::from_static(b"k"),
            families: vec![
                pb::FamilyCells {
                    name: "a".into(),
                    cells: vec![
                        cell("e:1", 20, "v20"),
                        cell("e:1", 10, "v10"),
                        cell("e:2", 15, "w"),
                        cell("x", 30, "z"),
                    ],
                },
                pb::FamilyCells {
                    name: "b".into(),
                    cells: vec![cell("e:3", 5, "b")],
                },
            ],
        }
    }

    /// (family, column, timestamp ms) of what `f` returns, all versions kept.
    fn run(f: &CellFilter) -> Vec<(String, String, u64)> {
        let Some(row) = f.apply(row(), usize::MAX) else {
            return vec![];
        };
        row.families
            .iter()
            .flat_map(|fam| {
                fam.cells.iter().map(|c| {
                    (
                        fam.name.clone(),
                        String::from_utf8_lossy(&c.column).into_owned(),
                        Timestamp::from_u64(c.timestamp).wall_ms(),
                    )
                })
            })
            .collect()
    }

    fn cols(f: &CellFilter) -> Vec<String> {
        run(f)
            .into_iter()
            .map(|(fam, c, ts)| format!("{fam}:{c}@{ts}"))
            .collect()
    }

    fn regex(s: &str) -> CellFilter {
        CellFilter::QualifierRegex(Pattern::new(s).unwrap())
    }

    #[test]
    fn leaves_keep_what_they_match() {
        let prefix = CellFilter::QualifierPrefix(Bytes::from_static(b"e:"));
        assert_eq!(
            cols(&prefix),
            ["a:e:1@20", "a:e:1@10", "a:e:2@15", "b:e:3@5"]
        );
        assert_eq!(cols(&CellFilter::Family("b".into())), ["b:e:3@5"]);
        let range = CellFilter::QualifierRange(BytesRange {
            start: Bound::Excluded(Bytes::from_static(b"e:1")),
            end: Bound::Included(Bytes::from_static(b"e:3")),
        });
        assert_eq!(cols(&range), ["a:e:2@15", "b:e:3@5"]);
        assert_eq!(cols(&regex("e:[12]")), ["a:e:1@20", "a:e:1@10", "a:e:2@15"]);
        let ts = CellFilter::TimestampRange {
            start_ms: 10,
            end_ms: Some(20),
        };
        assert_eq!(cols(&ts), ["a:e:1@10", "a:e:2@15"]);
        let value = CellFilter::ValueRange(BytesRange {
            start: Bound::Included(Bytes::from_static(b"v")),
            end: Bound::Excluded(Bytes::from_static(b"w")),
        });
        assert_eq!(cols(&value), ["a:e:1@20", "a:e:1@10"]);
        assert_eq!(
            cols(&CellFilter::LatestPerColumn(1)),
            ["a:e:1@20", "a:e:2@15", "a:x@30", "b:e:3@5"]
        );
        assert_eq!(
            cols(&CellFilter::CellsPerRowOffset(3)),
            ["a:x@30", "b:e:3@5"]
        );
        assert_eq!(
            cols(&CellFilter::CellsPerRowLimit(2)),
            ["a:e:1@20", "a:e:1@10"]
        );
    }

    #[test]
    fn a_regex_matches_the_whole_qualifier_and_any_byte() {
        // `e` alone would be found inside every `e:n`; the whole must match.
        assert!(cols(&regex("e")).is_empty());
        assert_eq!(cols(&regex("x|e:2")), ["a:e:2@15", "a:x@30"]);
        let p = Pattern::new("a.c").unwrap();
        assert!(p.matches(b"a\xffc") && p.matches(b"a\nc") && !p.matches(b"abcd"));
        // A pattern that only parses inside the anchors is refused.
        assert!(Pattern::new("a)|(b").is_err());
    }

    #[test]
    fn chains_run_in_turn_and_interleaves_keep_each_cell_once() {
        let chain = CellFilter::Chain(vec![
            CellFilter::QualifierPrefix(Bytes::from_static(b"e:")),
            CellFilter::LatestPerColumn(1),
            CellFilter::CellsPerRowLimit(2),
        ]);
        assert_eq!(cols(&chain), ["a:e:1@20", "a:e:2@15"]);
        let interleave = CellFilter::Interleave(vec![
            CellFilter::Family("b".into()),
            regex("x"),
            CellFilter::QualifierPrefix(Bytes::from_static(b"e:3")),
        ]);
        assert_eq!(cols(&interleave), ["a:x@30", "b:e:3@5"]);
        assert_eq!(cols(&CellFilter::Chain(vec![])).len(), 5);
        assert!(cols(&CellFilter::Interleave(vec![])).is_empty());
    }

    #[test]
    fn versions_per_column_apply_after_the_filter() {
        let f = CellFilter::TimestampRange {
            start_ms: 0,
            end_ms: Some(16),
        };
        let row = f.apply(row(), 1).unwrap();
        let kept: Vec<u64> = row
            .families
            .iter()
            .flat_map(|f| f.cells.iter())
            .map(|c| Timestamp::from_u64(c.timestamp).wall_ms())
            .collect();
        // e:1@20 is out of range, so e:1's newest kept is @10.
        assert_eq!(kept, [10, 15, 5]);
    }

    #[test]
    fn decoding_checks_size_depth_and_regexes_and_names_the_filter() {
        let leaf = CellFilter::LatestPerColumn(1).to_proto();
        let chain = |fs: Vec<pb::CellFilter>| pb::CellFilter {
            filter: Some(pb::cell_filter::Filter::Chain(pb::cell_filter::Chain {
                filters: fs,
            })),
        };
        let wide = chain(vec![leaf.clone(); FILTER_NODES_MAX]);
        let err = CellFilter::from_proto(wide, "cells")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("more than {FILTER_NODES_MAX} nodes")),
            "{err}"
        );
        let mut deep = leaf.clone();
        for _ in 0..FILTER_DEPTH_MAX {
            deep = chain(vec![deep]);
        }
        let err = CellFilter::from_proto(deep, "cells")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nested deeper than 8"), "{err}");
        let mut bad = chain(vec![leaf, regex("x").to_proto()]);
        if let Some(pb::cell_filter::Filter::Chain(c)) = &mut bad.filter {
            c.filters[1].filter = Some(pb::cell_filter::Filter::QualifierRegex("(".into()));
        }
        let err = CellFilter::from_proto(bad, "cells")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cells.chain[1].qualifier_regex"), "{err}");
        let long = "a".repeat(REGEX_BYTES_MAX + 1);
        assert!(Pattern::new(&long).unwrap_err().contains("limit 1024"));
        // A pattern whose automaton would be huge is refused, not built.
        assert!(Pattern::new("(?:a{1000}){1000}").is_err());
        let empty = pb::CellFilter { filter: None };
        assert!(CellFilter::from_proto(empty, "cells").is_err());
        // What decodes encodes back to the same filter.
        let f = CellFilter::Chain(vec![
            regex("e:.*"),
            CellFilter::TimestampRange {
                start_ms: 1,
                end_ms: None,
            },
            CellFilter::Interleave(vec![CellFilter::ValueRange(BytesRange::prefix(b"v"))]),
        ]);
        assert_eq!(CellFilter::from_proto(f.to_proto(), "cells").unwrap(), f);
    }

    #[test]
    fn a_row_sample_keeps_about_its_fraction_and_nests() {
        let keys: Vec<String> = (0..20_000).map(|n| format!("user/{n}")).collect();
        let tenth = keys.iter().filter(|k| in_sample(k.as_bytes(), 0.1)).count();
        assert!((1_800..2_200).contains(&tenth), "{tenth} of 20,000 at 0.1");
        // A smaller sample is inside a larger one; 1 keeps every row.
        assert!(
            keys.iter()
                .all(|k| !in_sample(k.as_bytes(), 0.01) || in_sample(k.as_bytes(), 0.1))
        );
        assert!(keys.iter().all(|k| in_sample(k.as_bytes(), 1.0)));
    }

    /// Columns skipped before the filter runs are those its leading column
    /// tests drop: never one whose cells an offset or a limit would count first.
    #[test]
    fn only_leading_column_tests_skip_columns() {
        let prefix = CellFilter::QualifierPrefix(Bytes::from_static(b"e:"));
        assert!(prefix.column_may_pass("a", b"e:1") && !prefix.column_may_pass("a", b"x"));
        let chain = CellFilter::Chain(vec![
            CellFilter::Interleave(vec![prefix.clone(), CellFilter::Family("b".into())]),
            CellFilter::CellsPerRowLimit(1),
            regex("nothing"),
        ]);
        assert!(chain.column_may_pass("b", b"x") && !chain.column_may_pass("a", b"x"));
        // The regex after the limit is not used to skip.
        assert!(chain.column_may_pass("a", b"e:1"));
        let offset_first =
            CellFilter::Chain(vec![CellFilter::CellsPerRowOffset(5), prefix.clone()]);
        assert!(offset_first.column_may_pass("a", b"x"));
        assert!(CellFilter::LatestPerColumn(1).column_may_pass("a", b"x"));
        // Per-cell tests ahead of a column test (an as-of read's time cut) do
        // not stop the skipping, nor does a nested chain's own leading test.
        let as_of = CellFilter::Chain(vec![
            CellFilter::TimestampRange {
                start_ms: 0,
                end_ms: Some(1_000),
            },
            CellFilter::Chain(vec![prefix, CellFilter::LatestPerColumn(1)]),
        ]);
        assert!(as_of.column_may_pass("a", b"e:1") && !as_of.column_may_pass("a", b"x"));
        // Skipping gives the answer the whole row gives.
        for f in [chain, offset_first, as_of] {
            let skipped = |row: pb::Row| pb::Row {
                families: row
                    .families
                    .into_iter()
                    .map(|mut fam| {
                        let name = fam.name.clone();
                        fam.cells.retain(|c| f.column_may_pass(&name, &c.column));
                        fam
                    })
                    .collect(),
                ..row
            };
            assert_eq!(f.apply(skipped(row()), 9), f.apply(row(), 9));
        }
    }

    #[test]
    fn ranges_intersect_and_prefixes_end_at_their_successor() {
        let p = BytesRange::prefix(b"ab\xff");
        assert_eq!(p.end, Bound::Excluded(Bytes::from_static(b"ac")));
        assert!(p.contains(b"ab\xff\x00") && !p.contains(b"ac") && !p.contains(b"ab"));
        assert_eq!(BytesRange::prefix(b"\xff\xff").end, Bound::Unbounded);
        let r = BytesRange {
            start: Bound::Excluded(Bytes::from_static(b"ab\xff")),
            end: Bound::Included(Bytes::from_static(b"zz")),
        };
        let both = p.intersect(&r);
        assert_eq!(both.start, Bound::Excluded(Bytes::from_static(b"ab\xff")));
        assert_eq!(both.end, Bound::Excluded(Bytes::from_static(b"ac")));
        assert!(!both.is_empty());
        let none = BytesRange::prefix(b"a").intersect(&BytesRange::prefix(b"b"));
        assert!(none.is_empty());
    }
}
