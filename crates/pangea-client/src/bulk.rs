//! Bulk loads of batch-built rows into one table, as Spotify bulk-loads its profile
//! store (docs/bulk-load.md): what `pangea load` runs, usable by any batch job.
//!
//! Input is NDJSON (one JSON object per line) or a stream of varint-length-prefixed
//! `pangea.v1.RowMutation` messages. A reader thread parses and checks every record
//! (format, size limits, the placement file's schema) in input order; [`load`]
//! writes each row once through a [`Client`], which sends it to the nearest replica
//! its placement policy allows; replication carries it along the scope's tree to
//! every other replica of the scope. Rows go in batch writes
//! ([`Client::mutate_rows`]) of up to [`Options::batch_rows`] rows, as many as the
//! input has ready, [`Options::concurrency`] requests in flight; a key repeated in
//! the input is written in input order, one write at a time.
//!
//! Bad records: by default the load stops at the first one, before writing it (rows
//! before it are written, rows after it are not) and [`Report::verdict`] says how to
//! resume ([`Options::skip`]); [`Options::keep_going`] reports each bad record,
//! counts it and goes on. Messages name a record by its position (`FILE:LINE`, or
//! record number and byte offset), never by its key or values.
//!
//! ```no_run
//! # async fn f(client: pangea_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use pangea_client::bulk::{self, Counters, Format, Options};
//! use std::sync::Arc;
//! let input = std::io::BufReader::new(std::fs::File::open("profiles.ndjson")?);
//! let opts = Options::new("ad_profiles", Format::Ndjson);
//! let report = bulk::load(Some(&client), None, Box::new(input), "profiles.ndjson",
//!     &opts, Arc::new(Counters::default()), &mut |problem| eprintln!("{problem}")).await;
//! report.verdict()?;
//! # Ok(()) }
//! ```

use crate::{Client, RowMutation, WriteOptions};
use base64::Engine as _;
use bytes::Bytes;
use hdrhistogram::Histogram;
use pangea_core::Limits;
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::Deployment;
use pangea_topology::schema::Schema;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Longest NDJSON line read (a row of at most the row limit, as JSON, fits).
pub const LINE_BYTES_MAX: usize = 32 << 20;
/// Problems shown with `keep_going` before the rest are only counted.
pub const PROBLEMS_SHOWN_MAX: u64 = 100;
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(2);
const MB: f64 = 1e6;

/// How the input is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line: `{"key": "...", "cells": {"FAMILY:COLUMN": VALUE}}`.
    Ndjson,
    /// Varint-length-prefixed `pangea.v1.RowMutation` messages.
    Protobuf,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Ndjson => "ndjson",
            Format::Protobuf => "protobuf",
        }
    }

    /// From the input's extension: .ndjson, .jsonl, .json; .pb, .bin, .binpb.
    pub fn from_path(input: &str) -> Result<Format, String> {
        let ext = Path::new(input)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("ndjson" | "jsonl" | "json") => Ok(Format::Ndjson),
            Some("pb" | "bin" | "binpb") => Ok(Format::Protobuf),
            _ if input == "-" => {
                Err("reading stdin: say --format ndjson or --format protobuf".into())
            }
            _ => Err(format!(
                "cannot tell the format of {input} from its extension (.ndjson/.jsonl or \
                 .pb/.bin): say --format ndjson or --format protobuf"
            )),
        }
    }
}

/// How a load runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub table: String,
    pub format: Format,
    /// Write requests in flight at once (each a batch of up to `batch_rows` rows).
    pub concurrency: usize,
    /// Most rows in one batch write ([`Client::mutate_rows`]); 1 writes each row
    /// alone ([`Client::mutate`]).
    pub batch_rows: usize,
    /// Records (NDJSON: lines) skipped without writing them: resumes a load that
    /// stopped.
    pub skip: u64,
    /// Report and count bad records and failed writes, and go on (else stop at the
    /// first, before writing it).
    pub keep_going: bool,
    /// Retries of a row write that failed for a passing reason (replica unavailable,
    /// deadline), with back-off; a rejected write (schema, policy) is not retried.
    pub retries: u32,
    pub write: WriteOptions,
    pub limits: Limits,
}

impl Options {
    /// Batches of 100 rows, 8 in flight, 3 retries, stop at the first problem.
    pub fn new(table: &str, format: Format) -> Options {
        Options {
            table: table.to_owned(),
            format,
            concurrency: 8,
            batch_rows: 100,
            skip: 0,
            keep_going: false,
            retries: 3,
            // A load's rows are harmless to write twice (no increments).
            write: WriteOptions {
                resend_if_unknown: true,
                ..WriteOptions::default()
            },
            limits: Limits::default(),
        }
    }
}

/// Where a record is in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// NDJSON: the line number (1-based).
    Line(u64),
    /// Protobuf: the record number (1-based) and the byte offset of its length prefix.
    Record { n: u64, offset: u64 },
}

impl Loc {
    /// The record's number (1-based).
    pub fn n(self) -> u64 {
        match self {
            Loc::Line(n) | Loc::Record { n, .. } => n,
        }
    }

    pub fn show(self, input: &str) -> String {
        match self {
            Loc::Line(n) => format!("{input}:{n}"),
            Loc::Record { n, offset } => format!("{input}: record {n} (byte offset {offset})"),
        }
    }
}

