//! `pangea load`: bulk-loads batch-built rows into one table (docs/bulk-load.md).
//! The load itself — reading, checking, pipelined writes, the report — is
//! `pangea_client::bulk`; this parses the arguments, shows progress and prints.

use crate::data_cmd::Connect;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use pangea_client::bulk::{self, Counters, Options};
use pangea_client::{Client, ClientConfig, WriteOptions};
use pangea_ops::bench::machine;
use pangea_topology::cluster::ClusterFile;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often the progress line is refreshed.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
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

impl From<Format> for bulk::Format {
    fn from(f: Format) -> bulk::Format {
        match f {
            Format::Ndjson => bulk::Format::Ndjson,
            Format::Protobuf => bulk::Format::Protobuf,
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
    /// Write requests in flight at once (each a batch of up to --batch-rows rows).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Most rows in one batch write (MutateRows); 1 writes each row alone.
    #[arg(long, default_value_t = 100)]
    batch_rows: usize,
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

pub(crate) fn run(a: LoadArgs) -> Result<()> {
    let format = match a.format {
        Some(f) => f.into(),
        None => bulk::Format::from_path(&a.input).map_err(anyhow::Error::msg)?,
    };
    let table = a.connect.table.clone();
    let cluster = ClusterFile::load(&a.connect.cluster).map_err(anyhow::Error::msg)?;
    let config = ClientConfig::from_cluster(&cluster, &a.connect.region, &a.connect.app_profile)?;
    let schema = bulk::schema_for(&config.deployment, &table).map_err(anyhow::Error::msg)?;
    let (input, size): (Box<dyn BufRead + Send>, Option<u64>) = if a.input == "-" {
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
    let defaults = Options::new(&table, format);
    let opts = Options {
        concurrency: a.concurrency.max(1),
        batch_rows: a.batch_rows.max(1),
        skip: a.skip,
        keep_going: a.keep_going,
        retries: a.retries,
        write: WriteOptions {
            deadline: Some(a.connect.deadline()),
            ..defaults.write.clone()
        },
        ..defaults
    };
    let counters = Arc::new(Counters::default());
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
        let mut report = bulk::load(
            client.as_ref(),
            schema,
            input,
            &input_name,
            &opts,
            counters.clone(),
            &mut |problem| progress.say(problem),
        )
        .await;
        if let Some(t) = ticker {
            t.abort();
            if progress == Progress::Terminal {
                let mut last = (started, 0, 0);
                let line = progress_line(&counters, size, &mut last);
                eprintln!("\r\x1b[K{line}");
            }
        }
        report.region = a.connect.region.clone();
        report.machine = machine();
        if a.connect.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!("{}", report.summary());
        }
        report.verdict().map_err(anyhow::Error::msg)
    })
}
