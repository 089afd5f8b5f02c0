//! `pangea load`: bulk-loads batch-built rows into one table, as Spotify bulk-loads
//! its profile store (docs/bulk-load.md).
//!
//! Input is NDJSON (one JSON object per line) or a stream of varint-length-prefixed
//! `pangea.v1.RowMutation` messages. A reader thread parses and checks every record
//! (format, size limits, the placement file's schema) in input order; the loader
//! writes each row once through the client library, which sends it to the nearest
//! replica its placement policy allows; replication carries it along the scope's
//! tree to every other replica of the scope. There is no multi-row write in the
//! client protocol, so single-row writes are pipelined, `--concurrency` in flight.
//!
//! Bad records: by default the load stops at the first one, before writing it (rows
//! before it are written, rows after it are not) and says how to resume
//! (`--skip N`); `--keep-going` reports each bad record, counts it and goes on.
//! Messages name a record by its position (`FILE:LINE`, or record number and byte
//! offset), never by its key or values.

use crate::bench_cmd::{Figures, figures, histogram, machine};
use crate::data_cmd::Connect;
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use pangea_client::{Client, ClientConfig, RowMutation, WriteOptions};
use pangea_core::Limits;
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::Deployment;
use pangea_topology::cluster::ClusterFile;
use pangea_topology::schema::Schema;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Longest NDJSON line: a row mutation at its limit (16 MiB) in base64, with room for
/// the JSON around it.
const LINE_BYTES_MAX: usize = 32 << 20;
/// Bad records printed in full with `--keep-going`; later ones are only counted.
const REJECTS_SHOWN_MAX: u64 = 100;
/// Progress lines, at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// First back-off of a retried write (doubles per retry, up to `RETRY_BACKOFF_MAX`).
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Bytes per MB in reports (decimal, like network and disk rates).
const MB: f64 = 1e6;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// One JSON object per line: {"key": "...", "cells": {"FAMILY:COLUMN": VALUE}}.
    #[value(alias = "jsonl")]
    Ndjson,
    /// Varint-length-prefixed `pangea.v1.RowMutation` messages.
    #[value(alias = "pb")]
    Protobuf,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Ndjson => "ndjson",
            Format::Protobuf => "protobuf",
        }
    }

    /// From the input's extension: .ndjson, .jsonl, .json; .pb, .bin, .binpb.
    fn from_path(input: &str) -> Result<Format> {
        let ext = Path::new(input)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("ndjson" | "jsonl" | "json") => Ok(Format::Ndjson),
            Some("pb" | "bin" | "binpb") => Ok(Format::Protobuf),
            _ if input == "-" => bail!("reading stdin: say --format ndjson or --format protobuf"),
            _ => bail!(
                "cannot tell the format of {input} from its extension (.ndjson/.jsonl or \
                 .pb/.bin): say --format ndjson or --format protobuf"
            ),
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    #[command(flatten)]
    connect: Connect,
    /// Input format (default: from the extension: .ndjson/.jsonl/.json are NDJSON,
    /// .pb/.bin/.binpb length-delimited protobuf).
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Row writes in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Skip the first N records (NDJSON: lines) without writing them: resumes a load
    /// that stopped.
    #[arg(long, default_value_t = 0)]
    skip: u64,
    /// Report and count bad records and failed writes, and go on (default: stop at
    /// the first, before writing it). The exit status is still 1 if any.
    #[arg(long)]
    keep_going: bool,
    /// Retries of a row write that failed for a passing reason (replica unavailable,
    /// deadline), with back-off; a rejected write (schema, policy) is not retried.
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// Show progress on stderr every second even when stderr is not a terminal (on
    /// a terminal it is always shown).
    #[arg(long)]
    progress: bool,
    /// Read and check every record (format, limits, schema) but write nothing.
    #[arg(long)]
    dry_run: bool,
    /// The input file, or `-` for stdin.
    input: String,
}

/// Where a record is in the input.
#[derive(Debug, Clone, Copy)]
enum Loc {
    /// NDJSON: the line number (1-based).
    Line(u64),
    /// Protobuf: the record number (1-based) and the byte offset of its length prefix.
    Record { n: u64, offset: u64 },
}

impl Loc {
    fn n(self) -> u64 {
        match self {
            Loc::Line(n) | Loc::Record { n, .. } => n,
        }
    }