/// What the reader thread hands the loader, in input order.
#[derive(Debug)]
enum Parsed {
    Row {
        loc: Loc,
        mutation: RowMutation,
    },
    /// A record that cannot be written. `fatal`: the input cannot be read past it
    /// (a broken length prefix, a read error), so even `keep_going` stops.
    Bad {
        loc: Loc,
        why: String,
        fatal: bool,
    },
}

impl Parsed {
    fn bad(loc: Loc, why: String) -> Parsed {
        Parsed::Bad {
            loc,
            why,
            fatal: false,
        }
    }

    fn of(loc: Loc, checked: Result<RowMutation, String>) -> Parsed {
        match checked {
            Ok(mutation) => Parsed::Row { loc, mutation },
            Err(why) => Parsed::bad(loc, why),
        }
    }
}

/// Progress of a load, shared with whoever shows it while it runs.
#[derive(Debug, Default)]
pub struct Counters {
    pub rows: AtomicU64,
    /// Row keys, column qualifiers and values written, in bytes.
    pub bytes: AtomicU64,
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
    pub skipped: AtomicU64,
    /// Records the reader has read (skipped ones included).
    pub records: AtomicU64,
    /// Input bytes consumed by the reader.
    pub input_bytes: AtomicU64,
}

/// Everything that checks one record.
#[derive(Debug)]
struct Checker {
    table: Arc<str>,
    limits: Limits,
    /// The placement file's tables; `None` when it declares none (the replica checks).
    schema: Option<Schema>,
}

impl Checker {
    /// Limits, names and the schema, on a row mutation about to be written.
    fn finish(&self, p: pb::RowMutation) -> Result<RowMutation, String> {
        for m in &p.mutations {
            match &m.kind {
                Some(pb::mutation::Kind::SetCell(s))
                    if s.value.len() > self.limits.value_bytes_max =>
                {
                    return Err(format!(
                        "cell {}: value is {} bytes, over the limit of {} bytes",
                        cell_name(&s.family, &s.column),
                        s.value.len(),
                        self.limits.value_bytes_max
                    ));
                }
                Some(pb::mutation::Kind::MergeRow(_)) => {
                    return Err("MergeRow is internal to placement migrations; a load \
                                carries SetCell and deletes"
                        .into());
                }
                // A load may write a record twice (a resumed load rewrites what
                // it cannot tell was written): harmless for cells, not for counts.
                Some(pb::mutation::Kind::Increment(i)) => {
                    return Err(format!(
                        "counter {}: a load carries SetCell and deletes, not increments, \
                         which count twice when a resumed load writes them again \
                         (count with the client's increment or `pangea incr`)",
                        cell_name(&i.family, &i.column)
                    ));
                }
                _ => {}
            }
        }
        let m = RowMutation::from_proto(p, &self.limits).map_err(|e| e.to_string())?;
        if let Some(schema) = &self.schema {
            m.check_schema(schema).map_err(|e| e.to_string())?;
        }
        Ok(m)
    }

