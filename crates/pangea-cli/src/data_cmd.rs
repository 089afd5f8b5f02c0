//! `pangea get | put | delete | scan | watermarks`: data commands for operators and
//! tests, through the same client library frontends use.

use crate::filter_args::{FilterArgs, RangeArgs};
use crate::output::{hex, parse_key, show_bytes, show_value};
use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Args;
use pangea_client::{
    Ack, Client, ClientConfig, Consistency, Credential, Mutation, ReadOptions, RowMutation,
    ScanOptions, Token, WriteOptions,
};
use pangea_topology::cluster::ClusterFile;
use std::path::PathBuf;
use std::time::Duration;

/// How to reach the cluster.
#[derive(Debug, Args, Clone)]
pub(crate) struct Connect {
    /// The cluster file (`pangea cluster up` writes DIR/cluster.toml).
    #[arg(long)]
    pub cluster: PathBuf,
    /// The region this command acts from (picks the nearest replicas).
    #[arg(long)]
    pub region: String,
    #[arg(long, default_value = "frontend")]
    pub app_profile: String,
    /// Per-call deadline in ms: data commands default to 2 s (frontends to 20 ms);
    /// operator commands to their call's own (placement move 10 s, audit 60 s per
    /// replica, reload 30 s, watermarks 2 s).
    #[arg(long)]
    pub deadline_ms: Option<u64>,
    #[arg(long, default_value = "ad_profiles")]
    pub table: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// The certificate to act with, as KIND/NAME from the cluster's certificate
    /// directory: client/NAME, loader/NAME or operator/NAME. Default: data commands
    /// act as client/client-<app profile>, operator commands (placement, watermarks,
    /// topology apply) as operator/operator, the ones `pangea cluster up` issues.
    #[arg(long, value_name = "KIND/NAME")]
    pub credential: Option<String>,
}

/// The operator certificate `pangea cluster up` issues, and operator commands use.
pub(crate) use pangea_ops::local::CLUSTER_OPERATOR;

impl Connect {
    /// A client acting with `--credential`, else the app profile's client
    /// certificate.
    pub(crate) async fn client(&self) -> Result<Client> {
        Ok(Client::connect(self.config()?).await?)
    }

    /// A client for operator requests: `--credential`, else the cluster's operator
    /// certificate.
    pub(crate) async fn operator_client(&self) -> Result<Client> {
        let mut config = self.config()?;
        if self.credential.is_none() {
            config = config.with_credential(Credential::Operator(CLUSTER_OPERATOR.into()));
        }
        Ok(Client::connect(config).await?)
    }

    /// The deadline of a data call: `--deadline-ms`, else 2 s.
    pub(crate) fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms.unwrap_or(2_000))
    }

    pub(crate) fn config(&self) -> Result<ClientConfig> {
        let cluster = ClusterFile::load(&self.cluster).map_err(anyhow::Error::msg)?;
        let mut config = ClientConfig::from_cluster(&cluster, &self.region, &self.app_profile)?;
        config.operator_deadline = self.deadline_ms.map(Duration::from_millis);
        Ok(match &self.credential {
            Some(c) => config.with_credential(parse_credential(c)?),
            None => config,
        })
    }
}

/// `client/NAME`, `loader/NAME` or `operator/NAME`.
pub(crate) fn parse_credential(s: &str) -> Result<Credential> {
    let (kind, name) = s
        .split_once('/')
        .with_context(|| format!("--credential {s:?}: expected KIND/NAME, e.g. operator/ops"))?;
    Ok(match kind {
        "client" => Credential::Client(name.into()),
        "loader" => Credential::Loader(name.into()),
        "operator" => Credential::Operator(name.into()),
        other => anyhow::bail!(
            "--credential {s:?}: kind {other:?} is not client, loader or operator \
             (replica certificates do not make requests)"
        ),
    })
}

#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    connect: Connect,
    /// eventual, affinity, watermark (needs --token), bounded:MS, or as-of:T
    /// (the row as of T: ms since the Unix epoch, or a duration ago).
    #[arg(long, default_value = "eventual")]
    consistency: String,
    /// A token from `pangea put` (hex), for --consistency watermark.
    #[arg(long)]
    token: Option<String>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Row key: text, or 0x followed by hex.
    row: String,
}

