//! Backups and point-in-time restores (`pangea backup`; docs/operations.md,
//! "Back up and restore" and "Recover from a bad batch job").
//!
//! A backup is a directory: `manifest.json` and, per replication scope, one
//! file of rows and one of changes per table, under `POLICY/SCOPE/`, so that the
//! files of a restricted policy can be stored apart, where its regions allow
//! (the manifest names them). Each scope is read from one replica that holds
//! it ([`create`]):
//!
//! 1. its watermarks `start`, then every row of every table (all the versions
//!    it holds), page by page, while it keeps serving and taking writes;
//! 2. its watermarks `end` once they cover every version the rows showed;
//! 3. from its change stream, every write of `start..end` (the *tail*).
//!
//! Rows are CRDTs: a row read at any moment between `start` and `end` with the
//! tail merged into it is the row exactly as of `end`, the backup's cut, a
//! watermark vector every replica of the scope reaches. A table without a
//! change stream has no tail: its rows are each as of some moment between
//! `start` and `end`, and the manifest says so (`exact: false`).
//!
//! An incremental backup holds only changes: each scope's writes from its
//! parent's cut to its own. [`restore`] takes a chain (a full backup and the
//! incrementals after it), optionally the live cluster's change log beyond
//! it, and writes the rows as of a time into a cluster.
//!
//! Files are varint-length-prefixed protobuf records (`pangea.v1.Row`,
//! `pangea.v1.Change`), each with its SHA-256 in the manifest, checked before
//! a byte of it is used.

pub mod create;
pub mod restore;

use anyhow::{Context, Result, bail, ensure};
use pangea_core::changes::{Cursor, Stream};
use pangea_core::{ReplicaId, ScopeId, ScopeWatermarks};
use pangea_proto::Message;
use serde::{Deserialize, Serialize};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

pub use create::{CreateOptions, create};
pub use restore::{Mode, RestoreOptions, RestoreReport, restore, rows_at_cut};

/// The manifest's file name inside a backup directory.
pub const MANIFEST: &str = "manifest.json";
/// The layout this code writes and reads.
pub const FORMAT: u32 = 1;
/// Longest record read back (a row is at most 16 MiB, plus its envelope).
const RECORD_BYTES_MAX: usize = 24 << 20;

/// What a backup directory holds (`manifest.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format: u32,
    /// Unique per backup: the start time and a random suffix.
    pub id: String,
    pub kind: Kind,
    /// An incremental backup's parent: the backup whose cut it starts from.
    pub parent: Option<Parent>,
    pub started_ms: u64,
    pub finished_ms: u64,
    /// The tables backed up.
    pub tables: Vec<String>,
    /// Scopes left out, and why (a restricted policy is backed up only from
    /// one of its regions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    pub scopes: Vec<ScopeBackup>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Every row, and the tail that makes them a cut.
    Full,
    /// The changes since the parent's cut.
    Incremental,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Parent {
    pub id: String,
    /// Where it was, as given to `--incremental-from` (absolute).
    pub dir: PathBuf,
}

/// One replication scope's part of a backup.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScopeBackup {
    pub scope: String,
    pub policy: String,
    /// The regions the policy allows: where this scope's files may be stored.
    pub regions: Vec<String>,
    /// The replica it was read from (of the policy, so in those regions).
    pub replica: String,
    /// The watermarks before the rows were read (incremental: the parent's cut).
    pub start: Vec<Position>,
    /// The cut: every write up to these, per origin, and no other.
    pub end: Vec<Position>,
    /// Whether the rows are exactly as of `end` (every table had its tail).
    pub exact: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub files: Vec<FileEntry>,
}

/// How far one origin's stream reached.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Position {
    pub origin: String,
    pub sequence: u64,
    /// The HLC time of that write (`Timestamp::as_u64`).
    pub timestamp: u64,
    /// Its wall time, for people.
    pub wall_ms: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// `pangea.v1.Row` records: every version the replica held.
    Rows,
    /// `pangea.v1.Change` records, each origin's in its order.
    Changes,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    /// Relative to the backup directory.
    pub path: String,
    pub table: String,
    pub kind: FileKind,
    pub records: u64,
    pub bytes: u64,
    pub sha256: String,
}

impl Manifest {
    /// Reads `DIR/manifest.json`, naming the file in any error.
    pub fn load(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let m: Manifest = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a backup manifest", path.display()))?;
        ensure!(
            m.format == FORMAT,
            "{}: format {} (this pangea reads format {FORMAT})",
            path.display(),
            m.format
        );
        Ok(m)
    }

