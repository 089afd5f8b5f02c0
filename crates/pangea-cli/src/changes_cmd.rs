//! `pangea changes`: a table's change stream, printed as it comes, with the
//! cursor to resume from after each page (docs/operations.md, "Feed the batch
//! pipeline").

use crate::data_cmd::{Connect, runtime};
use crate::output::{hex, parse_key, show_bytes, show_value};
use anyhow::Result;
use bytes::Bytes;
use clap::Args;
use pangea_client::{Change, ChangesFrom, Mutation, ReadOptions};
use std::io::Write as _;
use std::time::Duration;

#[derive(Debug, Args)]
pub(crate) struct ChangesArgs {
    #[command(flatten)]
    connect: Connect,
    /// Only rows whose key starts with this (text, or 0x followed by hex).
    #[arg(long, default_value = "")]
    prefix: String,
    /// Where to start: `now`, `earliest` (the oldest change the replica keeps)
    /// or a cursor this command printed (0x...).
    #[arg(long, default_value = "now")]
    from: String,
    /// Keep reading as changes come (until interrupted); without it, stop once
    /// caught up.
    #[arg(long)]
    follow: bool,
    /// How long to wait before asking again once caught up, with --follow.
    #[arg(long, default_value_t = 200)]
    poll_ms: u64,
    /// Most changes per page (the replica caps it at 1,000).
    #[arg(long, default_value_t = 1_000)]
    limit: u32,
    /// Read as this registered reader: the replica keeps its log after the
    /// cursor given past the tables' retention while the reader comes back
    /// within a week. Needs a loader certificate (`--credential
    /// loader/loader-PROFILE`).
    #[arg(long)]
    reader: Option<String>,
    /// Read from this replica only (no failover): a registered reader keeps to
    /// the replica that holds its log.
    #[arg(long)]
    replica: Option<String>,
}

pub(crate) fn run(a: ChangesArgs) -> Result<()> {
    runtime()?.block_on(async {
        let client = a.connect.client().await?;
        let opts = ReadOptions::default().with_deadline(a.connect.deadline());
        let prefix = Bytes::from(parse_key(&a.prefix)?);
        let mut from = match a.from.as_str() {
            "now" => ChangesFrom::Now,
            "earliest" => ChangesFrom::Earliest,
            c => ChangesFrom::Cursor(Bytes::from(
                parse_key(c).map_err(|e| anyhow::anyhow!("--from: {e}"))?,
            )),
        };
        let table = &a.connect.table;
        let mut out = std::io::stdout().lock();
        loop {
            let reader = a.reader.as_deref().unwrap_or("");
            // The page, and who answered.
            let (page, replica, region) = match &a.replica {
                None => {
                    let r = client
                        .read_changes_as(reader, table, prefix.clone(), &from, a.limit, &opts)
                        .await?;
                    (r.value, r.replica.to_string(), r.region)
                }
                Some(id) => {
                    let at = pangea_core::ReplicaId::new(id.as_str());
                    let page = client
                        .read_changes_at(
                            &at,
                            reader,
                            table,
                            prefix.clone(),
                            &from,
                            a.limit,
                            a.connect.deadline(),
                        )
                        .await?;
                    let region = client
                        .deployment()
                        .topology
                        .region_of(id)
                        .map_or_else(|| "?".to_owned(), |r| r.to_string());
                    (page, id.clone(), region)
                }
            };
            for c in &page.changes {
                if a.connect.json {
                    writeln!(out, "{}", change_json(c))?;
                } else {
                    writeln!(out, "{}", change_text(c))?;
                }
            }
            // The cursor after the page: a consumer that saves it once the
            // changes above are handled resumes without missing any.
            let cursor = format!("0x{}", hex(&page.cursor));
            if a.connect.json {
                writeln!(out, "{}", serde_json::json!({ "cursor": cursor }))?;
            } else {
                writeln!(
                    out,
                    "-- {} changes from {} ({}); resume with --from {cursor}",
                    page.changes.len(),
                    replica,
                    region
                )?;
            }
            out.flush()?;
            from = ChangesFrom::Cursor(page.cursor);
            if !page.more {
                if !a.follow {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(a.poll_ms)).await;
            }
        }
    })
}

/// A change as one JSON line: its name (scope, origin, sequence), time, row
/// key and mutations.
fn change_json(c: &Change) -> serde_json::Value {
    let m = &c.mutation;
    let mutations: Vec<serde_json::Value> = m.mutations().iter().map(mutation_json).collect();
    let mut v = serde_json::json!({
        "scope": c.scope.as_str(),
        "origin": c.origin.as_str(),
        "sequence": c.sequence,
        "timestamp_ms": c.timestamp.wall_ms(),
        "table": &**m.table(),
        "key": show_bytes(m.row_key()),
        "mutations": mutations,
    });
    if let Some(t) = m.event_time_ms() {
        v["event_time_ms"] = t.into();
    }
    v
}

fn mutation_json(x: &Mutation) -> serde_json::Value {
    use serde_json::json;
    match x {
        Mutation::SetCell {
            family,
            column,
            value,
        } => {
            json!({"set": {"family": &**family, "column": show_bytes(column), "value": show_bytes(value)}})
        }
        Mutation::DeleteFromColumn { family, column, .. } => {
            json!({"delete_column": {"family": &**family, "column": show_bytes(column)}})
        }
        Mutation::DeleteFromFamily { family } => json!({"delete_family": &**family}),
        Mutation::DeleteFromRow => json!({"delete_row": true}),
        Mutation::MergeRow(_) => json!({"merge_row": true}),
        Mutation::Increment {
            family,
            column,
            delta,
        } => {
            json!({"increment": {"family": &**family, "column": show_bytes(column), "delta": delta}})
        }
    }
}

fn change_text(c: &Change) -> String {
    let m = &c.mutation;
    let what: Vec<String> = m
        .mutations()
        .iter()
        .map(|x| match x {
            Mutation::SetCell {
                family,
                column,
                value,
            } => format!("{family}:{}={}", show_bytes(column), show_value(value)),
            Mutation::DeleteFromColumn { family, column, .. } => {
                format!("delete {family}:{}", show_bytes(column))
            }
            Mutation::DeleteFromFamily { family } => format!("delete {family}"),
            Mutation::DeleteFromRow => "delete row".to_owned(),
            Mutation::MergeRow(_) => "merge row".to_owned(),
            Mutation::Increment {
                family,
                column,
                delta,
            } => format!("{family}:{}+={delta}", show_bytes(column)),
        })
        .collect();
    format!(
        "{}/{}#{} {} {} {}",
        c.scope,
        c.origin,
        c.sequence,
        c.timestamp.wall_ms(),
        show_bytes(m.row_key()),
        what.join(" ")
    )
}
