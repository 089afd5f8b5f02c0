//! Change streams: every committed mutation of a table, or of a key prefix of
//! it, read from a replica's replication log, each origin's in its order, and
//! resumed from a [`Cursor`] — the last sequence read of each (scope, origin)
//! stream, a watermark vector.
//!
//! A reader sees a mutation once the replica holds it durably (its stream's
//! durable watermark covers it), so a change, once seen, survives the replica's
//! `kill -9`. Delivery is at least once: a reader that resumes from an older
//! cursor sees changes again, each named by (scope, origin, sequence). The log
//! keeps an entry until every member of its scope has applied it, and for a
//! deployment with change streams for at least the longest `changes.retention`
//! of its tables (`Replica`'s compaction); a cursor behind what the log still
//! holds is refused as [`ChangesError::Expired`], never answered with a gap.

use crate::StorageError;
use crate::hlc::Timestamp;
use crate::ids::{ReplicaId, ScopeId};
use crate::mutation::RowMutation;
use crate::storage::Storage;
use crate::watermark::ScopeWatermarks;
use bytes::Bytes;
use pangea_proto::prost::Message;
use pangea_proto::v1 as pb;
use std::collections::BTreeMap;

/// Where a reader stands: the last sequence read of each (scope, origin) stream.
/// A stream the cursor does not name is read from its first entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor(BTreeMap<(ScopeId, ReplicaId), u64>);

impl Cursor {
    /// A cursor at `streams`' ends: what was written so far is behind it.
    pub fn at<'a>(streams: impl IntoIterator<Item = &'a Stream>) -> Cursor {
        Cursor(
            streams
                .into_iter()
                .map(|s| ((s.scope.clone(), s.origin.clone()), s.durable))
                .collect(),
        )
    }

    /// The last sequence read of a stream (0: none).
    pub fn position(&self, scope: &ScopeId, origin: &ReplicaId) -> u64 {
        self.0
            .get(&(scope.clone(), origin.clone()))
            .copied()
            .unwrap_or(0)
    }

    pub fn positions(&self) -> impl Iterator<Item = (&ScopeId, &ReplicaId, u64)> {
        self.0.iter().map(|((s, o), q)| (s, o, *q))
    }

    fn advance(&mut self, scope: &ScopeId, origin: &ReplicaId, sequence: u64) {
        let p = self.0.entry((scope.clone(), origin.clone())).or_default();
        *p = (*p).max(sequence);
    }

    /// The bytes a reader keeps and sends back (an encoded `ChangeCursor`).
    pub fn encode(&self) -> Bytes {
        let c = pb::ChangeCursor {
            positions: self
                .positions()
                .map(|(s, o, q)| pb::StreamPosition {
                    scope: s.to_string(),
                    origin: o.to_string(),
                    sequence: q,
                })
                .collect(),
        };
        Bytes::from(c.encode_to_vec())
    }

    /// Decodes what [`Cursor::encode`] made; anything else is refused naming
    /// what was wrong.
    pub fn decode(bytes: &[u8]) -> Result<Cursor, String> {
        let c = pb::ChangeCursor::decode(bytes).map_err(|e| format!("not a change cursor: {e}"))?;
        let mut positions = BTreeMap::new();
        for (i, p) in c.positions.into_iter().enumerate() {
            if p.scope.is_empty() || p.origin.is_empty() {
                return Err(format!("position {i}: empty scope or origin"));
            }
            let at = (
                ScopeId::new(p.scope.as_str()),
                ReplicaId::new(p.origin.as_str()),
            );
            if positions.insert(at, p.sequence).is_some() {
                return Err(format!(
                    "position {i}: stream {}/{} given twice",
                    p.scope, p.origin
                ));
            }
        }
        Ok(Cursor(positions))
    }
}

/// Most change-stream readers one replica keeps its log for.
pub const READERS_MAX: usize = 32;
/// How long a registered reader that stopped reading still holds the log.
pub const READER_IDLE_MAX_MS: u64 = 7 * 24 * 3600 * 1000;
/// The replica metadata key the registered readers are kept under.
pub const READERS_META: &str = "change_readers";

/// The named readers a replica keeps its replication log for: the entries
/// after each one's cursor stay (compaction keeps them past the tables'
/// `changes.retention`) while it registers again at least every
/// [`READER_IDLE_MAX_MS`]; at most [`READERS_MAX`] of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readers(BTreeMap<String, Registered>);

