//! Mutations: what a client asks to change in one row, validated ("parse, don't
//! validate": a [`RowMutation`] that exists has passed every limit).

use crate::Error;
use crate::hlc::Timestamp;
use crate::limits::{Limited, Limits};
use crate::row::{RowState, Version};
use bytes::Bytes;
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::schema::{FamilyKind, Schema, validate_name};
use std::sync::Arc;

/// A half-open range of timestamps `[start, end)`; `end: None` is unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeRange {
    pub start: Timestamp,
    pub end: Option<Timestamp>,
}

impl TimeRange {
    pub const ALL: TimeRange = TimeRange {
        start: Timestamp::ZERO,
        end: None,
    };

    pub fn contains(&self, t: Timestamp) -> bool {
        t >= self.start && self.end.is_none_or(|end| t < end)
    }

    /// Whether every timestamp in `other` is also in `self`.
    pub fn covers(&self, other: &TimeRange) -> bool {
        self.start <= other.start
            && match (self.end, other.end) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(a), Some(b)) => b <= a,
            }
    }

    fn from_proto(p: Option<pb::TimeRange>) -> Result<Self, Error> {
        let Some(p) = p else {
            return Ok(TimeRange::ALL);
        };
        let end = (p.end != 0).then_some(Timestamp::from_u64(p.end));
        if let Some(end) = end
            && end.as_u64() <= p.start
        {
            return Err(Error::EmptyTimeRange {
                start: p.start,
                end: end.as_u64(),
            });
        }
        Ok(TimeRange {
            start: Timestamp::from_u64(p.start),
            end,
        })
    }

    pub(crate) fn to_proto(self) -> pb::TimeRange {
        pb::TimeRange {
            start: self.start.as_u64(),
            end: self.end.map_or(0, Timestamp::as_u64),
        }
    }
}

/// One change to a row. Deletes affect only versions older than the row mutation
/// carrying them, so within one [`RowMutation`] a delete never removes a cell the same
/// batch sets, whatever their order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    SetCell {
        family: Arc<str>,
        column: Bytes,
        value: Bytes,
    },
    DeleteFromColumn {
        family: Arc<str>,
        column: Bytes,
        range: TimeRange,
    },
    DeleteFromFamily {
        family: Arc<str>,
    },
    DeleteFromRow,
    /// Merge a whole replicated row state (placement migration backfill).
    MergeRow(Box<RowState>),
    /// Add `delta` to a counter cell (a counter family's column). Increments
    /// commute and each counts once, whatever the order and repeats of delivery
    /// (the row module's counters).
    Increment {
        family: Arc<str>,
        column: Bytes,
        delta: i64,
    },
}

impl Mutation {
    pub fn family(&self) -> Option<&str> {
        match self {
            Mutation::SetCell { family, .. }
            | Mutation::DeleteFromColumn { family, .. }
            | Mutation::DeleteFromFamily { family }
            | Mutation::Increment { family, .. } => Some(family),
            Mutation::DeleteFromRow | Mutation::MergeRow(_) => None,
        }
    }

    fn from_proto(p: pb::Mutation, limits: &Limits) -> Result<Self, Error> {
        use pb::mutation::Kind;
        let column_ok =
            |c: &Bytes| Limits::check(Limited::Column, c.len(), limits.column_bytes_max);
        let family = |f: String| -> Result<Arc<str>, Error> {
            validate_name("family", &f)?;
            Ok(f.into())
        };
        match p.kind {
            Some(Kind::SetCell(s)) => {
                column_ok(&s.column)?;
                Limits::check(Limited::Value, s.value.len(), limits.value_bytes_max)?;
                Ok(Mutation::SetCell {
                    family: family(s.family)?,
                    column: s.column,
                    value: s.value,
                })
            }
            Some(Kind::DeleteFromColumn(d)) => {
                column_ok(&d.column)?;
                Ok(Mutation::DeleteFromColumn {
                    family: family(d.family)?,
                    column: d.column,
                    range: TimeRange::from_proto(d.time_range)?,
                })
            }
            Some(Kind::DeleteFromFamily(d)) => Ok(Mutation::DeleteFromFamily {
                family: family(d.family)?,
            }),
            Some(Kind::DeleteFromRow(_)) => Ok(Mutation::DeleteFromRow),
            Some(Kind::MergeRow(m)) => {
                let state = m
                    .state
                    .ok_or_else(|| Error::malformed("MergeRow", "no state"))?;
                let (_, row) = RowState::from_proto(state)?;
                Ok(Mutation::MergeRow(Box::new(row)))
            }
            Some(Kind::Increment(i)) => {
                column_ok(&i.column)?;
                Ok(Mutation::Increment {
                    family: family(i.family)?,
                    column: i.column,
                    delta: i.delta,
                })
            }
            None => Err(Error::malformed("Mutation", "no kind set")),
        }
    }

