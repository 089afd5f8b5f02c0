//! A full disk, handled (issue 31; docs/operations.md, "A full disk"): a replica
//! whose data directory is on a small tmpfs refuses writes with an error naming the
//! full disk and itself, keeps serving reads, names storage in `/health`, takes
//! writes again within seconds once space returns — without a restart — and loses
//! no acknowledged write across the cycle. Both ways a disk fills: slowly enough
//! for the reserve to catch it, and all at once past it (the store fails and is
//! reopened).
//!
//! Mounting a tmpfs needs root (CI runs as root); the test fails, saying so, if it
//! cannot.

mod common;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use common::{eventually, http_get, pangea_env, repo_file};
use pangea_client::{Client, ClientConfig, ReadOptions, RowMutation, WriteOptions};
use pangea_topology::cluster::ClusterFile;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmpfs of `mib` MiB on a temporary directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u64) -> Result<Tmpfs> {
        let dir = tempfile::tempdir()?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "cannot mount a tmpfs (this test needs root): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A single-replica cluster in `dir`, stopped on drop.
struct Solo {
    dir: PathBuf,
    file: ClusterFile,
}

impl Solo {
    fn up(dir: &Path, env: &[(&str, &str)]) -> Result<Solo> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let topology = repo_file("topology/single-replica.toml");
        let placement = repo_file("topology/single-replica.placement.toml");
        let out = pangea_env(
            &[
                "cluster",
                "up",
                topology.to_str().context("path")?,
                "--placement",
                placement.to_str().context("path")?,
                "--data-dir",
                dir.to_str().context("path")?,
            ],
            &env,
            common::UP_TIME_MAX,
        )?;
        ensure!(
            out.status.success(),
            "cluster up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = ClusterFile::load(&dir.join("cluster.toml")).map_err(anyhow::Error::msg)?;
        Ok(Solo {
            dir: dir.to_owned(),
            file,
        })
    }

    fn admin(&self) -> &str {
        &self.file.replicas[0].admin
    }
}

impl Drop for Solo {
    fn drop(&mut self) {
        let _ = common::pangea(
            &[
                "cluster",
                "down",
                "--data-dir",
                self.dir.to_str().unwrap_or_default(),
                "--grace-ms",
                "2000",
            ],
            Duration::from_secs(30),
        );
    }
}

/// A row of `bytes` incompressible bytes (a serialized profile is not a run of one
/// byte). With a repeated byte, fjall's journal compressed ~1,000 writes of 64 KiB
/// into the last MiB of the disk, the memtable reached its 64 MiB and its flush to
/// uncompressed tables filled the 64 MiB tmpfs again, at the restart.
fn set(key: &str, bytes: usize) -> Result<RowMutation> {
    use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};
    let seed = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
    let mut rng = pangea_core::rng::Rng::new(seed);
    let value: Vec<u8> = (0..bytes.div_ceil(8))
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .take(bytes)
        .collect();
    common::profile_set(key, value)
}

/// Fills the file system of `dir` with a file of zeros until `leave_mib` MiB are
/// left (0: until it refuses more).
fn fill(dir: &Path, leave_mib: u64) -> Result<PathBuf> {
    use std::io::Write as _;
    let free = || -> Result<u64> {
        let s = nix::sys::statvfs::statvfs(dir)?;
        Ok(s.blocks_available().saturating_mul(s.fragment_size()))
    };
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path)?;
    let chunk = vec![0u8; 1 << 20];
    while free()? > (leave_mib + 1) << 20 && f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    Ok(path)
}

/// Writes until one is refused; returns the acknowledged keys and the refusal.
/// The writes of the group commit that met the full disk come back ambiguous
/// (what reached the journal before it may survive): each must say why, and none
/// is counted as acknowledged.
async fn write_until_refused(
    c: &Client,
    prefix: &str,
    limit: usize,
) -> Result<(Vec<String>, String)> {
    let opts = WriteOptions {
        deadline: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let mut acked = Vec::new();
    for i in 0..limit {
        let key = format!("{prefix}{i:05}");
        match c.mutate(set(&key, 64 << 10)?, &opts).await {
            Ok(_) => acked.push(key),
            Err(e @ pangea_client::Error::Ambiguous { .. }) => {
                let e = e.to_string();
                ensure!(
                    e.contains("the store failed while making it durable"),
                    "{e}"
                );
                eprintln!("{key}: {e}");
            }
            Err(e) => return Ok((acked, e.to_string())),
        }
    }
    bail!("{limit} writes of 64 KiB all acknowledged on a full disk")
}

/// Free space under `dir` and its largest files, for a failure's context.
fn space_report(dir: &Path) -> String {
    fn walk(dir: &Path, files: &mut Vec<(u64, PathBuf)>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => walk(&entry.path(), files),
                Ok(m) => files.push((m.len(), entry.path())),
                Err(_) => {}
            }
        }
    }
    let free = nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()) >> 10)
        .unwrap_or_default();
    let mut files = Vec::new();
    walk(dir, &mut files);
    let total: u64 = files.iter().map(|f| f.0).sum();
    files.sort_unstable_by(|a, b| b.cmp(a));
    let largest: Vec<String> = files
        .iter()
        .take(8)
        .map(|(len, p)| format!("  {} KiB {}", len >> 10, p.display()))
        .collect();
    format!(
        "{free} KiB free; {} files, {} KiB in all; largest:\n{}",
        files.len(),
        total >> 10,
        largest.join("\n")
    )
}