/// A registered reader: where it stood when it last registered, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub seen_ms: u64,
    pub cursor: Cursor,
}

impl Readers {
    /// Registers `name` at `cursor` (again: moves it). A new name past
    /// [`READERS_MAX`] live readers is refused, naming the limit.
    pub fn register(&mut self, name: &str, cursor: Cursor, now_ms: u64) -> Result<(), String> {
        pangea_topology::schema::validate_name("reader", name).map_err(|e| e.to_string())?;
        self.0
            .retain(|_, r| now_ms.saturating_sub(r.seen_ms) <= READER_IDLE_MAX_MS);
        if !self.0.contains_key(name) && self.0.len() >= READERS_MAX {
            return Err(format!(
                "{} change-stream readers are registered here, the most a replica keeps \
                 its log for ({READERS_MAX}); reuse a name or let one lapse",
                self.0.len()
            ));
        }
        self.0.insert(
            name.to_owned(),
            Registered {
                seen_ms: now_ms,
                cursor,
            },
        );
        Ok(())
    }

    /// Per stream, the last sequence some live reader has read: compaction
    /// keeps the entries after it.
    pub fn holds(&self, now_ms: u64) -> BTreeMap<(ScopeId, ReplicaId), u64> {
        let mut holds: BTreeMap<(ScopeId, ReplicaId), u64> = BTreeMap::new();
        for r in self.live(now_ms) {
            for (scope, origin, seq) in r.cursor.positions() {
                let h = holds.entry((scope.clone(), origin.clone())).or_insert(seq);
                *h = (*h).min(seq);
            }
        }
        holds
    }

    fn live(&self, now_ms: u64) -> impl Iterator<Item = &Registered> {
        self.0
            .values()
            .filter(move |r| now_ms.saturating_sub(r.seen_ms) <= READER_IDLE_MAX_MS)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Registered)> {
        self.0.iter().map(|(n, r)| (n.as_str(), r))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The bytes kept in replica metadata ([`READERS_META`]).
    pub fn encode(&self) -> Bytes {
        let readers = self
            .0
            .iter()
            .map(|(name, r)| pb::ChangeReader {
                name: name.clone(),
                seen_ms: r.seen_ms,
                cursor: pb::ChangeCursor::decode(&r.cursor.encode()[..]).ok(),
            })
            .collect();
        Bytes::from(pb::ChangeReaders { readers }.encode_to_vec())
    }

    /// What [`Readers::encode`] made; anything else is refused naming what was
    /// wrong.
    pub fn decode(bytes: &[u8]) -> Result<Readers, String> {
        let rs = pb::ChangeReaders::decode(bytes)
            .map_err(|e| format!("not a list of change-stream readers: {e}"))?;
        let mut readers = BTreeMap::new();
        for r in rs.readers {
            let cursor = r.cursor.unwrap_or_default().encode_to_vec();
            let cursor = Cursor::decode(&cursor).map_err(|e| format!("reader {}: {e}", r.name))?;
            readers.insert(
                r.name,
                Registered {
                    seen_ms: r.seen_ms,
                    cursor,
                },
            );
        }
        Ok(Readers(readers))
    }
}

/// One stream a replica can serve changes of: its scope, its origin, and the
/// last sequence the replica holds durably.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    pub scope: ScopeId,
    pub origin: ReplicaId,
    pub durable: u64,
}

impl Stream {
    /// The streams of a scope as far as `w` has applied them: one per origin.
    pub fn of(w: &ScopeWatermarks) -> impl Iterator<Item = Stream> + '_ {
        w.iter().map(|(origin, m)| Stream {
            scope: w.scope.clone(),
            origin: origin.clone(),
            durable: m.sequence,
        })
    }
}

/// One committed mutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub scope: ScopeId,
    pub origin: ReplicaId,
    pub sequence: u64,
    /// The write's HLC time (its cells' version, unless it carried an event time).
    pub timestamp: Timestamp,
    pub mutation: RowMutation,
}

/// What to read, and how much at most.
#[derive(Debug, Clone)]
pub struct Query<'a> {
    pub table: &'a str,
    pub prefix: &'a [u8],
    /// Most changes in one page.
    pub limit: usize,
    /// Most log entries looked at for one page (those of other tables and
    /// prefixes count), so a page costs a bounded time.
    pub scan_max: usize,
    /// Most bytes of mutation payload in one page (at least one change is
    /// always returned when there is one).
    pub bytes_max: usize,
}