    /// An equal mutation that shares no memory with this one, except a merged row
    /// (its family names, cells and versions' origins: placement backfill only).
    /// See [`RowMutation::detached`].
    fn detached(&self) -> Mutation {
        let name = |f: &Arc<str>| Arc::from(&**f);
        match self {
            Mutation::SetCell {
                family,
                column,
                value,
            } => Mutation::SetCell {
                family: name(family),
                column: Bytes::copy_from_slice(column),
                value: Bytes::copy_from_slice(value),
            },
            Mutation::DeleteFromColumn {
                family,
                column,
                range,
            } => Mutation::DeleteFromColumn {
                family: name(family),
                column: Bytes::copy_from_slice(column),
                range: *range,
            },
            Mutation::DeleteFromFamily { family } => Mutation::DeleteFromFamily {
                family: name(family),
            },
            Mutation::DeleteFromRow => Mutation::DeleteFromRow,
            Mutation::MergeRow(row) => Mutation::MergeRow(row.clone()),
            Mutation::Increment {
                family,
                column,
                delta,
            } => Mutation::Increment {
                family: name(family),
                column: Bytes::copy_from_slice(column),
                delta: *delta,
            },
        }
    }

    fn to_proto(&self) -> pb::Mutation {
        use pb::mutation::{self as m, Kind};
        let kind = match self {
            Mutation::SetCell {
                family,
                column,
                value,
            } => Kind::SetCell(m::SetCell {
                family: family.to_string(),
                column: column.clone(),
                value: value.clone(),
            }),
            Mutation::DeleteFromColumn {
                family,
                column,
                range,
            } => Kind::DeleteFromColumn(m::DeleteFromColumn {
                family: family.to_string(),
                column: column.clone(),
                time_range: (*range != TimeRange::ALL).then(|| range.to_proto()),
            }),
            Mutation::DeleteFromFamily { family } => Kind::DeleteFromFamily(m::DeleteFromFamily {
                family: family.to_string(),
            }),
            Mutation::DeleteFromRow => Kind::DeleteFromRow(m::DeleteFromRow {}),
            Mutation::MergeRow(row) => Kind::MergeRow(m::MergeRow {
                state: Some(row.to_proto(&Bytes::new())),
            }),
            Mutation::Increment {
                family,
                column,
                delta,
            } => Kind::Increment(m::Increment {
                family: family.to_string(),
                column: column.clone(),
                delta: *delta,
            }),
        };
        pb::Mutation { kind: Some(kind) }
    }
}

/// An atomic batch of mutations to one row, within every [`Limits`] bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMutation {
    table: Arc<str>,
    row_key: Bytes,
    /// Shared: a log entry is copied per peer it goes to and into the write batch.
    mutations: Arc<[Mutation]>,
    /// The writer's event time (Unix ms), if it gave one: the timestamp of
    /// every cell and delete of the row mutation ([`RowMutation::cell_version`]).
    event_time_ms: Option<u64>,
}

impl RowMutation {
    /// Builds and checks a row mutation (limits and names; not the schema).
    pub fn new(
        table: impl Into<Arc<str>>,
        row_key: impl Into<Bytes>,
        mutations: Vec<Mutation>,
        limits: &Limits,
    ) -> Result<Self, Error> {
        let m = RowMutation {
            table: table.into(),
            row_key: row_key.into(),
            mutations: mutations.into(),
            event_time_ms: None,
        };
        // One validation path for local and remote input: round-trip through the
        // checks of `from_proto`. The caller's table name is kept (the same bytes):
        // a name shared with the placement compares by address there.
        let checked = RowMutation::from_proto(m.to_proto(), limits)?;
        Ok(RowMutation {
            table: m.table,
            ..checked
        })
    }

