//! The read-filter and key-range flags of `pangea get` and `pangea scan`: flags
//! for the common leaves (they chain, in the order listed), `--filter JSON` for
//! any tree of chains and interleaves (docs/client.md "Filters").

use crate::output::parse_key;
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Args;
use pangea_client::{BytesRange, CellFilter, Pattern, ReadFilter};
use serde_json::Value;
use std::ops::Bound;

/// Which cells of each row come back, evaluated by the replica. The flags chain:
/// a cell must pass every one given.
#[derive(Debug, Args, Default)]
pub(crate) struct FilterArgs {
    /// Only this family (repeat for more).
    #[arg(long)]
    family: Vec<String>,
    /// Versions of each column, newest first (default 1): of the versions the
    /// other filters keep.
    #[arg(long)]
    versions: Option<u32>,
    /// Columns whose qualifier starts with this (text, or 0x followed by hex).
    #[arg(long, value_name = "PREFIX")]
    column_prefix: Option<String>,
    /// Columns from this qualifier on (included).
    #[arg(long, value_name = "QUALIFIER")]
    column_from: Option<String>,
    /// Columns before this qualifier (excluded).
    #[arg(long, value_name = "QUALIFIER")]
    column_to: Option<String>,
    /// Columns whose whole qualifier matches this regular expression (the Rust
    /// `regex` crate's syntax, close to RE2's; `.` is any byte).
    #[arg(long, value_name = "REGEX")]
    column_regex: Option<String>,
    /// Cells written at or after this time: ms since the Unix epoch, or a
    /// duration ago (`24h`, `90d`).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Cells written before this time (as --since).
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// Cells whose value is at least this (bytewise; text or 0x hex).
    #[arg(long, value_name = "VALUE")]
    value_from: Option<String>,
    /// Cells whose value is below this (excluded).
    #[arg(long, value_name = "VALUE")]
    value_to: Option<String>,
    /// A filter tree as JSON, after the flags above, e.g.
    /// '{"interleave":[{"family":"events"},{"qualifier_prefix":"cap:"}]}'
    /// (docs/client.md "Filters" lists every node).
    #[arg(long, value_name = "JSON")]
    filter: Option<String>,
    /// Skip each row's first N cells (of those the filters above keep).
    #[arg(long, value_name = "N")]
    cells_offset: Option<u32>,
    /// At most N cells of each row (after --cells-offset).
    #[arg(long, value_name = "N")]
    cells_limit: Option<u32>,
}

impl FilterArgs {
    pub(crate) fn read_filter(&self) -> Result<ReadFilter> {
        let bytes = |s: &str, flag: &str| -> Result<Bytes> {
            Ok(Bytes::from(
                parse_key(s).with_context(|| format!("--{flag}"))?,
            ))
        };
        let mut chain = Vec::new();
        if let Some(p) = &self.column_prefix {
            chain.push(CellFilter::QualifierPrefix(bytes(p, "column-prefix")?));
        }
        if let Some(r) = from_to(&self.column_from, &self.column_to, "column")? {
            chain.push(CellFilter::QualifierRange(r));
        }
        if let Some(re) = &self.column_regex {
            let p = Pattern::new(re).map_err(|e| anyhow::anyhow!("--column-regex {re:?}: {e}"))?;
            chain.push(CellFilter::QualifierRegex(p));
        }
        if self.since.is_some() || self.until.is_some() {
            let start_ms = match &self.since {
                Some(t) => time_ms(t).context("--since")?,
                None => 0,
            };
            let end_ms = self
                .until
                .as_deref()
                .map(time_ms)
                .transpose()
                .context("--until")?;
            if end_ms.is_some_and(|end| end <= start_ms) {
                bail!("--since {start_ms} ms is not before --until {end_ms:?} ms");
            }
            chain.push(CellFilter::TimestampRange { start_ms, end_ms });
        }
        if let Some(r) = from_to(&self.value_from, &self.value_to, "value")? {
            chain.push(CellFilter::ValueRange(r));
        }
        if let Some(json) = &self.filter {
            let v: Value = serde_json::from_str(json).context("--filter: not JSON")?;
            chain.push(tree(&v, "--filter")?);
        }
        if let Some(n) = self.cells_offset {
            chain.push(CellFilter::CellsPerRowOffset(n));
        }
        if let Some(n) = self.cells_limit {
            chain.push(CellFilter::CellsPerRowLimit(n));
        }
        Ok(ReadFilter {
            families: self.family.iter().map(|f| f.as_str().into()).collect(),
            versions_per_column: self.versions.unwrap_or(0),
            cells: match chain.len() {
                0 => None,
                1 => chain.pop(),
                _ => Some(CellFilter::Chain(chain)),
            },
            ..ReadFilter::default()
        })
    }
}