    /// Writes the manifest last, atomically: a directory without one is not a
    /// backup (an interrupted run leaves none).
    pub fn store(&self, dir: &Path) -> Result<()> {
        let tmp = dir.join(format!("{MANIFEST}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(serde_json::to_string_pretty(self)?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(MANIFEST))?;
        sync_dir(dir)
    }

    /// The latest wall time of its cut: what a restore as of a time must not
    /// be before.
    pub fn cut_ms(&self) -> u64 {
        self.scopes
            .iter()
            .flat_map(|s| s.end.iter().map(|p| p.wall_ms))
            .max()
            .unwrap_or(self.started_ms)
    }

    /// Rows and bytes of its files.
    pub fn totals(&self) -> (u64, u64) {
        self.scopes
            .iter()
            .flat_map(|s| &s.files)
            .fold((0, 0), |(r, b), f| (r + f.records, b + f.bytes))
    }
}

impl Position {
    pub fn of(watermarks: &ScopeWatermarks) -> Vec<Position> {
        watermarks
            .iter()
            .map(|(origin, w)| Position {
                origin: origin.to_string(),
                sequence: w.sequence,
                timestamp: w.timestamp.as_u64(),
                wall_ms: w.timestamp.wall_ms(),
            })
            .collect()
    }
}

/// A change stream cursor at `positions` of each scope.
pub(crate) fn cursor_at<'a>(
    positions: impl IntoIterator<Item = (&'a str, &'a [Position])>,
) -> Cursor {
    let streams: Vec<Stream> = positions
        .into_iter()
        .flat_map(|(scope, ps)| {
            ps.iter().map(move |p| Stream {
                scope: ScopeId::new(scope),
                origin: ReplicaId::new(p.origin.as_str()),
                durable: p.sequence,
            })
        })
        .collect();
    Cursor::at(&streams)
}

/// A directory-safe name for a policy or scope.
pub(crate) fn file_name(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '_',
        })
        .collect()
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes length-prefixed records to one file, hashing as it goes.
pub(crate) struct RecordWriter {
    rel: String,
    out: BufWriter<std::fs::File>,
    sha: ring::digest::Context,
    records: u64,
    bytes: u64,
}

impl std::fmt::Debug for RecordWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("rel", &self.rel)
            .field("records", &self.records)
            .finish()
    }
}

impl RecordWriter {
    /// A new file `rel` under `dir` (its directories made).
    pub(crate) fn create(dir: &Path, rel: &str) -> Result<RecordWriter> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let f =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(RecordWriter {
            rel: rel.to_owned(),
            out: BufWriter::with_capacity(1 << 20, f),
            sha: ring::digest::Context::new(&ring::digest::SHA256),
            records: 0,
            bytes: 0,
        })
    }

    pub(crate) fn push(&mut self, m: &impl Message) -> Result<()> {
        let buf = m.encode_length_delimited_to_vec();
        self.out.write_all(&buf)?;
        self.sha.update(&buf);
        self.records += 1;
        self.bytes += buf.len() as u64;
        Ok(())
    }

    /// Flushes and syncs the file; its entry for the manifest.
    pub(crate) fn finish(self, table: &str, kind: FileKind) -> Result<FileEntry> {
        let f = self.out.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok(FileEntry {
            path: self.rel,
            table: table.to_owned(),
            kind,
            records: self.records,
            bytes: self.bytes,
            sha256: hex(self.sha.finish().as_ref()),
        })
    }
}

/// Checks a file against its manifest entry: its length and SHA-256.
pub fn verify_file(dir: &Path, f: &FileEntry) -> Result<()> {
    let path = dir.join(&f.path);
    let mut file = BufReader::with_capacity(
        1 << 20,
        std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?,
    );
    let mut sha = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha.update(&buf[..n]);
        len += n as u64;
    }
    ensure!(
        len == f.bytes,
        "{}: {len} bytes, the manifest says {}: the file is damaged",
        path.display(),
        f.bytes
    );
    let got = hex(sha.finish().as_ref());
    ensure!(
        got == f.sha256,
        "{}: SHA-256 {got}, the manifest says {}: the file is damaged",
        path.display(),
        f.sha256
    );
    Ok(())
}

/// Checks every file of a backup (`pangea backup verify`).
pub fn verify(dir: &Path) -> Result<Manifest> {
    let m = Manifest::load(dir)?;
    for s in &m.scopes {
        for f in &s.files {
            verify_file(dir, f)?;
        }
    }
    Ok(m)
}

/// The records of a file, decoded one by one; an error names the file, the
/// record and its byte offset.
pub(crate) struct RecordReader<M> {
    path: PathBuf,
    input: BufReader<std::fs::File>,
    offset: u64,
    index: u64,
    _m: std::marker::PhantomData<M>,
}

impl<M> std::fmt::Debug for RecordReader<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordReader")
            .field("path", &self.path)
            .field("index", &self.index)
            .finish()
    }
}

impl<M: Message + Default> RecordReader<M> {
    pub(crate) fn open(dir: &Path, f: &FileEntry) -> Result<RecordReader<M>> {
        let path = dir.join(&f.path);
        let file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        Ok(RecordReader {
            path,
            input: BufReader::with_capacity(1 << 20, file),
            offset: 0,
            index: 0,
            _m: std::marker::PhantomData,
        })
    }