/// Where a write goes and when it is acknowledged.
#[derive(Debug, Args)]
pub(crate) struct WriteFlags {
    /// Write at the row's affinity replica in this region (where
    /// `--consistency affinity` reads go), not the nearest (default: the app
    /// profile's `writes` setting).
    #[arg(long)]
    affinity: bool,
    /// Acknowledge only once replicas in N other regions have durably applied
    /// the write (default: once durable where it was written).
    #[arg(long, value_name = "N", conflicts_with = "wait_all_regions")]
    wait_regions: Option<u32>,
    /// Acknowledge only once every region of the row's placement policy has
    /// applied the write.
    #[arg(long)]
    wait_all_regions: bool,
    /// Applying this write twice is harmless: when the replica asked cannot say
    /// whether it applied it, send it to the next one rather than failing
    /// (default: fail, saying the write may or may not have happened).
    #[arg(long)]
    resend_if_unknown: bool,
}

impl WriteFlags {
    fn options(&self, deadline: Duration) -> WriteOptions {
        WriteOptions {
            deadline: Some(deadline),
            // Without the flag, the app profile's `writes` setting.
            row_affinity: self.affinity.then_some(true),
            ack: match (self.wait_regions, self.wait_all_regions) {
                (_, true) => Ack::AllRegions,
                (Some(n), false) => Ack::Regions(n),
                (None, false) => Ack::Origin,
            },
            resend_if_unknown: self.resend_if_unknown,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct PutArgs {
    #[command(flatten)]
    connect: Connect,
    #[command(flatten)]
    write: WriteFlags,
    /// Write at this event time instead of the replica's clock: ms since the
    /// Unix epoch, or a duration ago (`90d`). The table must declare an
    /// `event_time` window in the placement file (docs/client.md, "Event time").
    #[arg(long, value_name = "T")]
    event_time: Option<String>,
    row: String,
    /// FAMILY:COLUMN=VALUE, one or more.
    #[arg(required = true)]
    cells: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct IncrArgs {
    #[command(flatten)]
    connect: Connect,
    #[command(flatten)]
    write: WriteFlags,
    row: String,
    /// FAMILY:COLUMN[=DELTA] (default delta 1; negative counts down), one or
    /// more, of counter families.
    #[arg(required = true, allow_hyphen_values = true)]
    counters: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    #[command(flatten)]
    connect: Connect,
    #[command(flatten)]
    write: WriteFlags,
    /// Write at this event time instead of the replica's clock: ms since the
    /// Unix epoch, or a duration ago (`90d`). The table must declare an
    /// `event_time` window in the placement file (docs/client.md, "Event time").
    #[arg(long, value_name = "T")]
    event_time: Option<String>,
    row: String,
    /// Delete only this family (default: the whole row).
    #[arg(long)]
    family: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ScanArgs {
    #[command(flatten)]
    connect: Connect,
    /// As `pangea get --consistency`: eventual, affinity, watermark (needs
    /// --token), bounded:MS, or as-of:T.
    #[arg(long, default_value = "eventual")]
    consistency: String,
    /// A token from `pangea put` (hex), for --consistency watermark.
    #[arg(long)]
    token: Option<String>,
    /// Most rows in the page (the replica caps it at 1,000).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    #[command(flatten)]
    range: RangeArgs,
    #[command(flatten)]
    filter: FilterArgs,
    /// Only a sample of the rows: a fraction in (0, 1], the same rows every run.
    #[arg(long, value_name = "FRACTION")]
    sample: Option<f64>,
    /// Keys only, no cells.
    #[arg(long)]
    keys_only: bool,
    /// Print keys that split the prefix's rows into N parts of similar row
    /// counts, for dividing batch work (from a --sample, default 0.01).
    #[arg(long, value_name = "N")]
    split: Option<usize>,
    /// Key prefix (text, or 0x followed by hex; "" for every key, with --start,
    /// --end... for a range).
    prefix: String,
}

#[derive(Debug, Args)]
pub(crate) struct WatermarksArgs {
    #[command(flatten)]
    connect: Connect,
    /// One replica (default: every replica of the cluster).
    #[arg(long)]
    replica: Option<String>,
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

pub(crate) fn parse_consistency(mode: &str, token: Option<&str>) -> Result<Consistency> {
    Ok(match mode {
        "eventual" => Consistency::Eventual,
        "affinity" => Consistency::RowAffinity,
        "watermark" => {
            let hex = token.context("--consistency watermark needs --token")?;
            let bytes = parse_key(&format!("0x{}", hex.trim_start_matches("0x")))?;
            Consistency::Watermark(
                Token::decode(&bytes).map_err(|e| anyhow::anyhow!("--token: {e}"))?,
            )
        }
        other => match (other.strip_prefix("bounded:"), other.strip_prefix("as-of:")) {
            (Some(ms), _) => Consistency::BoundedStaleness {
                max_ms: ms
                    .trim_end_matches("ms")
                    .parse()
                    .with_context(|| format!("--consistency {other}: bounded:MS"))?,
            },
            (_, Some(t)) => Consistency::AsOf {
                ms: crate::filter_args::time_ms(t)
                    .with_context(|| format!("--consistency {other}: as-of:T"))?,
            },
            _ => anyhow::bail!(
                "--consistency {other:?}: eventual, affinity, watermark, bounded:MS or as-of:T"
            ),
        },
    })
}

fn served(json: bool, r: &pangea_client::Response<impl Sized>) -> serde_json::Value {
    let _ = json;
    serde_json::json!({
        "replica": r.replica.as_str(),
        "region": r.region,
        "reason": r.reason.to_string(),
        "latency_ms": r.latency.as_secs_f64() * 1e3,
        "attempts": r.attempts,
    })
}

/// Which families of the table being read are counters (their cells print as
/// numbers).
fn counter_families(client: &Client, table: &str) -> Vec<String> {
    let d = client.deployment();
    d.placement.schema.table(table).map_or_else(Vec::new, |t| {
        t.families
            .iter()
            .filter(|(_, f)| f.is_counter())
            .map(|(name, _)| name.to_string())
            .collect()
    })
}

fn row_json(row: &pangea_client::Row, counters: &[String]) -> serde_json::Value {
    let cells: Vec<serde_json::Value> = row
        .families
        .iter()
        .flat_map(|f| {
            let counter = counters.contains(&f.name);
            f.cells.iter().map(move |c| {
                let value = if counter {
                    serde_json::json!(pangea_core::row::count_of(&c.value))
                } else {
                    serde_json::json!(show_bytes(&c.value))
                };
                serde_json::json!({
                    "family": f.name, "column": show_bytes(&c.column), "timestamp": c.timestamp,
                    "origin": c.origin, "value": value,
                })
            })
        })
        .collect();
    serde_json::json!({ "key": show_bytes(&row.key), "cells": cells })
}

fn print_row(row: &pangea_client::Row, counters: &[String]) {
    println!("{}", show_bytes(&row.key));
    for f in &row.families {
        let counter = counters.contains(&f.name);
        for c in &f.cells {
            let value = if counter {
                format!("{} (counter)", pangea_core::row::count_of(&c.value))
            } else {
                show_value(&c.value)
            };
            println!(
                "  {}:{} @ {} by {} = {value}",
                f.name,
                show_bytes(&c.column),
                pangea_core::Timestamp::from_u64(c.timestamp),
                c.origin,
            );
        }
    }
}

pub(crate) fn get(a: GetArgs) -> Result<()> {
    runtime()?.block_on(async {
        let client = a.connect.client().await?;
        let mut opts = ReadOptions::default()
            .with_consistency(parse_consistency(&a.consistency, a.token.as_deref())?)
            .with_deadline(a.connect.deadline());
        opts.filter = a.filter.read_filter()?;
        let r = client.get(&a.connect.table, Bytes::from(parse_key(&a.row)?), &opts).await?;
        let counters = counter_families(&client, &a.connect.table);
        if a.connect.json {
            let v = serde_json::json!({ "row": r.value.as_ref().map(|row| row_json(row, &counters)), "served_by": served(true, &r) });
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            match &r.value {
                Some(row) => print_row(row, &counters),
                None => println!("(no row {:?})", a.row),
            }
            println!("-- served by {} ({}), {}, {:.1} ms", r.replica, r.region, r.reason, r.latency.as_secs_f64() * 1e3);
        }
        Ok(())
    })
}

pub(crate) fn put(a: PutArgs) -> Result<()> {
    let mut muts = Vec::new();
    for cell in &a.cells {
        let (fc, value) = cell
            .split_once('=')
            .with_context(|| format!("{cell:?}: FAMILY:COLUMN=VALUE"))?;
        let (family, column) = fc
            .split_once(':')
            .with_context(|| format!("{cell:?}: FAMILY:COLUMN=VALUE"))?;
        muts.push(Mutation::SetCell {
            family: family.into(),
            column: Bytes::from(column.as_bytes().to_vec()),
            value: Bytes::from(value.as_bytes().to_vec()),
        });
    }
    write(&a.connect, &a.row, muts, &a.write, a.event_time.as_deref())
}

pub(crate) fn incr(a: IncrArgs) -> Result<()> {
    if a.write.resend_if_unknown {
        anyhow::bail!(
            "--resend-if-unknown: an increment applied twice counts twice, so it is never \
             resent when whether it was applied is unknown"
        );
    }
    let mut muts = Vec::new();
    for counter in &a.counters {
        let (fc, delta) = match counter.split_once('=') {
            Some((fc, d)) => {
                let delta = d.parse::<i64>().with_context(|| {
                    format!("{counter:?}: the delta after '=' must be a whole number (64-bit)")
                })?;
                (fc, delta)
            }
            None => (counter.as_str(), 1),
        };
        let (family, column) = fc
            .split_once(':')
            .with_context(|| format!("{counter:?}: FAMILY:COLUMN[=DELTA]"))?;
        muts.push(Mutation::Increment {
            family: family.into(),
            column: Bytes::from(column.as_bytes().to_vec()),
            delta,
        });
    }
    write(&a.connect, &a.row, muts, &a.write, None)
}

pub(crate) fn delete(a: DeleteArgs) -> Result<()> {
    let m = match &a.family {
        Some(f) => Mutation::DeleteFromFamily {
            family: f.as_str().into(),
        },
        None => Mutation::DeleteFromRow,
    };
    write(
        &a.connect,
        &a.row,
        vec![m],
        &a.write,
        a.event_time.as_deref(),
    )
}

fn write(
    c: &Connect,
    row: &str,
    muts: Vec<Mutation>,
    flags: &WriteFlags,
    event_time: Option<&str>,
) -> Result<()> {
    let event_ms = event_time
        .map(|t| crate::filter_args::time_ms(t).context("--event-time"))
        .transpose()?;
    runtime()?.block_on(async {
        let client = c.client().await?;
        let mut m = RowMutation::new(
            c.table.as_str(),
            parse_key(row)?,
            muts,
            &pangea_core::Limits::default(),
        )?;
        if let Some(ms) = event_ms {
            m = m.at_event_time(ms);
        }
        let r = client.mutate(m, &flags.options(c.deadline())).await?;
        let token = hex(&r.value.encode());
        if c.json {
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({ "token": token, "served_by": served(true, &r) })
                )?
            );
        } else {
            println!(
                "ok: written at {} ({}, {}), {:.1} ms",
                r.replica,
                r.region,
                r.reason,
                r.latency.as_secs_f64() * 1e3
            );
            println!("token {token}");
        }
        Ok(())
    })
}

pub(crate) fn scan(a: ScanArgs) -> Result<()> {
    runtime()?.block_on(async {
        let client = a.connect.client().await?;
        let mut opts = ReadOptions::default()
            .with_consistency(parse_consistency(&a.consistency, a.token.as_deref())?)
            .with_deadline(a.connect.deadline());
        opts.filter = a.filter.read_filter()?;
        let scan = ScanOptions {
            limit: a.limit,
            range: a.range.range()?,
            reverse: a.range.reverse,
            resume_after: a.range.resume_after()?,
            row_sample: a.sample.unwrap_or(0.0),
            keys_only: a.keys_only,
            ..Default::default()
        };
        let prefix = Bytes::from(parse_key(&a.prefix)?);
        if let Some(parts) = a.split {
            let fraction = a.sample.unwrap_or(0.01);
            let splits = client.split_keys(&a.connect.table, prefix, parts, fraction, &opts).await?;
            let keys: Vec<String> = splits.iter().map(|k| show_bytes(k)).collect();
            if a.connect.json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "split_keys": keys }))?);
            } else {
                for k in &keys {
                    println!("{k}");
                }
                println!("-- {} split keys: {} parts (a {fraction} sample)", keys.len(), keys.len() + 1);
            }
            return Ok(());
        }
        let r = client.scan_prefix(&a.connect.table, prefix, &scan, &opts).await?;
        let counters = counter_families(&client, &a.connect.table);
        if a.connect.json {
            let rows: Vec<_> = r.value.rows.iter().map(|row| row_json(row, &counters)).collect();
            let v = serde_json::json!({ "rows": rows, "resume_key": show_bytes(&r.value.resume_key), "served_by": served(true, &r) });
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            for row in &r.value.rows {
                print_row(row, &counters);
            }
            println!("-- {} rows, served by {} ({}), {:.1} ms", r.value.rows.len(), r.replica, r.region, r.latency.as_secs_f64() * 1e3);
            if !r.value.resume_key.is_empty() {
                println!("-- more: the next page with --resume {:?}", show_bytes(&r.value.resume_key));
            }
        }
        Ok(())
    })
}

