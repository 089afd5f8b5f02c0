//! `pangea backup create|restore|verify|show`: backups of a running cluster and
//! point-in-time restores (`pangea_ops::backup`; docs/operations.md, "Back up
//! and restore" and "Recover from a bad batch job").

use crate::data_cmd::{Connect, runtime};
use crate::output::parse_key;
use anyhow::{Context, Result};
use bytes::Bytes;
use clap::{Args, Subcommand};
use pangea_ops::backup::{self, CreateOptions, Manifest, Mode, RestoreOptions};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub(crate) enum BackupCommand {
    /// Back up every table (or --tables) of a running cluster into a new
    /// directory: each scope from one replica of it, while it serves; with
    /// --incremental-from, only the changes since that backup.
    Create(CreateArgs),
    /// Write a backup's rows into a cluster, as of its cut or of --as-of T
    /// (the cluster's change log supplies what came after the backup).
    Restore(RestoreArgs),
    /// Check every file of a backup against its manifest's checksums.
    Verify {
        /// The backup directory.
        dir: PathBuf,
    },
    /// A backup's manifest: kind, cut, scopes and where their files may be stored.
    Show {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

/// How the command reaches the cluster.
#[derive(Debug, Args)]
pub(crate) struct Reach {
    /// The cluster file (`pangea cluster up` writes DIR/cluster.toml).
    #[arg(long)]
    cluster: PathBuf,
    /// The region this command runs in (replicas are read nearest first).
    #[arg(long)]
    region: String,
    /// The app profile whose permissions the backup reads (and a restore
    /// writes) with: it must be allowed every table and policy backed up.
    #[arg(long, default_value = "frontend")]
    app_profile: String,
    /// The certificate to act with, as KIND/NAME (default:
    /// loader/loader-<app profile>, which `pangea cluster up` issues; a merge
    /// restore needs a loader).
    #[arg(long, value_name = "KIND/NAME")]
    credential: Option<String>,
    /// Deadline of each call to a replica, in ms.
    #[arg(long, default_value_t = 10_000)]
    deadline_ms: u64,
}

impl Reach {
    async fn client(&self) -> Result<pangea_client::Client> {
        let connect = Connect {
            cluster: self.cluster.clone(),
            region: self.region.clone(),
            app_profile: self.app_profile.clone(),
            deadline_ms: Some(self.deadline_ms),
            table: String::new(),
            json: false,
            credential: Some(
                self.credential
                    .clone()
                    .unwrap_or_else(|| format!("loader/loader-{}", self.app_profile)),
            ),
        };
        connect.client().await
    }
}

#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    #[command(flatten)]
    reach: Reach,
    /// A new (or empty) directory to write the backup into.
    #[arg(long)]
    to: PathBuf,
    /// Only the changes since this backup's cut (a full backup or an
    /// incremental one); every table must have a change stream whose
    /// retention reaches back to it.
    #[arg(long)]
    incremental_from: Option<PathBuf>,
    /// Only these tables (comma-separated; default: every table).
    #[arg(long, value_delimiter = ',')]
    tables: Vec<String>,
    /// Only scopes of these placement policies (comma-separated; default:
    /// every policy): back up a restricted policy where it may be stored.
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Print the manifest as JSON at the end.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    #[command(flatten)]
    reach: Reach,
    /// The backup to restore (the last of a chain: its parents are found
    /// through its manifest). Give it again for the backups of other
    /// policies (a restricted policy's backup is made in its own region).
    #[arg(long, required = true)]
    from: Vec<PathBuf>,
    /// Restore the rows as of this time: Unix ms, or a duration ago (`90s`,
    /// `10m`, `2h`). Default: the backup's cut. After the cut, the changes in
    /// between come from the cluster's change log.
    #[arg(long)]
    as_of: Option<String>,
    /// Only this table.
    #[arg(long)]
    table: Option<String>,
    /// Only rows whose key starts with this (text, or 0x followed by hex).
    #[arg(long, default_value = "")]
    prefix: String,
    /// `merge`: rows merged with their versions, newer versions in the cluster
    /// win (a new or emptied cluster, a lost table). `replace`: rows written
    /// now as they were, and rows made since deleted (undo a bad batch job).
    #[arg(long, default_value = "merge")]
    mode: String,
    /// Rows per batch write.
    #[arg(long, default_value_t = 100)]
    batch_rows: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(c: BackupCommand) -> Result<()> {
    match c {
        BackupCommand::Create(a) => create(a),
        BackupCommand::Restore(a) => restore(a),
        BackupCommand::Verify { dir } => {
            let m = backup::verify(&dir)?;
            let (records, bytes) = m.totals();
            println!(
                "{}: backup {} ({:?}): {} files, {records} records, {bytes} bytes: every checksum matches",
                dir.display(),
                m.id,
                m.kind,
                m.scopes.iter().map(|s| s.files.len()).sum::<usize>()
            );
            Ok(())
        }
        BackupCommand::Show { dir, json } => {
            let m = Manifest::load(&dir)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&m)?);
            } else {
                print!("{}", show(&m));
            }
            Ok(())
        }
    }
}