    /// Parses a row mutation from the wire, checking every limit and name.
    pub fn from_proto(p: pb::RowMutation, limits: &Limits) -> Result<Self, Error> {
        Limits::check(
            Limited::RowMutation,
            p.encoded_len(),
            limits.row_mutation_bytes_max,
        )?;
        validate_name("table", &p.table)?;
        if p.row_key.is_empty() {
            return Err(Error::EmptyRowKey);
        }
        Limits::check(Limited::RowKey, p.row_key.len(), limits.row_key_bytes_max)?;
        if p.mutations.is_empty() {
            return Err(Error::EmptyMutation { table: p.table });
        }
        Limits::check(
            Limited::MutationsPerRow,
            p.mutations.len(),
            limits.mutations_per_row_max,
        )?;
        let mutations = p
            .mutations
            .into_iter()
            .map(|m| Mutation::from_proto(m, limits))
            .collect::<Result<_, _>>()?;
        Ok(RowMutation {
            table: p.table.into(),
            row_key: p.row_key,
            mutations,
            event_time_ms: p.event_time_ms,
        })
    }

    /// An equal row mutation that shares no memory with this one (no `Arc`, no
    /// `Bytes` buffer; a merged row excepted), for another thread. Two
    /// threads that clone one reference count write one cache line, and every read
    /// near it then misses on the other core: the simulator's shards hand each
    /// other copies.
    pub fn detached(&self) -> RowMutation {
        RowMutation {
            table: Arc::from(&*self.table),
            row_key: Bytes::copy_from_slice(&self.row_key),
            mutations: self.mutations.iter().map(Mutation::detached).collect(),
            event_time_ms: self.event_time_ms,
        }
    }

    pub fn to_proto(&self) -> pb::RowMutation {
        pb::RowMutation {
            table: self.table.to_string(),
            row_key: self.row_key.clone(),
            mutations: self
                .mutations
                .iter()
                .map(|m| {
                    let mut p = m.to_proto();
                    // A merged state names its row (a loader's merge is
                    // refused otherwise: `auth::check_merge_keys`).
                    if let Some(pb::mutation::Kind::MergeRow(merge)) = &mut p.kind
                        && let Some(state) = &mut merge.state
                    {
                        state.key = self.row_key.clone();
                    }
                    p
                })
                .collect(),
            event_time_ms: self.event_time_ms,
        }
    }