pub(crate) fn watermarks(a: WatermarksArgs) -> Result<()> {
    runtime()?.block_on(async {
        let client = a.connect.operator_client().await?;
        let cluster = ClusterFile::load(&a.connect.cluster).map_err(anyhow::Error::msg)?;
        let ids: Vec<String> = match &a.replica {
            Some(r) => vec![r.clone()],
            None => cluster.replicas.iter().map(|r| r.id.clone()).collect(),
        };
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
        let mut all = Vec::new();
        for id in ids {
            match client.watermarks(&id.as_str().into()).await {
                Ok(scopes) => {
                    for s in scopes {
                        let lag = now_ms.saturating_sub(s.low_watermark().wall_ms());
                        let origins: serde_json::Map<String, serde_json::Value> = s
                            .iter()
                            .map(|(o, w)| (o.to_string(), serde_json::json!({"sequence": w.sequence, "lag_ms": now_ms.saturating_sub(w.timestamp.wall_ms())})))
                            .collect();
                        all.push(serde_json::json!({"replica": id, "scope": s.scope.as_str(), "low_watermark_lag_ms": lag, "origins": origins}));
                    }
                }
                Err(e) => all.push(serde_json::json!({"replica": id, "error": e.to_string()})),
            }
        }
        if a.connect.json {
            println!("{}", serde_json::to_string_pretty(&all)?);
        } else {
            println!("{:<14} {:<14} {:>16}  ORIGINS (sequence)", "REPLICA", "SCOPE", "LOW WM LAG (ms)");
            for v in &all {
                if let Some(e) = v.get("error") {
                    println!("{:<14} error: {}", v["replica"].as_str().unwrap_or(""), e.as_str().unwrap_or(""));
                    continue;
                }
                let origins: Vec<String> = v["origins"]
                    .as_object()
                    .map(|o| o.iter().map(|(k, w)| format!("{k}:{}", w["sequence"])).collect())
                    .unwrap_or_default();
                println!(
                    "{:<14} {:<14} {:>16}  {}",
                    v["replica"].as_str().unwrap_or(""),
                    v["scope"].as_str().unwrap_or(""),
                    v["low_watermark_lag_ms"],
                    origins.join(" ")
                );
            }
        }
        Ok(())
    })
}