    fn next_record(&mut self) -> Result<Option<M>> {
        // The varint length: at most 10 bytes, the first may be the end.
        let mut len: u64 = 0;
        let mut shift = 0;
        let mut read = 0;
        loop {
            let mut b = [0u8; 1];
            if self.input.read(&mut b)? == 0 {
                if read == 0 {
                    return Ok(None);
                }
                bail!("the file ends inside a record's length");
            }
            read += 1;
            len |= u64::from(b[0] & 0x7f) << shift;
            if b[0] & 0x80 == 0 {
                break;
            }
            shift += 7;
            ensure!(shift < 64, "a record length longer than 10 bytes");
        }
        ensure!(
            len as usize <= RECORD_BYTES_MAX,
            "a record of {len} bytes (at most {RECORD_BYTES_MAX})"
        );
        let mut buf = vec![0; len as usize];
        self.input
            .read_exact(&mut buf)
            .context("the file ends inside a record")?;
        let m = M::decode(&buf[..])?;
        self.offset += read + len;
        self.index += 1;
        Ok(Some(m))
    }
}

impl<M: Message + Default> Iterator for RecordReader<M> {
    type Item = Result<M>;

    fn next(&mut self) -> Option<Result<M>> {
        let (index, offset) = (self.index, self.offset);
        self.next_record()
            .with_context(|| format!("{}: record {index} at byte {offset}", self.path.display()))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pangea_proto::v1 as pb;

    fn row(key: &str, value: &[u8]) -> pb::Row {
        pb::Row {
            key: key.as_bytes().to_vec().into(),
            families: vec![pb::FamilyCells {
                name: "f".into(),
                cells: vec![pb::Cell {
                    column: "c".into(),
                    timestamp: 7,
                    origin: "a".into(),
                    value: value.to_vec().into(),
                }],
            }],
        }
    }

    #[test]
    fn records_round_trip_and_damage_is_named() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut w = RecordWriter::create(dir.path(), "global/global/t.rows")?;
        let rows: Vec<pb::Row> = (0..100)
            .map(|i| row(&format!("k{i}"), &vec![i as u8; i * 37]))
            .collect();
        for r in &rows {
            w.push(r)?;
        }
        let entry = w.finish("t", FileKind::Rows)?;
        assert_eq!(entry.records, 100);
        verify_file(dir.path(), &entry)?;
        let back: Vec<pb::Row> = RecordReader::open(dir.path(), &entry)?.collect::<Result<_>>()?;
        assert_eq!(back, rows);
        // One flipped byte: the checksum names the file.
        let path = dir.path().join(&entry.path);
        let mut bytes = std::fs::read(&path)?;
        bytes[500] ^= 1;
        std::fs::write(&path, &bytes)?;
        let e = verify_file(dir.path(), &entry).unwrap_err().to_string();
        assert!(e.contains("t.rows") && e.contains("damaged"), "{e}");
        // Cut short: the reader names the record and its offset.
        std::fs::write(&path, &bytes[..bytes.len() - 3])?;
        let e = RecordReader::<pb::Row>::open(dir.path(), &entry)?
            .find_map(|r| r.err())
            .expect("an error")
            .to_string();
        assert!(e.contains("record 99"), "{e}");
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        /// Whatever a backup file holds (a damaged or forged one), reading it
        /// yields records or errors that name the file, never a panic; and
        /// records written are read back as written.
        #[test]
        fn any_file_reads_without_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
            values in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300), 0..20),
        ) {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("f"), &bytes).unwrap();
            let entry = FileEntry {
                path: "f".into(),
                table: "t".into(),
                kind: FileKind::Changes,
                records: 0,
                bytes: bytes.len() as u64,
                sha256: String::new(),
            };
            for r in RecordReader::<pb::Change>::open(dir.path(), &entry).unwrap().take(10_000) {
                if let Err(e) = r {
                    proptest::prop_assert!(format!("{e:#}").contains("record"), "{e:#}");
                    break;
                }
            }
            let mut w = RecordWriter::create(dir.path(), "g").unwrap();
            let rows: Vec<pb::Row> = values.iter().enumerate().map(|(i, v)| row(&format!("k{i}"), v)).collect();
            for r in &rows {
                w.push(r).unwrap();
            }
            let entry = w.finish("t", FileKind::Rows).unwrap();
            verify_file(dir.path(), &entry).unwrap();
            let back: Vec<pb::Row> = RecordReader::open(dir.path(), &entry).unwrap().collect::<Result<_>>().unwrap();
            proptest::prop_assert_eq!(back, rows);
        }
    }

    #[test]
    fn a_huge_length_is_refused_not_allocated() -> Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("x"), [0xff, 0xff, 0xff, 0xff, 0x7f])?;
        let entry = FileEntry {
            path: "x".into(),
            table: "t".into(),
            kind: FileKind::Rows,
            records: 1,
            bytes: 5,
            sha256: String::new(),
        };
        let e = RecordReader::<pb::Row>::open(dir.path(), &entry)?
            .next()
            .expect("a record")
            .unwrap_err();
        assert!(format!("{e:#}").contains("at most"), "{e:#}");
        Ok(())
    }
}
