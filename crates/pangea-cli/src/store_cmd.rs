//! `pangea store`: offline inspection of a replica's data directory, like the
//! `ldb`/`sst_dump` tools of LSM stores.

use crate::output::{parse_key, show_bytes, show_value};
use anyhow::{Context, Result};
use clap::Subcommand;
use pangea_core::{ReadFilter, Storage};
use pangea_store::{Store, StoreOptions};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub(crate) enum StoreCommand {
    /// Rows and bytes per table, watermarks per scope and origin, log ranges.
    Inspect {
        #[arg(long)]
        data_dir: PathBuf,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Print one row: every version of every cell.
    Get {
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long)]
        table: String,
        /// Row key: text, or 0x followed by hex.
        row: String,
        #[arg(long)]
        json: bool,
    },
}

pub(crate) fn run(cmd: StoreCommand) -> Result<()> {
    match cmd {
        StoreCommand::Inspect { data_dir, json } => inspect(&open(&data_dir)?, json),
        StoreCommand::Get {
            data_dir,
            table,
            row,
            json,
        } => get(&open(&data_dir)?, &table, &parse_key(&row)?, json),
    }
}

fn open(dir: &std::path::Path) -> Result<Store> {
    anyhow::ensure!(
        dir.is_dir(),
        "data directory {} does not exist",
        dir.display()
    );
    // Offline tools never fsync on their own; the default options only matter for writes.
    Store::open(dir, StoreOptions::default()).context("is the replica still running? stop it first")
}

#[derive(Debug, Serialize)]
struct Inspection {
    data_dir: String,
    disk_bytes: u64,
    tables: Vec<TableLine>,
    streams: Vec<StreamLine>,
}

#[derive(Debug, Serialize)]
struct TableLine {
    table: String,
    rows: u64,
    key_bytes: u64,
    value_bytes: u64,
}

#[derive(Debug, Serialize)]
struct StreamLine {
    scope: String,
    origin: String,
    watermark_sequence: u64,
    watermark_timestamp: String,
    log_first: Option<u64>,
    log_last: Option<u64>,
}

fn inspect(store: &Store, json: bool) -> Result<()> {
    let tables = store
        .table_stats()?
        .into_iter()
        .map(|t| TableLine {
            table: t.table.to_string(),
            rows: t.rows,
            key_bytes: t.key_bytes,
            value_bytes: t.value_bytes,
        })
        .collect();
    let streams = store
        .stream_stats()?
        .into_iter()
        .map(|s| StreamLine {
            scope: s.scope.to_string(),
            origin: s.origin.to_string(),
            watermark_sequence: s.watermark.map_or(0, |w| w.sequence),
            watermark_timestamp: s
                .watermark
                .map_or_else(|| "-".into(), |w| w.timestamp.to_string()),
            log_first: s.log.map(|l| l.0),
            log_last: s.log.map(|l| l.1),
        })
        .collect();
    let report = Inspection {
        data_dir: store.path().display().to_string(),
        disk_bytes: store.disk_bytes()?,
        tables,
        streams,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "store {} ({} bytes on disk)",
        report.data_dir, report.disk_bytes
    );
    println!(
        "\n{:<24} {:>12} {:>14} {:>14}",
        "TABLE", "ROWS", "KEY BYTES", "VALUE BYTES"
    );
    for t in &report.tables {
        println!(
            "{:<24} {:>12} {:>14} {:>14}",
            t.table, t.rows, t.key_bytes, t.value_bytes
        );
    }
    println!(
        "\n{:<16} {:<20} {:>12} {:<20} {:>20}",
        "SCOPE", "ORIGIN", "WATERMARK", "AT (ms.logical)", "LOG RANGE"
    );
    for s in &report.streams {
        let log = match (s.log_first, s.log_last) {
            (Some(a), Some(b)) => format!("{a}..={b}"),
            _ => "(empty)".into(),
        };
        println!(
            "{:<16} {:<20} {:>12} {:<20} {:>20}",
            s.scope, s.origin, s.watermark_sequence, s.watermark_timestamp, log
        );
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct CellLine {
    family: String,
    column: String,
    timestamp: String,
    origin: String,
    value: String,
    value_bytes: usize,
}

fn get(store: &Store, table: &str, key: &[u8], json: bool) -> Result<()> {
    let row = store.get_row(table, key)?;
    let key_bytes = bytes::Bytes::copy_from_slice(key);
    let visible = row
        .as_ref()
        .and_then(|r| r.read(&key_bytes, &ReadFilter::everything(), None, 0));
    let Some(visible) = visible else {
        anyhow::bail!(
            "table {table:?} has no row {:?} in {}",
            show_bytes(key),
            store.path().display()
        );
    };
    let cells: Vec<CellLine> = visible
        .families
        .iter()
        .flat_map(|f| {
            f.cells.iter().map(|c| CellLine {
                family: f.name.clone(),
                column: show_bytes(&c.column),
                timestamp: pangea_core::Timestamp::from_u64(c.timestamp).to_string(),
                origin: c.origin.clone(),
                value: if json {
                    show_bytes(&c.value)
                } else {
                    show_value(&c.value)
                },
                value_bytes: c.value.len(),
            })
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&cells)?);
        return Ok(());
    }
    println!("{table} / {}", show_bytes(key));
    for c in cells {
        println!(
            "  {}:{} @ {} by {} = {}",
            c.family, c.column, c.timestamp, c.origin, c.value
        );
    }
    Ok(())
}