impl Change {
    pub fn to_proto(&self) -> pb::Change {
        pb::Change {
            scope: self.scope.to_string(),
            origin: self.origin.to_string(),
            sequence: self.sequence,
            timestamp: self.timestamp.as_u64(),
            mutation: Some(self.mutation.to_proto()),
        }
    }

    /// A change as a replica sent it, its mutation checked as any write's.
    pub fn from_proto(c: pb::Change, limits: &crate::Limits) -> Result<Change, crate::Error> {
        let m = c.mutation.ok_or_else(|| crate::Error::Malformed {
            message: "Change",
            detail: format!("change {}#{} has no mutation", c.origin, c.sequence),
        })?;
        Ok(Change {
            scope: ScopeId::new(c.scope.as_str()),
            origin: ReplicaId::new(c.origin.as_str()),
            sequence: c.sequence,
            timestamp: Timestamp::from_u64(c.timestamp),
            mutation: RowMutation::from_proto(m, limits)?,
        })
    }
}

/// One page of changes and where the next begins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// Each stream's changes in sequence order; streams one after the other.
    pub changes: Vec<Change>,
    pub cursor: Cursor,
    /// The page stopped at a budget: ask again at once with `cursor`.
    pub more: bool,
}

impl Page {
    /// The answer to a `ChangesRequest`.
    pub fn to_proto(&self) -> pb::ChangesResponse {
        pb::ChangesResponse {
            changes: self.changes.iter().map(Change::to_proto).collect(),
            cursor: self.cursor.encode(),
            more: self.more,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    /// The log no longer holds what follows the cursor in this stream.
    #[error(
        "the cursor is behind what this replica keeps of {scope}/{origin}: it read up to \
         #{read}, the log starts at #{first} (entries are kept for the tables' \
         `changes.retention`); resume from a backup or from now"
    )]
    Expired {
        scope: ScopeId,
        origin: ReplicaId,
        read: u64,
        first: u64,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Log entries read from storage in one go.
const READ_CHUNK: usize = 256;

/// Reads the changes of `q.table` under `q.prefix` that follow `from` in
/// `streams`, from `storage`'s replication log: at most `q.limit` changes and
/// `q.scan_max` entries looked at. Streams are read in order, each from the
/// entry after its cursor position up to its durable watermark.
pub fn read<S: Storage + ?Sized>(
    storage: &S,
    streams: &[Stream],
    from: &Cursor,
    q: &Query<'_>,
) -> Result<Page, ChangesError> {
    let mut page = Page {
        cursor: from.clone(),
        ..Page::default()
    };
    let (mut scanned, mut bytes) = (0, 0);
    for s in streams {
        let read = from.position(&s.scope, &s.origin);
        if read >= s.durable {
            page.cursor.advance(&s.scope, &s.origin, read);
            continue;
        }
        let first = storage
            .log_bounds(&s.scope, &s.origin)?
            .map_or(u64::MAX, |(first, _)| first);
        if first > read + 1 {
            return Err(ChangesError::Expired {
                scope: s.scope.clone(),
                origin: s.origin.clone(),
                read,
                first: first.min(s.durable + 1),
            });
        }
        let mut next = read + 1;
        while next <= s.durable {
            if page.changes.len() >= q.limit
                || scanned >= q.scan_max
                || (bytes >= q.bytes_max && !page.changes.is_empty())
            {
                page.more = true;
                return Ok(page);
            }
            let want = READ_CHUNK
                .min(q.scan_max - scanned)
                .min((s.durable - next + 1) as usize);
            let entries = storage.read_log(&s.scope, &s.origin, next, want, usize::MAX)?;
            if entries.is_empty() {
                break; // not expected: the bounds said the log holds them
            }
            for e in entries {
                if e.sequence != next || e.sequence > s.durable {
                    break;
                }
                scanned += 1;
                next += 1;
                let m = &e.mutation;
                if &**m.table() == q.table && m.row_key().starts_with(q.prefix) {
                    bytes += m.payload_bytes();
                    page.changes.push(Change {
                        scope: e.scope,
                        origin: e.origin,
                        sequence: e.sequence,
                        timestamp: e.timestamp,
                        mutation: e.mutation,
                    });
                }
                page.cursor.advance(&s.scope, &s.origin, e.sequence);
                if page.changes.len() >= q.limit || scanned >= q.scan_max || bytes >= q.bytes_max {
                    break;
                }
            }
        }
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;
    use crate::mutation::Mutation;
    use crate::storage::{LogEntry, MemStorage, Watermark};

    fn entry(scope: &str, origin: &str, sequence: u64, table: &str, key: &str) -> LogEntry {
        let m = Mutation::SetCell {
            family: "f".into(),
            column: Bytes::from_static(b"c"),
            value: Bytes::from(format!("{origin}#{sequence}")),
        };
        LogEntry {
            scope: ScopeId::new(scope),
            origin: ReplicaId::new(origin),
            sequence,
            timestamp: Timestamp::new(1_000 + sequence, 0),
            mutation: RowMutation::new(
                table,
                Bytes::from(key.to_owned()),
                vec![m],
                &Limits::default(),
            )
            .unwrap(),
        }
    }

    /// A store whose log holds, in scope `s`, 10 writes of origin `a` (odd ones
    /// to table `t` under `eu/`, even ones to `t` under `us/`) and 3 of `b` to
    /// table `u`.
    fn store() -> (MemStorage, Vec<Stream>) {
        let mut st = MemStorage::default();
        for q in 1..=10 {
            let key = if q % 2 == 1 { "eu/1" } else { "us/1" };
            let e = entry("s", "a", q, "t", key);
            let wm = Watermark {
                sequence: q,
                timestamp: e.timestamp,
            };
            st.append_entry(&e, wm).unwrap();
        }
        for q in 1..=3 {
            let e = entry("s", "b", q, "u", "eu/2");
            let wm = Watermark {
                sequence: q,
                timestamp: e.timestamp,
            };
            st.append_entry(&e, wm).unwrap();
        }
        let streams = vec![
            Stream {
                scope: ScopeId::new("s"),
                origin: ReplicaId::new("a"),
                durable: 10,
            },
            Stream {
                scope: ScopeId::new("s"),
                origin: ReplicaId::new("b"),
                durable: 3,
            },
        ];
        (st, streams)
    }

    fn query<'a>(table: &'a str, prefix: &'a [u8], limit: usize) -> Query<'a> {
        Query {
            table,
            prefix,
            limit,
            scan_max: 10_000,
            bytes_max: 1 << 20,
        }
    }

    fn seqs(p: &Page) -> Vec<(String, u64)> {
        p.changes
            .iter()
            .map(|c| (c.origin.to_string(), c.sequence))
            .collect()
    }

    #[test]
    fn a_table_and_prefix_in_origin_order_resumed_from_the_cursor() {
        let (st, streams) = store();
        let all = read(&st, &streams, &Cursor::default(), &query("t", b"", 100)).unwrap();
        assert_eq!(all.changes.len(), 10);
        assert!(
            all.changes
                .windows(2)
                .all(|w| w[0].sequence < w[1].sequence)
        );
        assert!(!all.more);
        // The cursor passed every entry looked at, of other tables too.
        assert_eq!(
            all.cursor
                .position(&ScopeId::new("s"), &ReplicaId::new("b")),
            3
        );
        let eu = read(&st, &streams, &Cursor::default(), &query("t", b"eu/", 3)).unwrap();
        assert_eq!(
            seqs(&eu),
            [("a".into(), 1), ("a".into(), 3), ("a".into(), 5)]
        );
        assert!(eu.more);
        // Resumed: the rest, nothing twice.
        let rest = read(&st, &streams, &eu.cursor, &query("t", b"eu/", 3)).unwrap();
        assert_eq!(seqs(&rest), [("a".into(), 7), ("a".into(), 9)]);
        // Through its bytes.
        let decoded = Cursor::decode(&rest.cursor.encode()).unwrap();
        assert_eq!(decoded, rest.cursor);
        let none = read(&st, &streams, &decoded, &query("t", b"eu/", 3)).unwrap();
        assert!(none.changes.is_empty() && !none.more);
    }

    #[test]
    fn nothing_past_the_durable_watermark_and_nothing_from_now() {
        let (st, mut streams) = store();
        streams[0].durable = 4;
        let p = read(&st, &streams, &Cursor::default(), &query("t", b"", 100)).unwrap();
        assert_eq!(p.changes.len(), 4);
        let now = Cursor::at(&streams);
        streams[0].durable = 10;
        let p = read(&st, &streams, &now, &query("t", b"", 100)).unwrap();
        assert_eq!(p.changes.first().map(|c| c.sequence), Some(5));
    }

    #[test]
    fn a_cursor_behind_the_log_is_refused_by_name() {
        let (mut st, streams) = store();
        let mut batch = crate::storage::WriteBatch::default();
        batch
            .truncate_log
            .push((ScopeId::new("s"), ReplicaId::new("a"), 6));
        st.write(batch).unwrap();
        let err = read(&st, &streams, &Cursor::default(), &query("t", b"", 100)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("s/a: it read up to #0, the log starts at #6"),
            "{text}"
        );
        let mut at5 = Cursor::default();
        at5.advance(&ScopeId::new("s"), &ReplicaId::new("a"), 5);
        let p = read(&st, &streams, &at5, &query("t", b"", 100)).unwrap();
        assert_eq!(p.changes.first().map(|c| c.sequence), Some(6));
    }

    #[test]
    fn budgets_end_a_page_that_goes_on() {
        let (st, streams) = store();
        let mut q = query("u", b"", 100);
        q.scan_max = 4;
        // Four entries of `a` looked at, none of table `u`.
        let p = read(&st, &streams, &Cursor::default(), &q).unwrap();
        assert!(p.changes.is_empty() && p.more);
        assert_eq!(
            p.cursor.position(&ScopeId::new("s"), &ReplicaId::new("a")),
            4
        );
        let mut q = query("t", b"", 100);
        q.bytes_max = 1;
        let p = read(&st, &streams, &Cursor::default(), &q).unwrap();
        assert_eq!(p.changes.len(), 1, "one change whatever its size");
        assert!(p.more);
    }

    #[test]
    fn malformed_cursors_are_named() {
        assert!(
            Cursor::decode(b"\xff\xff")
                .unwrap_err()
                .contains("not a change cursor")
        );
        let twice = pb::ChangeCursor {
            positions: vec![
                pb::StreamPosition {
                    scope: "s".into(),
                    origin: "a".into(),
                    sequence: 1,
                };
                2
            ],
        };
        let err = Cursor::decode(&twice.encode_to_vec()).unwrap_err();
        assert!(err.contains("stream s/a given twice"), "{err}");
    }

    #[test]
    fn registered_readers_hold_their_streams_until_they_lapse() {
        let (s, a, b) = (ScopeId::new("s"), ReplicaId::new("a"), ReplicaId::new("b"));
        let at = |qa: u64, qb: u64| {
            Cursor::at(&[
                Stream {
                    scope: s.clone(),
                    origin: a.clone(),
                    durable: qa,
                },
                Stream {
                    scope: s.clone(),
                    origin: b.clone(),
                    durable: qb,
                },
            ])
        };
        let mut rs = Readers::default();
        rs.register("pipeline", at(5, 2), 1_000).unwrap();
        rs.register("audit", at(3, 9), 2_000).unwrap();
        let h = rs.holds(3_000);
        assert_eq!(h[&(s.clone(), a.clone())], 3);
        assert_eq!(h[&(s.clone(), b.clone())], 2);
        // Moved on: the hold follows.
        rs.register("pipeline", at(8, 9), 4_000).unwrap();
        assert_eq!(rs.holds(5_000)[&(s.clone(), b.clone())], 9);
        // Through its bytes.
        assert_eq!(Readers::decode(&rs.encode()).unwrap(), rs);
        assert!(Readers::decode(b"\xff\xff").is_err());
        // A reader idle past the limit holds nothing, and makes room.
        let later = 4_000 + READER_IDLE_MAX_MS + 1;
        assert_eq!(rs.holds(later - 2_000)[&(s.clone(), a.clone())], 8);
        assert!(rs.holds(later).is_empty());
        // A bad name and one reader too many are refused by name.
        assert!(rs.register("no/slash", at(0, 0), 5_000).is_err());
        let mut full = Readers::default();
        for i in 0..READERS_MAX {
            full.register(&format!("r{i}"), at(0, 0), 5_000).unwrap();
        }
        let e = full.register("one-more", at(0, 0), 5_000).unwrap_err();
        assert!(e.contains("32"), "{e}");
        full.register("r0", at(1, 1), 5_000).unwrap();
    }
}