    fn show(self, input: &str) -> String {
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
    /// (a broken length prefix, a read error), so even `--keep-going` stops.
    Bad {
        loc: Loc,
        why: String,
        fatal: bool,
    },
}

/// Counters the loader, the reader and the progress line share.
#[derive(Debug, Default)]
struct Counters {
    rows: AtomicU64,
    bytes: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    /// Records the reader has read (skipped ones included).
    records: AtomicU64,
    /// Input bytes consumed by the reader.
    input_bytes: AtomicU64,
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
                other => {
                    return Err(format!(
                        "unknown field {:?} (expected \"key\" or \"key_b64\", and \"cells\")",
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
            let value = match value {
                serde_json::Value::String(s) => Bytes::from(s.clone()),
                serde_json::Value::Object(o) if o.len() == 1 && o.contains_key("b64") => {
                    match &o["b64"] {
                        serde_json::Value::String(s) => {
                            Bytes::from(base64_decode(s).map_err(|e| {
                                format!(
                                    "cell {}: \"b64\": {e}",
                                    cell_name(family, column.as_bytes())
                                )
                            })?)
                        }
                        _ => {
                            return Err(format!(
                                "cell {}: \"b64\" must be a base64 string",
                                cell_name(family, column.as_bytes())
                            ));
                        }
                    }
                }
                _ => {
                    return Err(format!(
                        r#"cell {}: a value is a string (stored as its UTF-8 bytes) or {{"b64": "BASE64"}}"#,
                        cell_name(family, column.as_bytes())
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
        })
    }

    /// One protobuf record: a `pangea.v1.RowMutation` whose table is empty (the
    /// `--table`) or the `--table`.
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

fn cell_name(family: &str, column: &[u8]) -> String {
    format!(
        "{:?}",
        truncated(&format!("{family}:{}", crate::output::show_bytes(column)))
    )
}

/// Standard base64 (RFC 4648 §4), padding optional; the URL-safe alphabet (§5) too.
fn base64_decode(s: &str) -> Result<Vec<u8>, String> {
    let body = s.trim_end_matches('=');
    let pad = s.len() - body.len();
    if pad > 2 || (pad > 0 && !s.len().is_multiple_of(4)) {
        return Err("bad base64 padding".into());
    }
    if body.len() % 4 == 1 {
        return Err(format!(
            "base64 of {} characters cannot be complete",
            body.len()
        ));
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    let (mut acc, mut bits) = (0u32, 0u32);
    for (i, c) in body.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => {
                return Err(format!(
                    "invalid base64 character {:?} at offset {i}",
                    char::from(c)
                ));
            }
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
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

    /// Counts a record read; true when `--skip` skips it.
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
                if self.skipped(n, offset) {
                    continue;
                }
                let why = format!("line is longer than the limit of {LINE_BYTES_MAX} bytes");
                if !self.send(Parsed::Bad {
                    loc,
                    why,
                    fatal: false,
                }) {
                    return;
                }
                continue;
            }
            if self.skipped(n, offset) {
                continue;
            }
            let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue; // blank lines count as lines, and hold no row
            }
            let parsed = match self.checker.ndjson(line) {
                Ok(mutation) => Parsed::Row { loc, mutation },
                Err(why) => Parsed::Bad {
                    loc,
                    why,
                    fatal: false,
                },
            };
            if !self.send(parsed) {
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
            let (len, prefix_bytes) = match read_varint(&mut r) {
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
                if self.skipped(n, offset) {
                    continue;
                }
                let why =
                    format!("record is {len} bytes, over the row-mutation limit of {limit} bytes");
                if !self.send(Parsed::Bad {
                    loc,
                    why,
                    fatal: false,
                }) {
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
            if self.skipped(n, offset) {
                continue;
            }
            let parsed = match self.checker.protobuf(&buf) {
                Ok(mutation) => Parsed::Row { loc, mutation },
                Err(why) => Parsed::Bad {
                    loc,
                    why,
                    fatal: false,
                },
            };
            if !self.send(parsed) {
                return;
            }
        }
    }
}

/// A protobuf varint length prefix: `None` at a clean end of input, else the value
/// and how many bytes it took.
fn read_varint(r: &mut dyn BufRead) -> Result<Option<(u64, u64)>, String> {
    let mut value = 0u64;
    for i in 0..10u32 {
        let mut b = [0u8; 1];
        match r.read(&mut b) {
            Ok(0) if i == 0 => return Ok(None),
            Ok(0) => return Err("truncated length prefix at the end of the input".into()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read: {e}")),
        }
        let low = u64::from(b[0] & 0x7f);
        if i == 9 && b[0] > 1 {
            return Err("length prefix overflows 64 bits".into());
        }
        value |= low << (7 * i);
        if b[0] & 0x80 == 0 {
            return Ok(Some((value, u64::from(i) + 1)));
        }
    }
    Err("length prefix longer than 10 bytes".into())
}

/// The progress line: on a terminal rewritten in place, otherwise one line a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    Off,
    Terminal,
    Lines,
}

impl Progress {
    /// A message on stderr that must not be mixed into the progress line.
    fn say(self, msg: &str) {
        let mut err = std::io::stderr().lock();
        if self == Progress::Terminal {
            let _ = write!(err, "\r\x1b[K");
        }
        let _ = writeln!(err, "{msg}");
    }
}

fn progress_line(c: &Counters, size: Option<u64>, last: &mut (Instant, u64, u64)) -> String {
    let rows = c.rows.load(Ordering::Relaxed);
    let bytes = c.bytes.load(Ordering::Relaxed);
    let dt = last.0.elapsed().as_secs_f64().max(1e-3);
    let rate = (rows - last.1) as f64 / dt;
    let mb_rate = (bytes - last.2) as f64 / dt / MB;
    *last = (Instant::now(), rows, bytes);
    let bar = match size.filter(|s| *s > 0) {
        Some(size) => {
            const WIDTH: usize = 24;
            let frac = (c.input_bytes.load(Ordering::Relaxed) as f64 / size as f64).min(1.0);
            let done = (frac * WIDTH as f64) as usize;
            format!(
                "[{}{}] {:>3.0}%  ",
                "#".repeat(done),
                "-".repeat(WIDTH - done),
                frac * 100.0
            )
        }
        None => String::new(),
    };
    format!(
        "{bar}{rows} rows  {:.1} MB  {rate:.0} rows/s  {mb_rate:.1} MB/s  rejected {}  failed {}",
        bytes as f64 / MB,
        c.rejected.load(Ordering::Relaxed),
        c.failed.load(Ordering::Relaxed),
    )
}

/// One row written (or not).
struct Done {
    loc: Loc,
    key: Bytes,
    payload: u64,
    result: Result<Written, pangea_client::Error>,
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
) -> Result<Written, pangea_client::Error> {
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
            Err(e) if e.is_retryable() && attempt < retries => {
                let backoff = RETRY_BACKOFF.saturating_mul(1 << attempt.min(8));
                tokio::time::sleep(backoff.min(RETRY_BACKOFF_MAX)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The final report (`--json` prints it as is).
#[derive(Debug, Serialize)]
struct Report {
    input: String,
    format: &'static str,
    table: String,
    region: String,
    dry_run: bool,
    concurrency: usize,
    /// Rows written (checked, with `--dry-run`).
    rows: u64,
    /// Their row keys, column qualifiers and values, in bytes.
    bytes: u64,
    elapsed_s: f64,
    rows_per_s: f64,
    mb_per_s: f64,
    /// Per-row write latency (retries included), and failed writes as `errors`.
    write_latency: Figures,
    /// Records read from the input, skipped ones included.
    records: u64,
    skipped: u64,
    rejected: u64,
    failed: u64,
    retries: u64,
    /// Rows per replica that took the write (the nearest one the row's policy allows).
    written_at: BTreeMap<String, u64>,
    /// The record the load stopped at, if it stopped.
    stopped_at: Option<u64>,
    machine: String,
}

impl Report {
    fn print(&self) {
        let verb = if self.dry_run { "checked" } else { "loaded" };
        println!(
            "{verb} {} rows ({:.1} MB) into {} from {} in {:.1} s: {:.0} rows/s, {:.2} MB/s",
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
            println!(
                "  write latency  p50 {:.2} ms  p99 {:.2} ms  p999 {:.2} ms  max {:.2} ms  \
                 (concurrency {})",
                l.p50_ms, l.p99_ms, l.p999_ms, l.max_ms, self.concurrency
            );
            let at: Vec<String> = self
                .written_at
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            println!("  written at     {}", at.join(", "));
        }
        println!(
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
    }
}

/// Why the load stopped early.
struct Stop {
    loc: Loc,
    why: String,
    /// A write failed (not a bad record).
    write: bool,
    fatal: bool,
}

pub(crate) fn run(a: LoadArgs) -> Result<()> {
    let format = match a.format {
        Some(f) => f,
        None => Format::from_path(&a.input)?,
    };
    let table = a.connect.table.clone();
    if table.starts_with('_') {
        bail!("table {table:?} is a system table; bulk loads write user tables");
    }
    let cluster = ClusterFile::load(&a.connect.cluster).map_err(anyhow::Error::msg)?;
    let config = ClientConfig::from_cluster(&cluster, &a.connect.region, &a.connect.app_profile)?;
    let schema = schema_for(&config.deployment, &table)?;
    let (reader_input, size): (Box<dyn BufRead + Send>, Option<u64>) = if a.input == "-" {
        (
            Box::new(BufReader::with_capacity(1 << 18, std::io::stdin())),
            None,
        )
    } else {
        let f =
            std::fs::File::open(&a.input).with_context(|| format!("cannot open {}", a.input))?;
        let size = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
        (Box::new(BufReader::with_capacity(1 << 18, f)), size)
    };
    let input_name = if a.input == "-" {
        "stdin".to_owned()
    } else {
        a.input.clone()
    };
    let progress = if std::io::stderr().is_terminal() {
        Progress::Terminal
    } else if a.progress {
        Progress::Lines
    } else {
        Progress::Off
    };
    let concurrency = a.concurrency.max(1);
    let counters = Arc::new(Counters::default());
    let (tx, rx) = mpsc::channel(concurrency * 2);
    let reader = Reader {
        checker: Checker {
            table: table.as_str().into(),
            limits: Limits::default(),
            schema,
        },
        skip: a.skip,
        tx,
        counters: counters.clone(),
    };
    // Detached: when the loader stops early it stops listening, and the reader ends
    // at its next record (or with the process, if it is blocked on stdin).
    std::thread::Builder::new()
        .name("pangea-load-reader".into())
        .spawn(move || match format {
            Format::Ndjson => reader.ndjson(reader_input),
            Format::Protobuf => reader.protobuf(reader_input),
        })?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let client = if a.dry_run {
            None
        } else {
            Some(Client::connect(config).await?)
        };
        let started = Instant::now();
        let ticker = (progress != Progress::Off).then(|| {
            let c = counters.clone();
            tokio::spawn(async move {
                let mut last = (Instant::now(), 0, 0);
                let mut tick = tokio::time::interval(PROGRESS_EVERY);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let line = progress_line(&c, size, &mut last);
                    let mut err = std::io::stderr().lock();
                    let _ = match progress {
                        Progress::Terminal => write!(err, "\r\x1b[K{line}"),
                        _ => writeln!(err, "{line}"),
                    };
                    let _ = err.flush();
                }
            })
        });
        let mut loader = Loader {
            input: input_name.clone(),
            keep_going: a.keep_going,
            progress,
            counters: counters.clone(),
            latency: histogram(),
            written_at: BTreeMap::new(),
            retries: 0,
            shown: 0,
            stop: None,
            first_failed: None,
        };
        let opts = WriteOptions {
            deadline: Some(a.connect.deadline()),
            ..Default::default()
        };
        let mut rx = rx;
        let mut inflight: JoinSet<Done> = JoinSet::new();
        let mut busy: HashSet<Bytes> = HashSet::new();
        while loader.stop.is_none() {
            let Some(item) = rx.recv().await else { break };
            match item {
                Parsed::Bad { loc, why, fatal } => loader.bad(loc, why, fatal),
                Parsed::Row { loc, mutation } => {
                    let payload = mutation.payload_bytes() as u64;
                    let Some(client) = &client else {
                        counters.rows.fetch_add(1, Ordering::Relaxed);
                        counters.bytes.fetch_add(payload, Ordering::Relaxed);
                        continue;
                    };
                    let key = mutation.row_key().clone();
                    // Bounded in flight; a key repeated in the input is written in input
                    // order, one write at a time.
                    while inflight.len() >= concurrency || busy.contains(&key) {
                        match inflight.join_next().await {
                            Some(done) => loader.done(done?, &mut busy),
                            None => break,
                        }
                    }
                    if loader.stop.is_some() {
                        break;
                    }
                    busy.insert(key.clone());
                    let (client, opts, retries) = (client.clone(), opts.clone(), a.retries);
                    inflight.spawn(async move {
                        let result = write_row(client, mutation, opts, retries).await;
                        Done {
                            loc,
                            key,
                            payload,
                            result,
                        }
                    });
                }
            }
        }
        drop(rx);
        while let Some(done) = inflight.join_next().await {
            loader.done(done?, &mut busy);
        }
        let elapsed = started.elapsed();
        if let Some(t) = ticker {
            t.abort();
            if progress == Progress::Terminal {
                let mut last = (started, 0, 0);
                let line = progress_line(&counters, size, &mut last);
                eprintln!("\r\x1b[K{line}");
            }
        }
        let c = &counters;
        let rows = c.rows.load(Ordering::Relaxed);
        let bytes = c.bytes.load(Ordering::Relaxed);
        let secs = elapsed.as_secs_f64().max(1e-9);
        let failed = c.failed.load(Ordering::Relaxed);
        let report = Report {
            input: input_name.clone(),
            format: format.name(),
            table: table.clone(),
            region: a.connect.region.clone(),
            dry_run: a.dry_run,
            concurrency,
            rows,
            bytes,
            elapsed_s: elapsed.as_secs_f64(),
            rows_per_s: rows as f64 / secs,
            mb_per_s: bytes as f64 / MB / secs,
            write_latency: figures(&loader.latency, failed, elapsed),
            records: c.records.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            failed,
            retries: loader.retries,
            written_at: loader.written_at.clone(),
            stopped_at: loader.stop.as_ref().map(|s| s.loc.n()),
            machine: machine(),
        };
        if a.connect.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            report.print();
        }
        loader.verdict(&report)
    })
}

/// The table's schema from the placement file, checked up front; `None` when the
/// placement file declares no tables at all (then the replicas check).
fn schema_for(d: &Deployment, table: &str) -> Result<Option<Schema>> {
    let schema = &d.placement.schema;
    if schema.tables.is_empty() {
        return Ok(None);
    }
    if schema.table(table).is_none() {
        let known: Vec<&str> = schema
            .tables
            .keys()
            .map(|t| &**t)
            .filter(|t| !t.starts_with('_'))
            .collect();
        bail!(
            "table {table:?} is not in the cluster's placement file (tables: {})",
            known.join(", ")
        );
    }
    Ok(Some(schema.clone()))
}

/// The loader's bookkeeping of outcomes.
struct Loader {
    input: String,
    keep_going: bool,
    progress: Progress,
    counters: Arc<Counters>,
    latency: hdrhistogram::Histogram<u64>,
    written_at: BTreeMap<String, u64>,
    retries: u64,
    /// Problems printed so far.
    shown: u64,
    stop: Option<Stop>,
    /// The earliest record whose write failed.
    first_failed: Option<u64>,
}

impl Loader {
    fn report_problem(&mut self, msg: String) {
        self.shown += 1;
        if !self.keep_going || self.shown <= REJECTS_SHOWN_MAX {
            self.progress.say(&msg);
        } else if self.shown == REJECTS_SHOWN_MAX + 1 {
            self.progress
                .say("(more problems are counted in the report, not shown)");
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

    fn done(&mut self, d: Done, busy: &mut HashSet<Bytes>) {
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
                        self.progress.say(&format!(
                            "write failed {}: {}",
                            s.loc.show(&self.input),
                            s.why
                        ));
                    }
                    self.stop = Some(Stop {
                        loc: d.loc,
                        why: e.to_string(),
                        write: true,
                        fatal: false,
                    });
                } else {
                    self.progress
                        .say(&format!("write failed {}: {e}", d.loc.show(&self.input)));
                }
            }
        }
    }

    /// The exit status and, when the load did not write everything, why and how to
    /// resume.
    fn verdict(&self, r: &Report) -> Result<()> {
        let verb = if r.dry_run { "checked" } else { "written" };
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
                r.rows
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
            bail!(msg);
        }
        if r.rejected > 0 || r.failed > 0 {
            bail!(
                "{} records rejected, {} writes failed (listed above); the other {} rows are \
                 {verb}",
                r.rejected,
                r.failed,
                r.rows
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pangea_client::Mutation;

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
    fn varints_and_protobuf_records() {
        let mut r: &[u8] = &[0xac, 0x02, 0x05];
        assert_eq!(read_varint(&mut r).unwrap(), Some((300, 2)));
        assert_eq!(read_varint(&mut r).unwrap(), Some((5, 1)));
        assert_eq!(read_varint(&mut r).unwrap(), None);
        let mut r: &[u8] = &[0x80];
        assert!(read_varint(&mut r).is_err());
        let p = pb::RowMutation {
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
    }
}