/// Which keys a scan visits, and in which direction.
#[derive(Debug, Args, Default)]
pub(crate) struct RangeArgs {
    /// Keys from this one on (included; text, or 0x followed by hex).
    #[arg(long, value_name = "KEY", conflicts_with = "after")]
    start: Option<String>,
    /// Keys after this one (excluded).
    #[arg(long, value_name = "KEY")]
    after: Option<String>,
    /// Keys before this one (excluded).
    #[arg(long, value_name = "KEY", conflicts_with = "through")]
    end: Option<String>,
    /// Keys up to this one (included).
    #[arg(long, value_name = "KEY")]
    through: Option<String>,
    /// Highest key first.
    #[arg(long)]
    pub(crate) reverse: bool,
    /// Resume a scan where a page ended (its "more after" key).
    #[arg(long, value_name = "KEY")]
    resume: Option<String>,
}

impl RangeArgs {
    pub(crate) fn range(&self) -> Result<BytesRange> {
        let key = |s: &str, flag: &str| -> Result<Bytes> {
            Ok(Bytes::from(
                parse_key(s).with_context(|| format!("--{flag}"))?,
            ))
        };
        Ok(BytesRange {
            start: match (&self.start, &self.after) {
                (Some(s), _) => Bound::Included(key(s, "start")?),
                (None, Some(s)) => Bound::Excluded(key(s, "after")?),
                (None, None) => Bound::Unbounded,
            },
            end: match (&self.end, &self.through) {
                (Some(s), _) => Bound::Excluded(key(s, "end")?),
                (None, Some(s)) => Bound::Included(key(s, "through")?),
                (None, None) => Bound::Unbounded,
            },
        })
    }

    pub(crate) fn resume_after(&self) -> Result<Bytes> {
        match &self.resume {
            Some(k) => Ok(Bytes::from(parse_key(k).context("--resume")?)),
            None => Ok(Bytes::new()),
        }
    }
}

/// `--NAME-from` (included) and `--NAME-to` (excluded) as a range; `None` when
/// neither is given.
fn from_to(from: &Option<String>, to: &Option<String>, name: &str) -> Result<Option<BytesRange>> {
    let bound = |b: &Option<String>, end: &str| -> Result<Option<Bytes>> {
        b.as_deref()
            .map(|s| {
                Ok(Bytes::from(
                    parse_key(s).with_context(|| format!("--{name}-{end}"))?,
                ))
            })
            .transpose()
    };
    let (start, end) = (bound(from, "from")?, bound(to, "to")?);
    Ok((start.is_some() || end.is_some()).then(|| BytesRange {
        start: start.map_or(Bound::Unbounded, Bound::Included),
        end: end.map_or(Bound::Unbounded, Bound::Excluded),
    }))
}

/// `--since` / `--until` / `--event-time`: ms since the Unix epoch, or a
/// duration before now.
pub(crate) fn time_ms(s: &str) -> Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let ago = crate::parse_duration(s)
        .with_context(|| format!("{s:?}: ms since the Unix epoch, or a duration ago"))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?;
    Ok(now.saturating_sub(ago).as_millis() as u64)
}