async fn read_all(c: &Client, keys: &[String]) -> Result<()> {
    let opts = ReadOptions::default().with_deadline(Duration::from_secs(2));
    for k in keys {
        let r = c
            .get("ad_profiles", Bytes::from(k.clone()), &opts)
            .await
            .with_context(|| k.clone())?;
        ensure!(r.value.is_some(), "acknowledged {k} is gone");
    }
    Ok(())
}

/// One disk-full cycle on a fresh single-replica cluster: `reserve_mib` 0 lets the
/// disk fill under the store (it fails and is reopened), 8 makes the replica stop
/// before.
async fn cycle(reserve_mib: &str, leave_mib: u64, want: &str) -> Result<()> {
    let fs = Tmpfs::mount(64)?;
    let solo = Solo::up(
        &fs.path().join("c"),
        &[("PANGEA_DISK_RESERVE_MIB", reserve_mib)],
    )?;
    let c = Client::connect(ClientConfig::from_cluster(
        &solo.file, "local-1", "frontend",
    )?)
    .await?;
    let opts = WriteOptions::default();
    let mut acked = Vec::new();
    for i in 0..20 {
        let key = format!("before/{i:03}");
        c.mutate(set(&key, 1 << 10)?, &opts).await?;
        acked.push(key);
    }
    // The disk fills (another process's file), then writes are refused.
    let filler = fill(fs.path(), leave_mib)?;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (more, refusal) = write_until_refused(&c, "during/", 2_000).await?;
    acked.extend(more);
    eprintln!("reserve {reserve_mib} MiB: refused with: {refusal}");
    ensure!(
        refusal.contains(want) && refusal.contains("solo"),
        "{refusal}"
    );
    // Reads go on; /health names storage.
    read_all(&c, &acked).await?;
    let (code, health) = http_get(solo.admin(), "/health")?;
    ensure!(
        code == 503 && health.contains("\"storage\":\"") && !health.contains("\"storage\":\"ok\""),
        "{code} {health}"
    );
    // Space returns: writes resume within seconds, no restart.
    std::fs::remove_file(&filler)?;
    eprintln!(
        "reserve {reserve_mib} MiB: space returned; {}",
        space_report(fs.path())
    );
    let freed = Instant::now();
    let resumed = eventually(
        Duration::from_secs(20),
        Duration::from_millis(200),
        "writes resume",
        || async {
            Ok(
                c.mutate(set("after/00000", 1 << 10)?, &WriteOptions::default())
                    .await
                    .ok(),
            )
        },
    )
    .await
    .with_context(|| {
        let log = solo.dir.join("logs").join("solo.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        format!("replica log, newest first:\n{}", tail.join("\n"))
    })?;
    drop(resumed);
    eprintln!(
        "reserve {reserve_mib} MiB: writes resumed {:?} after the space returned",
        freed.elapsed()
    );
    acked.push("after/00000".into());
    let (code, health) = http_get(solo.admin(), "/health")?;
    ensure!(code == 200, "{code} {health}");
    read_all(&c, &acked).await?;
    // And every acknowledged write survives a restart of the replica.
    drop(c);
    let pid = solo.file.replicas[0].pid.context("pid")?;
    drop(solo);
    ensure!(!common::alive(pid), "the replica did not stop");
    eprintln!(
        "reserve {reserve_mib} MiB: stopped; {}",
        space_report(fs.path())
    );
    let solo = Solo::up(
        &fs.path().join("c"),
        &[("PANGEA_DISK_RESERVE_MIB", reserve_mib)],
    )
    .with_context(|| format!("restarting: {}", space_report(fs.path())))?;
    let c = Client::connect(ClientConfig::from_cluster(
        &solo.file, "local-1", "frontend",
    )?)
    .await?;
    read_all(&c, &acked).await?;
    eprintln!(
        "reserve {reserve_mib} MiB: {} acknowledged writes all there after a restart; {}",
        acked.len(),
        space_report(fs.path())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_keeps_reads_and_recovers_without_a_restart() -> Result<()> {
    // The reserve catches the disk before the store does.
    cycle("8", 4, "disk full: ").await?;
    // No reserve: the store fails on the full disk and is reopened once space returns.
    cycle("0", 0, "disk full (").await?;
    Ok(())
}