    /// Checks that the table and every family exist in `schema`, and that each
    /// mutation fits its family's kind: increments only to counter families, and
    /// to those only increments and whole deletes (a counter's value is a sum, not
    /// versions to set or to cut by time).
    pub fn check_schema(&self, schema: &Schema) -> Result<(), Error> {
        let table = schema
            .table(&self.table)
            .ok_or_else(|| Error::UnknownTable {
                table: self.table.to_string(),
            })?;
        let merged = self.mutations.iter().filter_map(|m| match m {
            Mutation::MergeRow(r) => Some(r.family_names()),
            _ => None,
        });
        for family in self
            .mutations
            .iter()
            .filter_map(Mutation::family)
            .chain(merged.flatten())
        {
            if table.family(family).is_none() {
                return Err(Error::UnknownFamily {
                    table: self.table.to_string(),
                    family: family.to_owned(),
                });
            }
        }
        for m in self.mutations.iter() {
            let wrong = |family: &str, why: &'static str| Error::FamilyKind {
                table: self.table.to_string(),
                family: family.to_owned(),
                why,
            };
            let kind = |f: &str| table.family(f).map(|g| g.kind).unwrap_or_default();
            let counter = |f: &str| kind(f) == FamilyKind::Counter;
            match m {
                Mutation::Increment { family, .. } if !counter(family) => {
                    return Err(wrong(
                        family,
                        "is not a counter family: increments need `type = \"counter\"`",
                    ));
                }
                Mutation::SetCell { family, .. } if counter(family) => {
                    return Err(wrong(
                        family,
                        "is a counter family: change its cells with increments",
                    ));
                }
                Mutation::DeleteFromColumn { family, range, .. }
                    if counter(family) && *range != TimeRange::ALL =>
                {
                    return Err(wrong(
                        family,
                        "is a counter family: a delete takes a whole counter, not a time range",
                    ));
                }
                Mutation::MergeRow(r) => {
                    if let Some(family) = r.family_names().find(|f| !r.fits_kind(f, kind(f))) {
                        return Err(wrong(
                            family,
                            "does not hold what the merged row holds in it (counts in a \
                             family of cells, or values that are not 8-byte counts)",
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The same row mutation written at event time `ms` (Unix milliseconds)
    /// instead of the accepting replica's clock: for a batch job that backfills
    /// old events, so that their TTL and version order follow when they
    /// happened. The table must declare an `event_time` window, and the replica
    /// refuses a time outside it ([`RowMutation::check_event_time`]).
    pub fn at_event_time(mut self, ms: u64) -> Self {
        self.event_time_ms = Some(ms);
        self
    }

    pub fn event_time_ms(&self) -> Option<u64> {
        self.event_time_ms
    }

    /// The version this row mutation's cells and deletes take when the
    /// replication log orders it at `logged`: `logged` itself, or the event time
    /// with the same origin. Every replica applies a write at this version (the
    /// row module, event time).
    pub fn cell_version(&self, logged: &Version) -> Version {
        match self.event_time_ms {
            None => logged.clone(),
            Some(ms) => Version::new(Timestamp::new(ms, 0), logged.origin.clone()),
        }
    }

    /// Refuses an event time the accepting replica may not take: on a table
    /// without an `event_time` window, with increments or a merged row, or
    /// outside the window around `clock_ms` (the wall time of the clock
    /// reading the write will be logged at; the lower bound is what lets the
    /// table's tombstones be purged safely, the row module's event time).
    pub fn check_event_time(&self, schema: &Schema, clock_ms: u64) -> Result<(), Error> {
        let Some(ms) = self.event_time_ms else {
            return Ok(());
        };
        let refuse = |why: String| Error::EventTime {
            table: self.table.to_string(),
            event_time_ms: ms,
            why,
        };
        let Some(window) = schema.table(&self.table).and_then(|t| t.event_time) else {
            return Err(refuse(
                "the table takes no event times (give it `event_time = { past = \"…\" }` \
                 in the placement file)"
                    .into(),
            ));
        };
        if let Some(m) = self
            .mutations
            .iter()
            .find(|m| matches!(m, Mutation::Increment { .. } | Mutation::MergeRow(_)))
        {
            let what = match m {
                Mutation::Increment { .. } => {
                    "an increment (counters count by the replica's clock)"
                }
                _ => "a merged row",
            };
            return Err(refuse(format!("the row mutation carries {what}")));
        }
        // Not 0: no version is at `Timestamp::ZERO`, the lowest purge horizon
        // (`row::table_horizon`).
        if ms == 0 || ms < clock_ms.saturating_sub(window.past_ms) {
            return Err(refuse(format!(
                "it is {} ms before the replica's clock ({clock_ms}); the table takes event \
                 times at most {} ms back",
                clock_ms - ms,
                window.past_ms
            )));
        }
        if ms > clock_ms.saturating_add(window.future_ms) {
            return Err(refuse(format!(
                "it is {} ms after the replica's clock ({clock_ms}); the table takes event \
                 times at most {} ms ahead",
                ms - clock_ms,
                window.future_ms
            )));
        }
        Ok(())
    }

    pub fn table(&self) -> &Arc<str> {
        &self.table
    }

    pub fn row_key(&self) -> &Bytes {
        &self.row_key
    }

    pub fn mutations(&self) -> &[Mutation] {
        &self.mutations
    }

    /// Bytes of user data carried (keys, columns, values), for flow control and metrics.
    pub fn payload_bytes(&self) -> usize {
        self.row_key.len()
            + self
                .mutations
                .iter()
                .map(|m| match m {
                    Mutation::SetCell { column, value, .. } => column.len() + value.len(),
                    Mutation::DeleteFromColumn { column, .. } => column.len(),
                    Mutation::Increment { column, .. } => column.len() + 8,
                    Mutation::MergeRow(row) => row.value_bytes(),
                    _ => 0,
                })
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_row_mutation_is_equal_and_shares_no_memory() {
        let m = RowMutation::new(
            "t",
            Bytes::from(b"user:1".to_vec()),
            vec![
                set("f", b"c", b"value"),
                Mutation::DeleteFromColumn {
                    family: "f".into(),
                    column: Bytes::from(b"d".to_vec()),
                    range: TimeRange::ALL,
                },
                Mutation::DeleteFromFamily { family: "g".into() },
            ],
            &Limits::default(),
        )
        .unwrap();
        let copy = m.detached();
        assert_eq!(copy, m);
        assert!(!Arc::ptr_eq(&copy.table, &m.table));
        assert!(!Arc::ptr_eq(&copy.mutations, &m.mutations));
        assert_ne!(copy.row_key.as_ptr(), m.row_key.as_ptr());
        for (a, b) in copy.mutations.iter().zip(m.mutations.iter()) {
            let family = |x: &Mutation| x.family().map(str::as_ptr);
            assert_ne!(family(a), family(b));
            if let (
                Mutation::SetCell { column, value, .. },
                Mutation::SetCell {
                    column: c2,
                    value: v2,
                    ..
                },
            ) = (a, b)
            {
                assert_ne!(column.as_ptr(), c2.as_ptr());
                assert_ne!(value.as_ptr(), v2.as_ptr());
            }
        }
    }

    fn set(family: &str, column: &[u8], value: &[u8]) -> Mutation {
        Mutation::SetCell {
            family: family.into(),
            column: Bytes::copy_from_slice(column),
            value: Bytes::copy_from_slice(value),
        }
    }

    #[test]
    fn limits_name_what_and_how_big() {
        let limits = Limits::default();
        let key = vec![b'k'; 4097];
        let err = RowMutation::new("t", key, vec![set("f", b"c", b"v")], &limits).unwrap_err();
        assert_eq!(
            err,
            Error::TooLarge {
                what: Limited::RowKey,
                size: 4097,
                limit: 4096
            }
        );
        assert_eq!(err.to_string(), "row key is 4097 bytes, limit 4096");

        let col = vec![b'c'; 16 * 1024 + 1];
        let err = RowMutation::new("t", "k", vec![set("f", &col, b"v")], &limits).unwrap_err();
        assert_eq!(
            err,
            Error::TooLarge {
                what: Limited::Column,
                size: 16385,
                limit: 16384
            }
        );

        let small = Limits {
            value_bytes_max: 10,
            ..limits
        };
        let err = RowMutation::new("t", "k", vec![set("f", b"c", &[0; 11])], &small).unwrap_err();
        assert_eq!(
            err,
            Error::TooLarge {
                what: Limited::Value,
                size: 11,
                limit: 10
            }
        );
    }

    #[test]
    fn structure_is_checked() {
        let limits = Limits::default();
        assert_eq!(
            RowMutation::new("t", "", vec![set("f", b"c", b"v")], &limits),
            Err(Error::EmptyRowKey)
        );
        assert!(matches!(
            RowMutation::new("t", "k", vec![], &limits),
            Err(Error::EmptyMutation { .. })
        ));
        assert!(matches!(
            RowMutation::new("t\0x", "k", vec![set("f", b"c", b"v")], &limits),
            Err(Error::InvalidName(_))
        ));
        let bad_range = Mutation::DeleteFromColumn {
            family: "f".into(),
            column: Bytes::from_static(b"c"),
            range: TimeRange {
                start: Timestamp::from_u64(5),
                end: Some(Timestamp::from_u64(5)),
            },
        };
        assert_eq!(
            RowMutation::new("t", "k", vec![bad_range], &limits),
            Err(Error::EmptyTimeRange { start: 5, end: 5 })
        );
        let no_kind = pb::RowMutation {
            event_time_ms: None,
            table: "t".into(),
            row_key: Bytes::from_static(b"k"),
            mutations: vec![pb::Mutation { kind: None }],
        };
        assert!(matches!(
            RowMutation::from_proto(no_kind, &limits),
            Err(Error::Malformed { .. })
        ));
    }

    #[test]
    fn schema_names_unknown_table_and_family() {
        use pangea_topology::schema::GcPolicy;
        let schema = Schema::single_table("profiles", &[("p", GcPolicy::default())]);
        let limits = Limits::default();
        let m = RowMutation::new("profiles", "u1", vec![set("p", b"c", b"v")], &limits).unwrap();
        assert_eq!(m.check_schema(&schema), Ok(()));
        let m = RowMutation::new("profiles", "u1", vec![set("q", b"c", b"v")], &limits).unwrap();
        assert_eq!(
            m.check_schema(&schema),
            Err(Error::UnknownFamily {
                table: "profiles".into(),
                family: "q".into()
            })
        );
        let m = RowMutation::new("other", "u1", vec![set("p", b"c", b"v")], &limits).unwrap();
        assert_eq!(
            m.check_schema(&schema),
            Err(Error::UnknownTable {
                table: "other".into()
            })
        );
    }

    #[test]
    fn round_trips_through_proto() {
        let limits = Limits::default();
        let m = RowMutation::new(
            "t",
            "k",
            vec![
                set("f", b"c", b"v"),
                Mutation::DeleteFromColumn {
                    family: "f".into(),
                    column: Bytes::from_static(b"d"),
                    range: TimeRange {
                        start: Timestamp::from_u64(3),
                        end: Some(Timestamp::from_u64(9)),
                    },
                },
                Mutation::DeleteFromFamily { family: "g".into() },
                Mutation::DeleteFromRow,
            ],
            &limits,
        )
        .unwrap();
        assert_eq!(RowMutation::from_proto(m.to_proto(), &limits).unwrap(), m);
    }
}