/// A filter tree from JSON: one object per node, its one key the node's kind
/// (the names of `CellFilter` in proto/pangea/v1/client.proto).
fn tree(v: &Value, at: &str) -> Result<CellFilter> {
    let obj = v
        .as_object()
        .filter(|o| o.len() == 1)
        .with_context(|| format!("{at}: expected an object with one key, the filter's kind"))?;
    let (kind, arg) = obj.iter().next().expect("one key");
    let at = format!("{at}.{kind}");
    let text = |v: &Value| -> Result<String> {
        v.as_str()
            .map(str::to_owned)
            .with_context(|| format!("{at}: expected a string"))
    };
    let bytes = |v: &Value| -> Result<Bytes> {
        Ok(Bytes::from(
            parse_key(&text(v)?).with_context(|| at.clone())?,
        ))
    };
    let count = |v: &Value| -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .with_context(|| format!("{at}: expected a count (0 to 4294967295)"))
    };
    let list = |v: &Value| -> Result<Vec<CellFilter>> {
        v.as_array()
            .with_context(|| format!("{at}: expected a list of filters"))?
            .iter()
            .enumerate()
            .map(|(i, f)| tree(f, &format!("{at}[{i}]")))
            .collect()
    };
    let range = |v: &Value| -> Result<BytesRange> {
        let o = v.as_object().with_context(|| {
            format!("{at}: expected {{start_closed|start_open, end_closed|end_open}}")
        })?;
        let mut r = BytesRange::ALL;
        for (k, b) in o {
            let b = bytes(b)?;
            match k.as_str() {
                "start_closed" => r.start = Bound::Included(b),
                "start_open" => r.start = Bound::Excluded(b),
                "end_closed" => r.end = Bound::Included(b),
                "end_open" => r.end = Bound::Excluded(b),
                other => bail!(
                    "{at}: unknown bound {other:?} (start_closed, start_open, end_closed, end_open)"
                ),
            }
        }
        Ok(r)
    };
    Ok(match kind.as_str() {
        "chain" => CellFilter::Chain(list(arg)?),
        "interleave" => CellFilter::Interleave(list(arg)?),
        "family" => CellFilter::Family(text(arg)?.as_str().into()),
        "qualifier_prefix" => CellFilter::QualifierPrefix(bytes(arg)?),
        "qualifier_range" => CellFilter::QualifierRange(range(arg)?),
        "qualifier_regex" => CellFilter::QualifierRegex(
            Pattern::new(&text(arg)?).map_err(|e| anyhow::anyhow!("{at}: {e}"))?,
        ),
        "timestamp_range" => {
            let o = arg
                .as_object()
                .with_context(|| format!("{at}: expected {{start_ms, end_ms}}"))?;
            let ms = |k: &str| {
                o.get(k)
                    .map(|v| {
                        v.as_u64()
                            .with_context(|| format!("{at}.{k}: expected ms since the Unix epoch"))
                    })
                    .transpose()
            };
            CellFilter::TimestampRange {
                start_ms: ms("start_ms")?.unwrap_or(0),
                end_ms: ms("end_ms")?,
            }
        }
        "value_range" => CellFilter::ValueRange(range(arg)?),
        "latest_per_column" => CellFilter::LatestPerColumn(count(arg)?),
        "cells_per_row_offset" => CellFilter::CellsPerRowOffset(count(arg)?),
        "cells_per_row_limit" => CellFilter::CellsPerRowLimit(count(arg)?),
        other => bail!(
            "{at}: unknown filter {other:?} (chain, interleave, family, qualifier_prefix, \
             qualifier_range, qualifier_regex, timestamp_range, value_range, \
             latest_per_column, cells_per_row_offset, cells_per_row_limit)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_chain_and_json_builds_any_tree() {
        let f = FilterArgs {
            column_prefix: Some("e:".into()),
            filter: Some(
                r#"{"interleave":[{"family":"events"},{"chain":[{"qualifier_regex":"c.*"},{"latest_per_column":2}]}]}"#
                    .into(),
            ),
            cells_limit: Some(5),
            ..Default::default()
        };
        let got = f.read_filter().unwrap().cells.unwrap();
        let want = CellFilter::Chain(vec![
            CellFilter::QualifierPrefix(Bytes::from_static(b"e:")),
            CellFilter::Interleave(vec![
                CellFilter::Family("events".into()),
                CellFilter::Chain(vec![
                    CellFilter::QualifierRegex(Pattern::new("c.*").unwrap()),
                    CellFilter::LatestPerColumn(2),
                ]),
            ]),
            CellFilter::CellsPerRowLimit(5),
        ]);
        assert_eq!(got, want);
        assert!(FilterArgs::default().read_filter().unwrap().cells.is_none());
    }

    #[test]
    fn bad_filters_name_where() {
        let err = |json: &str| {
            let f = FilterArgs {
                filter: Some(json.into()),
                ..Default::default()
            };
            format!("{:#}", f.read_filter().unwrap_err())
        };
        let e = err(r#"{"chain":[{"family":"a"},{"qualifier_regex":"("}]}"#);
        assert!(e.contains("--filter.chain[1].qualifier_regex"), "{e}");
        let e = err(r#"{"chain":[{"nope":1}]}"#);
        assert!(
            e.contains("--filter.chain[0].nope") && e.contains("unknown filter"),
            "{e}"
        );
        let e = err(r#"{"latest_per_column":-1}"#);
        assert!(e.contains("expected a count"), "{e}");
        let args = FilterArgs {
            since: Some("2000".into()),
            until: Some("1000".into()),
            ..Default::default()
        };
        assert!(args.read_filter().is_err());
    }
}
