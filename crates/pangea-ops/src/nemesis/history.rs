//! The history a nemesis run records: one JSON object per line, in the order things
//! happened — the run's settings, every fault (start and end), every client operation
//! with its outcome, the heal, each replica's final state and audit, convergence.
//! `pangea cluster check-history FILE` reads it back and runs the checkers
//! (`check.rs`) on it alone, so a history can be kept, shared and re-checked.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The first line: what the run was asked to do.
    Start {
        /// Wall-clock start, ms since the Unix epoch (every `*_us` is relative to it).
        unix_ms: u64,
        cluster: String,
        seed: u64,
        faults: Vec<String>,
        workloads: Vec<String>,
        duration_ms: u64,
    },
    /// A fault began or ended.
    Fault {
        at_us: u64,
        fault: String,
        phase: Phase,
        /// Replicas or regions it acts on.
        targets: Vec<String>,
        detail: String,
    },
    /// One client operation.
    Op(Op),
    /// A change-stream consumer (workload `changes`) has its cursor: every write
    /// begun after the last consumer's start must reach some consumer (C9).
    ChangesFrom { region: String, at_us: u64 },
    /// Changes a consumer read, in order: each one's name (scope, origin, sequence).
    Changes {
        region: String,
        at_us: u64,
        names: Vec<(String, String, u64)>,
    },
    /// A consumer could not go on from its cursor (expired at every replica).
    ChangesLost {
        region: String,
        at_us: u64,
        error: String,
    },
    /// A backup the `backup` workload took (`pangea_ops::backup::create`).
    Backup {
        id: u64,
        region: String,
        start_us: u64,
        end_us: u64,
        ok: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Times a replica failed mid-way and its scopes went to another.
        failovers: u64,
        /// Its cut, (scope, origin, sequence); empty if it failed.
        cut: Vec<(String, String, u64)>,
        /// What it holds for certain: the cut of its exact scopes, the start of
        /// the others (a table without a change stream has no tail).
        #[serde(default)]
        held: Vec<(String, String, u64)>,
    },
    /// What a backup holds under the run's keys as of its cut (read after the heal).
    BackupRows { id: u64, rows: Vec<Cell> },
    /// Every fault lifted (processes resumed or restarted, links and clocks healed);
    /// the workloads stop here.
    Heal { at_us: u64 },
    /// What one replica holds under `prefix` after the heal (read from it alone).
    Final {
        replica: String,
        prefix: String,
        rows: Vec<Cell>,
    },
    /// One replica's residency audit and content digests after convergence.
    Audit {
        replica: String,
        region: String,
        rows_disallowed: u64,
        scopes: Vec<ScopeDigest>,
    },
    /// Whether (and when) every replica's digests agreed after the heal.
    Converged {
        ok: bool,
        after_heal_ms: u64,
        detail: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Start,
    End,
}

/// Whether an operation took effect: `Ok` it did (acknowledged / answered), `Fail`
/// it certainly did not, `Info` unknown (a write that timed out may still apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Fail,
    Info,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Write,
    Read,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Unique within the history.
    pub id: u64,
    pub workload: String,
    /// The client's region.
    pub region: String,
    pub kind: Kind,
    pub key: String,
    /// Written, or read (`None`: the row was absent).
    pub value: Option<String>,
    /// `eventual` or `watermark` (reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
    /// The write's token (writes) or the token read at (watermark reads), hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The version (HLC timestamp, origin) of what a read returned, or of a write
    /// (from its token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<Version>,
    /// The replica that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    pub start_us: u64,
    pub end_us: u64,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Op {
    /// An operation that started at `start_us`, so far without a result: outcome
    /// `Ok` until the caller says otherwise, ending when it started.
    pub fn begun(
        id: u64,
        workload: &str,
        region: &str,
        kind: Kind,
        key: &str,
        start_us: u64,
    ) -> Op {
        Op {
            id,
            workload: workload.into(),
            region: region.into(),
            kind,
            key: key.into(),
            value: None,
            consistency: None,
            token: None,
            version: None,
            replica: None,
            start_us,
            end_us: start_us,
            outcome: Outcome::Ok,
            error: None,
        }
    }
}

/// A cell's version in merge order: the later timestamp wins, ties by origin.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Version {
    pub ts: u64,
    pub origin: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    pub key: String,
    pub value: String,
    pub version: Version,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeDigest {
    pub scope: String,
    pub rows: u64,
    /// 128-bit digest, hex.
    pub digest: String,
}

/// Appends events to a file as they happen (so a crash of the nemesis itself keeps
/// what was recorded) and keeps them for the checkers.
pub struct Recorder {
    started: Instant,
    inner: Mutex<Inner>,
    /// Where the run's progress lines go (the `pangea` command prints them).
    say: Say,
}

/// Receives a run's progress lines, one at a time.
pub type Say = Box<dyn Fn(&str) + Send + Sync>;

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Inner {
    out: std::io::BufWriter<std::fs::File>,
    events: Vec<Event>,
    next_id: u64,
    error: Option<String>,
}

impl Recorder {
    /// Records into the file at `path`; progress lines go to `say`.
    pub fn create(path: &Path, say: Say) -> Result<Recorder> {
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the history file {}", path.display()))?;
        Ok(Recorder {
            started: Instant::now(),
            inner: Mutex::new(Inner {
                out: std::io::BufWriter::new(file),
                events: Vec::new(),
                next_id: 0,
                error: None,
            }),
            say,
        })
    }

    /// A progress line, stamped with the run's time.
    pub fn say(&self, line: &str) {
        (self.say)(&format!("[{:>7.1}s] {line}", self.now_us() as f64 / 1e6));
    }

    /// Microseconds since the recorder was created.
    pub fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// A fresh operation id.
    pub fn next_id(&self) -> u64 {
        let mut inner = self.lock();
        inner.next_id += 1;
        inner.next_id
    }

    pub fn record(&self, event: Event) {
        let mut inner = self.lock();
        let line = serde_json::to_string(&event).expect("history events serialize");
        if let Err(e) = writeln!(inner.out, "{line}")
            && inner.error.is_none()
        {
            inner.error = Some(e.to_string());
        }
        inner.events.push(event);
    }

    /// Flushes the file and returns every event recorded.
    pub fn finish(&self) -> Result<Vec<Event>> {
        let mut inner = self.lock();
        if let Some(e) = inner.error.take() {
            anyhow::bail!("writing the history: {e}");
        }
        inner.out.flush().context("writing the history")?;
        Ok(inner.events.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Reads a history file; a malformed line is an error naming its line number.
pub fn load(path: &Path) -> Result<Vec<Event>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening the history file {}", path.display()))?;
    let mut events = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}: reading line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line)
            .with_context(|| format!("{}: line {}", path.display(), i + 1))?;
        events.push(event);
    }
    Ok(events)
}

/// Bytes as lower-case hex (keys and tokens in the history file).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// [`hex`] read back (`None`: not hex).
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