    /// One NDJSON line: `{"key": TEXT | "key_b64": BASE64, "cells": {"FAMILY:COLUMN":
    /// TEXT | {"b64": BASE64}, ...}}`.
    fn ndjson(&self, line: &[u8]) -> Result<RowMutation, String> {
        let v: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
            let msg = e.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_owned();
            format!("invalid JSON at column {}: {msg}", e.column())
        })?;
        let serde_json::Value::Object(obj) = v else {
            return Err(r#"expected a JSON object like {"key": "...", "cells": {...}}"#.into());
        };
        let mut key = None;
        let mut cells = None;
        let mut event_time_ms = None;
        for (name, value) in &obj {
            match name.as_str() {
                "key" => match value {
                    serde_json::Value::String(s) => key = Some(Bytes::from(s.clone())),
                    _ => return Err(r#""key" must be a string (use "key_b64" for bytes)"#.into()),
                },
                "key_b64" => match value {
                    serde_json::Value::String(s) => {
                        key = Some(Bytes::from(
                            base64_decode(s).map_err(|e| format!("\"key_b64\": {e}"))?,
                        ));
                    }
                    _ => return Err(r#""key_b64" must be a base64 string"#.into()),
                },
                "cells" => match value {
                    serde_json::Value::Object(c) => cells = Some(c),
                    _ => {
                        return Err(
                            r#""cells" must be an object {"FAMILY:COLUMN": VALUE, ...}"#.into()
                        );
                    }
                },
                "event_time_ms" => match value.as_u64() {
                    Some(ms) => event_time_ms = Some(ms),
                    None => {
                        return Err(
                            r#""event_time_ms" must be a whole number of ms since the Unix epoch"#
                                .into(),
                        );
                    }
                },
                other => {
                    return Err(format!(
                        "unknown field {:?} (expected \"key\" or \"key_b64\", \"cells\", and \
                         optionally \"event_time_ms\")",
                        truncated(other)
                    ));
                }
            }
        }
        if obj.contains_key("key") && obj.contains_key("key_b64") {
            return Err(r#"both "key" and "key_b64": give one"#.into());
        }
        let key = key.ok_or(r#"no "key" (or "key_b64")"#)?;
        let cells = cells.ok_or(r#"no "cells""#)?;
        if cells.is_empty() {
            return Err(r#""cells" is empty: a row needs at least one cell"#.into());
        }
        let mut mutations = Vec::with_capacity(cells.len());
        for (name, value) in cells {
            let (family, column) = name
                .split_once(':')
                .ok_or_else(|| format!("cell name {:?}: FAMILY:COLUMN", truncated(name)))?;
            let cell = || cell_name(family, column.as_bytes());
            let value = match value {
                serde_json::Value::String(s) => Bytes::from(s.clone()),
                serde_json::Value::Object(o) if o.len() == 1 && o.contains_key("b64") => {
                    match &o["b64"] {
                        serde_json::Value::String(s) => Bytes::from(
                            base64_decode(s)
                                .map_err(|e| format!("cell {}: \"b64\": {e}", cell()))?,
                        ),
                        _ => {
                            return Err(format!(
                                "cell {}: \"b64\" must be a base64 string",
                                cell()
                            ));
                        }
                    }
                }
                _ => {
                    return Err(format!(
                        r#"cell {}: a value is a string (stored as its UTF-8 bytes) or {{"b64": "BASE64"}}"#,
                        cell()
                    ));
                }
            };
            mutations.push(pb::Mutation {
                kind: Some(pb::mutation::Kind::SetCell(pb::mutation::SetCell {
                    family: family.to_owned(),
                    column: Bytes::from(column.to_owned()),
                    value,
                })),
            });
        }
        self.finish(pb::RowMutation {
            table: self.table.to_string(),
            row_key: key,
            mutations,
            event_time_ms,
        })
    }

    /// One protobuf record: a `pangea.v1.RowMutation` whose table is empty (the
    /// load's table) or the load's table.
    fn protobuf(&self, bytes: &[u8]) -> Result<RowMutation, String> {
        let mut p = pb::RowMutation::decode(bytes)
            .map_err(|e| format!("cannot decode pangea.v1.RowMutation: {e}"))?;
        if p.table.is_empty() {
            p.table = self.table.to_string();
        } else if *p.table != *self.table {
            return Err(format!(
                "table {:?}, but this load writes table {:?} (leave the field empty or use --table)",
                truncated(&p.table),
                &*self.table
            ));
        }
        self.finish(p)
    }
}

fn truncated(s: &str) -> String {
    const SHOWN_CHARS_MAX: usize = 64;
    if s.chars().count() <= SHOWN_CHARS_MAX {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(SHOWN_CHARS_MAX).collect::<String>())
    }
}

/// A cell's name as messages show it: text as is, other bytes in hex.
fn cell_name(family: &str, column: &[u8]) -> String {
    let column = match std::str::from_utf8(column) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_owned(),
        _ => format!(
            "0x{}",
            column
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ),
    };
    format!("{:?}", truncated(&format!("{family}:{column}")))
}

/// Standard base64 (RFC 4648 §4) or its URL-safe alphabet (§5), padding optional.
fn base64_decode(s: &str) -> Result<Vec<u8>, String> {
    use base64::engine::general_purpose::{STANDARD_PAD_INDIFFERENT, URL_SAFE_PAD_INDIFFERENT};
    let url_safe = s.bytes().any(|b| b == b'-' || b == b'_');
    let engine = if url_safe {
        URL_SAFE_PAD_INDIFFERENT
    } else {
        STANDARD_PAD_INDIFFERENT
    };
    engine.decode(s).map_err(|e| e.to_string())
}

/// The reader thread: reads records in order, checks them, and sends them on.
struct Reader {
    checker: Checker,
    skip: u64,
    tx: mpsc::Sender<Parsed>,
    counters: Arc<Counters>,
}

impl Reader {
    /// False when the loader has stopped listening.
    fn send(&self, p: Parsed) -> bool {
        self.tx.blocking_send(p).is_ok()
    }

    fn fatal(&self, loc: Loc, why: String) {
        self.counters.records.fetch_max(loc.n(), Ordering::Relaxed);
        let _ = self.send(Parsed::Bad {
            loc,
            why,
            fatal: true,
        });
    }

    /// Hands record `n` (read up to `offset`) on unless it is skipped: what
    /// `parsed` makes of it. False when the loader has stopped listening.
    fn hand_on(&self, n: u64, offset: u64, parsed: impl FnOnce() -> Parsed) -> bool {
        self.skipped(n, offset) || self.send(parsed())
    }

    /// Counts a record read; true when it is skipped.
    fn skipped(&self, n: u64, offset: u64) -> bool {
        self.counters.records.store(n, Ordering::Relaxed);
        self.counters.input_bytes.store(offset, Ordering::Relaxed);
        if n <= self.skip {
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    fn ndjson(&self, mut r: Box<dyn BufRead + Send>) {
        let (mut n, mut offset) = (0u64, 0u64);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let got = match (&mut r)
                .take(LINE_BYTES_MAX as u64 + 1)
                .read_until(b'\n', &mut buf)
            {
                Ok(got) => got,
                Err(e) => return self.fatal(Loc::Line(n + 1), format!("cannot read: {e}")),
            };
            if got == 0 {
                return;
            }
            n += 1;
            offset += got as u64;
            let loc = Loc::Line(n);
            if buf.len() > LINE_BYTES_MAX && buf.last() != Some(&b'\n') {
                match r.skip_until(b'\n') {
                    Ok(rest) => offset += rest as u64,
                    Err(e) => return self.fatal(loc, format!("cannot read: {e}")),
                }
                let why = format!("line is longer than the limit of {LINE_BYTES_MAX} bytes");
                if !self.hand_on(n, offset, || Parsed::bad(loc, why)) {
                    return;
                }
                continue;
            }
            let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                // Blank lines count as lines, and hold no row.
                self.skipped(n, offset);
                continue;
            }
            if !self.hand_on(n, offset, || Parsed::of(loc, self.checker.ndjson(line))) {
                return;
            }
        }
    }

    fn protobuf(&self, mut r: Box<dyn BufRead + Send>) {
        let limit = self.checker.limits.row_mutation_bytes_max;
        let (mut n, mut offset) = (0u64, 0u64);
        let mut buf = Vec::new();
        loop {
            let loc = Loc::Record { n: n + 1, offset };
            let (len, prefix_bytes) = match read_length_prefix(&mut r) {
                Ok(None) => return,
                Ok(Some(v)) => v,
                Err(why) => return self.fatal(loc, why),
            };
            n += 1;
            offset += prefix_bytes;
            if len > limit as u64 {
                // Skip it whole: the next record starts after it.
                let skipped = match std::io::copy(&mut (&mut r).take(len), &mut std::io::sink()) {
                    Ok(s) => s,
                    Err(e) => return self.fatal(loc, format!("cannot read: {e}")),
                };
                offset += skipped;
                if skipped < len {
                    return self.fatal(
                        loc,
                        format!(
                            "truncated: the length prefix says {len} bytes, the input ends \
                             after {skipped}"
                        ),
                    );
                }
                let why =
                    format!("record is {len} bytes, over the row-mutation limit of {limit} bytes");
                if !self.hand_on(n, offset, || Parsed::bad(loc, why)) {
                    return;
                }
                continue;
            }
            buf.clear();
            let got = match (&mut r).take(len).read_to_end(&mut buf) {
                Ok(got) => got as u64,
                Err(e) => return self.fatal(loc, format!("cannot read: {e}")),
            };
            offset += got;
            if got < len {
                return self.fatal(
                    loc,
                    format!(
                        "truncated: the length prefix says {len} bytes, the input ends after \
                         {got}"
                    ),
                );
            }
            if !self.hand_on(n, offset, || Parsed::of(loc, self.checker.protobuf(&buf))) {
                return;
            }
        }
    }
}

/// A record's varint length prefix: `None` at a clean end of input, else the value
/// and how many bytes it took. The bytes up to the one without the continuation
/// bit are read here; prost decodes them.
fn read_length_prefix(r: &mut dyn BufRead) -> Result<Option<(u64, u64)>, String> {
    let mut prefix = [0u8; 10];
    let mut len = 0;
    loop {
        let mut b = [0u8; 1];
        match r.read(&mut b) {
            Ok(0) if len == 0 => return Ok(None),
            Ok(0) => return Err("truncated length prefix at the end of the input".into()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read: {e}")),
        }
        prefix[len] = b[0];
        len += 1;
        if b[0] & 0x80 == 0 {
            break;
        }
        if len == prefix.len() {
            return Err("length prefix longer than 10 bytes".into());
        }
    }
    let value = pangea_proto::prost::encoding::decode_varint(&mut &prefix[..len])
        .map_err(|_| "length prefix overflows 64 bits".to_owned())?;
    Ok(Some((value, len as u64)))
}

/// Per-row write latency (retries included) over the load.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub count: u64,
    /// Writes that failed.
    pub errors: u64,
    pub ops_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// What a load did (`pangea load --json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub input: String,
    pub format: &'static str,
    pub table: String,
    /// The client's region (filled in by the caller).
    pub region: String,
    pub dry_run: bool,
    /// Write requests in flight.
    pub concurrency: usize,
    /// Most rows per write request.
    pub batch_rows: usize,
    /// Rows written (checked, in a dry run).
    pub rows: u64,
    /// Their row keys, column qualifiers and values, in bytes.
    pub bytes: u64,
    pub elapsed_s: f64,
    pub rows_per_s: f64,
    pub mb_per_s: f64,
    pub write_latency: Latency,
    /// Records read from the input, skipped ones included.
    pub records: u64,
    pub skipped: u64,
    pub rejected: u64,
    pub failed: u64,
    pub retries: u64,
    /// Rows per replica that took the write (the nearest one the row's policy allows).
    pub written_at: BTreeMap<String, u64>,
    /// The record the load stopped at, if it stopped.
    pub stopped_at: Option<u64>,
    /// The machine the load ran on (filled in by the caller).
    pub machine: String,
    #[serde(skip)]
    stop: Option<Stop>,
    /// The earliest record whose write failed.
    #[serde(skip)]
    first_failed: Option<u64>,
}

impl Report {
    /// `Ok` when every record was written; else why not and how to resume.
    pub fn verdict(&self) -> Result<(), String> {
        let verb = if self.dry_run { "checked" } else { "written" };
        if let Some(s) = &self.stop {
            let n = s.loc.n();
            let at = s.loc.show(&self.input);
            // Every record before the earliest failed write (or the bad record) has
            // been written.
            let done_before = self.first_failed.map_or(n, |f| f.min(n));
            let mut msg = if s.write {
                format!("write failed {at}: {}\n", s.why)
            } else {
                format!("bad record {at}: {}\n", s.why)
            };
            msg += &format!(
                "stopped: {} rows {verb}; every record before record {done_before} is {verb}",
                self.rows
            );
            if s.write || self.first_failed.is_some() {
                msg += " (some after it may be too: writing them again is harmless)";
            } else {
                msg += ", nothing after it";
            }
            msg += "\n";
            if s.fatal {
                msg += &format!(
                    "the input cannot be read past this point; repair it, then resume with \
                     --skip {}",
                    done_before - 1
                );
            } else if s.write {
                msg += &format!("resume with --skip {}", done_before - 1);
            } else {
                msg += &format!(
                    "fix the record and resume with --skip {}, leave it out with --skip {n} \
                     (if it is the only bad one), or load with --keep-going to report and \
                     skip every bad record",
                    done_before - 1
                );
            }
            return Err(msg);
        }
        if self.rejected > 0 || self.failed > 0 {
            return Err(format!(
                "{} records rejected, {} writes failed (listed above); the other {} rows are \
                 {verb}",
                self.rejected, self.failed, self.rows
            ));
        }
        Ok(())
    }

    /// The human summary `pangea load` prints.
    pub fn summary(&self) -> String {
        let verb = if self.dry_run { "checked" } else { "loaded" };
        let mut s = format!(
            "{verb} {} rows ({:.1} MB) into {} from {} in {:.1} s: {:.0} rows/s, {:.2} MB/s\n",
            self.rows,
            self.bytes as f64 / MB,
            self.table,
            self.region,
            self.elapsed_s,
            self.rows_per_s,
            self.mb_per_s
        );
        if !self.dry_run {
            let l = &self.write_latency;
            s += &format!(
                "  write latency  p50 {:.2} ms  p99 {:.2} ms  p999 {:.2} ms  max {:.2} ms  \
                 (concurrency {}, up to {} rows a request)\n",
                l.p50_ms, l.p99_ms, l.p999_ms, l.max_ms, self.concurrency, self.batch_rows
            );
            let at: Vec<String> = self
                .written_at
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            s += &format!("  written at     {}\n", at.join(", "));
        }
        s += &format!(
            "  records {}  skipped {}  rejected {}  failed {}  retries {}{}",
            self.records,
            self.skipped,
            self.rejected,
            self.failed,
            self.retries,
            match self.stopped_at {
                Some(n) => format!("  stopped at record {n}"),
                None => String::new(),
            }
        );
        s
    }
}

/// Why the load stopped early.
#[derive(Debug, Clone)]
struct Stop {
    loc: Loc,
    why: String,
    /// A write failed (not a bad record).
    write: bool,
    fatal: bool,
}

/// The table's schema from the placement file, checked up front; `None` when the
/// placement file declares no tables at all (then the replicas check).
pub fn schema_for(d: &Deployment, table: &str) -> Result<Option<Schema>, String> {
    if table.starts_with('_') {
        return Err(format!(
            "table {table:?} is a system table; bulk loads write user tables"
        ));
    }
    let schema = &d.placement.schema;
    if schema.tables.is_empty() {
        return Ok(None);
    }
    if schema.table(table).is_none() {
        let known: Vec<&str> = schema.user_tables().map(|t| &**t).collect();
        return Err(format!(
            "table {table:?} is not in the cluster's placement file (tables: {})",
            known.join(", ")
        ));
    }
    Ok(Some(schema.clone()))
}

/// Reads, checks and writes every record of `input` (named `input_name` in
/// messages) into `opts.table` with `client`, or only checks them when `client` is
/// `None` (a dry run). `schema`: [`schema_for`]. Progress is in `counters` as it
/// goes; each problem a `keep_going` load goes past (and each write failure it
/// reports besides the one it stops at) goes to `on_problem`. The reader runs on
/// its own thread, detached: a load that stops early stops listening to it, and it
/// ends at its next record (or with the process, if it is blocked on stdin).
pub async fn load(
    client: Option<&Client>,
    schema: Option<Schema>,
    input: Box<dyn BufRead + Send>,
    input_name: &str,
    opts: &Options,
    counters: Arc<Counters>,
    on_problem: &mut (dyn FnMut(&str) + Send),
) -> Report {
    let concurrency = opts.concurrency.max(1);
    let batch_rows = opts.batch_rows.clamp(1, crate::batch::BATCH_ROWS_MAX);
    // Room for two batches ahead of the writes.
    let (tx, mut rx) = mpsc::channel((concurrency * 2).max(batch_rows * 2));
    let reader = Reader {
        checker: Checker {
            table: opts.table.as_str().into(),
            limits: opts.limits,
            schema,
        },
        skip: opts.skip,
        tx,
        counters: counters.clone(),
    };
    let format = opts.format;
    let spawned = std::thread::Builder::new()
        .name("pangea-load-reader".into())
        .spawn(move || match format {
            Format::Ndjson => reader.ndjson(input),
            Format::Protobuf => reader.protobuf(input),
        });
    let started = Instant::now();
    let mut loader = Loader {
        input: input_name.to_owned(),
        keep_going: opts.keep_going,
        counters: counters.clone(),
        latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds are valid"),
        written_at: BTreeMap::new(),
        retries: 0,
        shown: 0,
        stop: None,
        first_failed: None,
        on_problem,
    };
    if let Err(e) = spawned {
        loader.bad(
            Loc::Line(1),
            format!("cannot start the reader thread: {e}"),
            true,
        );
    }
    let mut w = Writer {
        client,
        opts,
        concurrency,
        batch: Batch::default(),
        inflight: JoinSet::new(),
        busy: HashSet::new(),
    };
    while loader.stop.is_none() {
        // Wait for input only with nothing gathered: else send what is gathered.
        let item = if w.batch.rows.is_empty() {
            rx.recv().await
        } else {
            match rx.try_recv() {
                Ok(item) => Some(item),
                Err(mpsc::error::TryRecvError::Empty) => {
                    w.flush(&mut loader).await;
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            }
        };
        let Some(item) = item else { break };
        match item {
            Parsed::Bad { loc, why, fatal } => {
                // The rows before it are written.
                w.flush(&mut loader).await;
                loader.bad(loc, why, fatal);
            }
            Parsed::Row { loc, mutation } => {
                let payload = mutation.payload_bytes() as u64;
                if client.is_none() {
                    counters.rows.fetch_add(1, Ordering::Relaxed);
                    counters.bytes.fetch_add(payload, Ordering::Relaxed);
                    continue;
                }
                let key = mutation.row_key().clone();
                if w.batch.keys.contains(&key) {
                    w.flush(&mut loader).await;
                }
                while w.busy.contains(&key) {
                    if !w.one_done(&mut loader).await {
                        break;
                    }
                }
                let batch = &mut w.batch;
                batch.bytes += payload as usize;
                batch.keys.insert(key);
                batch.rows.push((loc, mutation));
                if batch.rows.len() >= batch_rows || batch.bytes >= crate::batch::BATCH_BYTES_MAX {
                    w.flush(&mut loader).await;
                }
            }
        }
    }
    if loader.stop.is_none() {
        w.flush(&mut loader).await;
    }
    drop(rx);
    while w.one_done(&mut loader).await {}
    let elapsed = started.elapsed();
    let c = &counters;
    let rows = c.rows.load(Ordering::Relaxed);
    let bytes = c.bytes.load(Ordering::Relaxed);
    let secs = elapsed.as_secs_f64().max(1e-9);
    let failed = c.failed.load(Ordering::Relaxed);
    let h = &loader.latency;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Report {
        input: input_name.to_owned(),
        format: format.name(),
        table: opts.table.clone(),
        region: String::new(),
        dry_run: client.is_none(),
        concurrency,
        batch_rows,
        rows,
        bytes,
        elapsed_s: elapsed.as_secs_f64(),
        rows_per_s: rows as f64 / secs,
        mb_per_s: bytes as f64 / MB / secs,
        write_latency: Latency {
            count: h.len(),
            errors: failed,
            ops_per_s: h.len() as f64 / secs,
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: h.max() as f64 / 1e3,
        },
        records: c.records.load(Ordering::Relaxed),
        skipped: c.skipped.load(Ordering::Relaxed),
        rejected: c.rejected.load(Ordering::Relaxed),
        failed,
        retries: loader.retries,
        written_at: loader.written_at,
        stopped_at: loader.stop.as_ref().map(|s| s.loc.n()),
        machine: String::new(),
        stop: loader.stop,
        first_failed: loader.first_failed,
    }
}

/// Rows gathered for one write request, in input order, no key twice.
#[derive(Default)]
struct Batch {
    rows: Vec<(Loc, RowMutation)>,
    keys: HashSet<Bytes>,
    bytes: usize,
}

/// The load's writes: the batch being gathered, the requests out, and the keys
/// they write.
struct Writer<'a> {
    client: Option<&'a Client>,
    opts: &'a Options,
    concurrency: usize,
    batch: Batch,
    inflight: JoinSet<Vec<Done>>,
    /// Keys in flight: a key repeated in the input is written in input order, one
    /// write at a time (never twice in one batch, never in two batches at once).
    busy: HashSet<Bytes>,
}

impl Writer<'_> {
    /// Sends the rows gathered (once fewer than `concurrency` requests are in
    /// flight) and starts a new batch; drops them unwritten if the load stopped.
    async fn flush(&mut self, loader: &mut Loader<'_>) {
        let Batch { rows, keys, .. } = std::mem::take(&mut self.batch);
        let Some(client) = self.client else { return };
        if rows.is_empty() {
            return;
        }
        while self.inflight.len() >= self.concurrency {
            if !self.one_done(loader).await {
                break;
            }
        }
        if loader.stop.is_some() {
            return;
        }
        self.busy.extend(keys);
        let (client, write, retries) = (client.clone(), self.opts.write.clone(), self.opts.retries);
        self.inflight
            .spawn(async move { write_batch(client, rows, write, retries).await });
    }

    /// Waits for one request in flight to end; `false` when none was.
    async fn one_done(&mut self, loader: &mut Loader<'_>) -> bool {
        match self.inflight.join_next().await {
            Some(done) => {
                loader.done(done, &mut self.busy);
                true
            }
            None => false,
        }
    }
}

/// Writes rows in one batch (one row alone), then rows that failed for a passing
/// reason alone, with [`write_row`]'s retries.
async fn write_batch(
    client: Client,
    rows: Vec<(Loc, RowMutation)>,
    opts: WriteOptions,
    retries: u32,
) -> Vec<Done> {
    let started = Instant::now();
    let done = |loc: Loc, m: &RowMutation, result| Done {
        loc,
        key: m.row_key().clone(),
        payload: m.payload_bytes() as u64,
        result,
    };
    if let [(loc, m)] = &rows[..] {
        return vec![done(
            *loc,
            m,
            write_row(client, m.clone(), opts, retries).await,
        )];
    }
    let results = client
        .mutate_rows(rows.iter().map(|(_, m)| m.clone()).collect(), &opts)
        .await;
    // Rows that failed for a passing reason are written again alone, together
    // (a batch holds each key once).
    let (client, opts) = (&client, &opts);
    let rows = rows
        .into_iter()
        .zip(results)
        .map(|((loc, m), result)| async move {
            let result = match result {
                Ok(r) => Ok(Written {
                    latency: r.latency,
                    replica: r.replica.to_string(),
                    retries: 0,
                }),
                Err(e) if retryable(&e, opts) && retries > 0 => {
                    tokio::time::sleep(RETRY_BACKOFF).await;
                    write_row(client.clone(), m.clone(), opts.clone(), retries - 1)
                        .await
                        .map(|w| Written {
                            latency: started.elapsed(),
                            retries: w.retries + 1,
                            ..w
                        })
                }
                Err(e) => Err(e),
            };
            done(loc, &m, result)
        });
    futures_util::future::join_all(rows).await
}

/// One row written (or not).
struct Done {
    loc: Loc,
    key: Bytes,
    payload: u64,
    result: Result<Written, crate::Error>,
}

struct Written {
    latency: Duration,
    replica: String,
    retries: u32,
}

async fn write_row(
    client: Client,
    m: RowMutation,
    opts: WriteOptions,
    retries: u32,
) -> Result<Written, crate::Error> {
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        match client.mutate(m.clone(), &opts).await {
            Ok(r) => {
                return Ok(Written {
                    latency: started.elapsed(),
                    replica: r.replica.to_string(),
                    retries: attempt,
                });
            }
            Err(e) if retryable(&e, &opts) && attempt < retries => {
                let backoff = RETRY_BACKOFF.saturating_mul(1 << attempt.min(8));
                tokio::time::sleep(backoff.min(RETRY_BACKOFF_MAX)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether a row write that failed is tried again: for a passing reason, or with
/// an unknown outcome when the load says writing a row twice is harmless (it is
/// by default: a load carries sets and deletes only, never increments, and a
/// resumed load writes rows again too).
fn retryable(e: &crate::Error, opts: &WriteOptions) -> bool {
    e.is_retryable() || (opts.resend_if_unknown && matches!(e, crate::Error::Ambiguous { .. }))
}

/// The loader's bookkeeping of outcomes.
struct Loader<'a> {
    input: String,
    keep_going: bool,
    counters: Arc<Counters>,
    latency: Histogram<u64>,
    written_at: BTreeMap<String, u64>,
    retries: u64,
    /// Problems shown so far.
    shown: u64,
    stop: Option<Stop>,
    /// The earliest record whose write failed.
    first_failed: Option<u64>,
    on_problem: &'a mut (dyn FnMut(&str) + Send),
}

impl Loader<'_> {
    fn report_problem(&mut self, msg: String) {
        self.shown += 1;
        if !self.keep_going || self.shown <= PROBLEMS_SHOWN_MAX {
            (self.on_problem)(&msg);
        } else if self.shown == PROBLEMS_SHOWN_MAX + 1 {
            (self.on_problem)("(more problems are counted in the report, not shown)");
        }
    }

    fn bad(&mut self, loc: Loc, why: String, fatal: bool) {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        if self.keep_going && !fatal {
            self.report_problem(format!("rejected {}: {why}", loc.show(&self.input)));
        } else {
            self.stop = Some(Stop {
                loc,
                why,
                write: false,
                fatal,
            });
        }
    }

    fn done(&mut self, d: Result<Vec<Done>, tokio::task::JoinError>, busy: &mut HashSet<Bytes>) {
        // A write task panicked: nothing to say which rows it wrote.
        let Ok(d) = d else {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            (self.on_problem)("a write task failed; its rows may not be written");
            return;
        };
        for d in d {
            self.done_row(d, busy);
        }
    }

    fn done_row(&mut self, d: Done, busy: &mut HashSet<Bytes>) {
        busy.remove(&d.key);
        match d.result {
            Ok(w) => {
                self.counters.rows.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes.fetch_add(d.payload, Ordering::Relaxed);
                let _ = self.latency.record((w.latency.as_micros() as u64).max(1));
                *self.written_at.entry(w.replica).or_default() += 1;
                self.retries += u64::from(w.retries);
            }
            Err(e) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                let n = d.loc.n();
                self.first_failed = Some(self.first_failed.map_or(n, |f| f.min(n)));
                if self.keep_going {
                    self.report_problem(format!("write failed {}: {e}", d.loc.show(&self.input)));
                } else if self.stop.as_ref().is_none_or(|s| s.write && n < s.loc.n()) {
                    if let Some(s) = &self.stop {
                        // A later record failed first: it is reported too.
                        let msg = format!("write failed {}: {}", s.loc.show(&self.input), s.why);
                        (self.on_problem)(&msg);
                    }
                    self.stop = Some(Stop {
                        loc: d.loc,
                        why: e.to_string(),
                        write: true,
                        fatal: false,
                    });
                } else {
                    let msg = format!("write failed {}: {e}", d.loc.show(&self.input));
                    (self.on_problem)(&msg);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mutation;

    fn checker() -> Checker {
        Checker {
            table: "ad_profiles".into(),
            limits: Limits::default(),
            schema: None,
        }
    }

    #[test]
    fn base64_decodes_padded_unpadded_and_url_safe() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("__8=").unwrap(), [0xff, 0xff]);
        assert_eq!(base64_decode("//8").unwrap(), [0xff, 0xff]);
        assert!(base64_decode("aGVsb*8=").unwrap_err().contains("offset 5"));
        assert!(base64_decode("a").is_err());
        assert!(base64_decode("aGVsbG8===").is_err());
    }

    #[test]
    fn ndjson_rows_and_their_errors() {
        let c = checker();
        let m = c
            .ndjson(
                br#"{"key": "us/1", "cells": {"profile:p": "hi", "events:a:b": {"b64": "AAE="}}}"#,
            )
            .unwrap();
        assert_eq!(&m.row_key()[..], b"us/1");
        assert_eq!(m.mutations().len(), 2);
        assert!(m.mutations().contains(&Mutation::SetCell {
            family: "events".into(),
            column: Bytes::from_static(b"a:b"),
            value: Bytes::from_static(&[0, 1]),
        }));
        let err = |line: &str| c.ndjson(line.as_bytes()).unwrap_err();
        assert!(err(r#"{"key": "k", "cells": {"profile:p": 1}}"#).contains("\"profile:p\""));
        assert!(err(r#"{"key": "k", "cells": {}}"#).contains("empty"));
        assert!(err(r#"{"key": "k", "cells": {"nocolon": "x"}}"#).contains("FAMILY:COLUMN"));
        assert!(err(r#"{"key": "k", "cels": {}}"#).contains("unknown field"));
        // An event time rides along; it must be a whole number of ms.
        let m = c
            .ndjson(br#"{"key": "k", "cells": {"events:c": "x"}, "event_time_ms": 1700000000000}"#)
            .unwrap();
        assert_eq!(m.event_time_ms(), Some(1_700_000_000_000));
        assert!(
            err(r#"{"key": "k", "cells": {"events:c": "x"}, "event_time_ms": "yesterday"}"#)
                .contains("whole number of ms")
        );
        assert!(
            err(r#"{"key": "k", "cells": {"profile:p": "x"}"#).contains("invalid JSON at column")
        );
        assert!(err(r#"{"cells": {"profile:p": "x"}}"#).contains("no \"key\""));
        let big = format!(
            r#"{{"key": "k", "cells": {{"profile:p": "{}"}}}}"#,
            "x".repeat(Limits::default().value_bytes_max + 1)
        );
        let e = err(&big);
        assert!(
            e.contains(&format!("{} bytes", Limits::default().value_bytes_max + 1)),
            "{e}"
        );
        assert!(
            e.contains(&format!(
                "limit of {} bytes",
                Limits::default().value_bytes_max
            )),
            "{e}"
        );
    }

    #[test]
    fn length_prefixes_and_protobuf_records() {
        let mut r: &[u8] = &[0xac, 0x02, 0x05];
        assert_eq!(read_length_prefix(&mut r).unwrap(), Some((300, 2)));
        assert_eq!(read_length_prefix(&mut r).unwrap(), Some((5, 1)));
        assert_eq!(read_length_prefix(&mut r).unwrap(), None);
        let mut r: &[u8] = &[0x80];
        assert!(read_length_prefix(&mut r).is_err());
        let mut r: &[u8] = &[0xff; 11];
        assert!(read_length_prefix(&mut r).unwrap_err().contains("10 bytes"));
        let p = pb::RowMutation {
            event_time_ms: None,
            table: String::new(),
            row_key: Bytes::from_static(b"k"),
            mutations: vec![pb::Mutation {
                kind: Some(pb::mutation::Kind::DeleteFromRow(
                    pb::mutation::DeleteFromRow {},
                )),
            }],
        };
        let m = checker().protobuf(&p.encode_to_vec()).unwrap();
        assert_eq!(&**m.table(), "ad_profiles");
        let other = pb::RowMutation {
            table: "campaigns".into(),
            ..p
        };
        assert!(
            checker()
                .protobuf(&other.encode_to_vec())
                .unwrap_err()
                .contains("campaigns")
        );
        assert!(checker().protobuf(b"\xff\xff").is_err());
        // Increments are not loaded: a resumed load may write a record twice.
        let counting = pb::RowMutation {
            event_time_ms: None,
            table: String::new(),
            row_key: Bytes::from_static(b"k"),
            mutations: vec![pb::Mutation {
                kind: Some(pb::mutation::Kind::Increment(pb::mutation::Increment {
                    family: "impressions".into(),
                    column: Bytes::from_static(b"camp-1"),
                    delta: 1,
                })),
            }],
        };
        let e = checker().protobuf(&counting.encode_to_vec()).unwrap_err();
        assert!(
            e.contains("impressions:camp-1") && e.contains("count twice"),
            "{e}"
        );
    }

    /// A dry run reads and checks every record, and stops at the first bad one
    /// with the resume hint; `keep_going` counts it and goes on.
    #[tokio::test]
    async fn a_dry_run_stops_at_a_bad_record_or_goes_past_it() {
        let input = "{\"key\": \"a\", \"cells\": {\"profile:p\": \"1\"}}\n\
                     {\"key\": \"b\"}\n\
                     {\"key\": \"c\", \"cells\": {\"profile:p\": \"3\"}}\n";
        let run = |keep_going: bool| async move {
            let mut opts = Options::new("ad_profiles", Format::Ndjson);
            opts.keep_going = keep_going;
            let mut problems = Vec::new();
            let report = load(
                None,
                None,
                Box::new(std::io::Cursor::new(input.as_bytes().to_vec())),
                "rows.ndjson",
                &opts,
                Arc::new(Counters::default()),
                &mut |p| problems.push(p.to_owned()),
            )
            .await;
            (report, problems)
        };
        let (r, problems) = run(false).await;
        assert_eq!((r.rows, r.rejected, r.stopped_at), (1, 1, Some(2)));
        assert!(problems.is_empty());
        let v = r.verdict().unwrap_err();
        assert!(v.contains("bad record rows.ndjson:2"), "{v}");
        assert!(v.contains("--skip 1"), "{v}");
        let (r, problems) = run(true).await;
        assert_eq!((r.rows, r.rejected, r.stopped_at), (2, 1, None));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("rejected rows.ndjson:2"));
        assert!(r.verdict().unwrap_err().contains("1 records rejected"));
    }
}