fn create(a: CreateArgs) -> Result<()> {
    runtime()?.block_on(async {
        let client = a.reach.client().await?;
        let o = CreateOptions {
            to: a.to.clone(),
            incremental_from: a.incremental_from.clone(),
            tables: a.tables.clone(),
            policies: a.policies.clone(),
            deadline: Duration::from_millis(a.reach.deadline_ms),
        };
        let m = backup::create(&client, &o, &mut |line| eprintln!("{line}")).await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&m)?);
        } else {
            print!("{}", show(&m));
        }
        Ok(())
    })
}

fn restore(a: RestoreArgs) -> Result<()> {
    let mode = match a.mode.as_str() {
        "merge" => Mode::Merge,
        "replace" => Mode::Replace,
        other => anyhow::bail!("--mode {other:?}: merge or replace"),
    };
    let as_of_ms = a
        .as_of
        .as_deref()
        .map(|t| crate::filter_args::time_ms(t).with_context(|| format!("--as-of {t}")))
        .transpose()?;
    runtime()?.block_on(async {
        let client = a.reach.client().await?;
        for from in &a.from {
            let o = RestoreOptions {
                from: from.clone(),
                as_of_ms,
                table: a.table.clone(),
                prefix: Bytes::from(parse_key(&a.prefix)?),
                mode,
                deadline: Duration::from_millis(a.reach.deadline_ms),
                batch_rows: a.batch_rows.clamp(1, pangea_client::BATCH_ROWS_MAX),
            };
            let r = backup::restore(&client, &o, &mut |line| eprintln!("{line}")).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "restored {} rows and deleted {} in {:.1} s ({} changes from backups, {} from \
                 the log; {} rows failed)",
                    r.rows_written,
                    r.rows_deleted,
                    r.seconds,
                    r.changes_from_backups,
                    r.changes_from_log,
                    r.rows_failed
                );
            }
            anyhow::ensure!(
                r.rows_failed == 0,
                "{} rows were not written (see above): run the restore again",
                r.rows_failed
            );
        }
        Ok(())
    })
}

fn show(m: &Manifest) -> String {
    let (records, bytes) = m.totals();
    let mut out = format!(
        "backup {} ({:?}{}), tables {}: {records} records, {bytes} bytes in {:.1} s; cut at {} ms\n",
        m.id,
        m.kind,
        m.parent
            .as_ref()
            .map_or(String::new(), |p| format!(" after {}", p.id)),
        m.tables.join(", "),
        (m.finished_ms.saturating_sub(m.started_ms)) as f64 / 1e3,
        m.cut_ms(),
    );
    for s in &m.skipped {
        out.push_str(&format!("  skipped {s}\n"));
    }
    for s in &m.scopes {
        let cut: Vec<String> = s
            .end
            .iter()
            .map(|p| format!("{}#{}", p.origin, p.sequence))
            .collect();
        out.push_str(&format!(
            "  {} from {}: store only in {}; cut {}{}\n",
            s.scope,
            s.replica,
            s.regions.join(", "),
            cut.join(" "),
            match &s.note {
                Some(n) => format!(" (not exact: {n})"),
                None => String::new(),
            }
        ));
    }
    out
}
