//! `pangea cluster nemesis` and `pangea cluster check-history`: Jepsen-style fault
//! injection into a running local cluster while checker workloads run through
//! `pangea-client`, a recorded history, and the checkers run on it.
//!
//! A run: start the workloads (one client per region), then until the duration is
//! up, inject one fault at a time — in rounds of every fault asked for, each round
//! in an order and on targets the seed picks — hold it for `--fault-ms`, lift it,
//! and let the cluster settle for `--calm-ms`. Then
//! heal everything, stop the workloads, wait until every replica's content digest of
//! each scope agrees (C5), read each replica's final state, audit residency, and run
//! the checkers (`check.rs`). The history file keeps all of it, one JSON object per
//! line (`history.rs`).
//!
//! Faults (docs/reliability.md#nemesis-on-live-clusters says what each does and which invariant it
//! attacks): `kill` (SIGKILL a replica, restart it on its data), `pause` (SIGSTOP,
//! SIGCONT), `partition` (cut one region from the others, both ways, through the
//! replicas' WAN-emulation layer), `loss` (30 % datagram loss between two regions),
//! `skew` (offset one replica's clock: ±300 ms within `max_offset`, or 2 s beyond it
//! either way), `restart-region` (SIGKILL every replica of a region, restart them),
//! `disk-full` (one replica's disk reads as full: writes refused there, replication
//! into it held back), `flood` (a flood of QUIC Initials at one replica, no
//! certificate needed), `new-replica` (one replica replaced by an empty one that
//! no peer can reach, then reached again: it must not serve until caught up),
//! `resize` (one replica grown by two processes with `pangea cluster resize`, the
//! mover SIGKILLed once while it waits in a step and run again to finish, then
//! drained back by one process; the fault lasts as long as the moves take).
//! The cluster must run with fault injection (`pangea cluster up --fault-injection`).

pub mod check;
pub mod history;
mod workload;

use crate::admin::Admin;
use crate::local::{self, alive, signal};
use anyhow::{Context, Result};
use history::{Event, Phase, Recorder, Say};
use nix::sys::signal::Signal;
use pangea_core::rng::Rng;
use pangea_topology::cluster::{ClusterFile, ClusterReplica};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every fault the nemesis knows, in the order `--faults` lists them by default.
pub const FAULTS: [&str; 10] = [
    "kill",
    "pause",
    "partition",
    "loss",
    "skew",
    "restart-region",
    "disk-full",
    "flood",
    "new-replica",
    "resize",
];

/// QUIC Initials a `flood` sends per second of its hold.
const FLOOD_PER_SECOND: u64 = 4_000;

/// How long a restarted replica may take to report healthy.
const RESTART_HEALTHY_MAX: Duration = Duration::from_secs(60);

/// What a nemesis run does (`pangea cluster nemesis` flags).
#[derive(Debug, Clone)]
pub struct Options {
    /// The cluster file (`pangea cluster up --fault-injection` writes DIR/cluster.toml).
    pub cluster: PathBuf,
    /// Faults to inject ([`FAULTS`]).
    pub faults: Vec<String>,
    /// Workloads (`workload::WORKLOADS`: register, ryw, set).
    pub workloads: Vec<String>,
    /// How long to inject faults.
    pub duration: Duration,
    pub seed: u64,
    /// Where to write the history (default: nemesis-SEED.jsonl next to the cluster file).
    pub history: Option<PathBuf>,
    /// How long each fault lasts, and the quiet time between faults.
    pub fault: Duration,
    pub calm: Duration,
    /// Longest wait for replicas to converge after the heal (C5).
    pub converge_limit: Duration,
    /// The `pangea` binary restarted replicas run.
    pub binary: PathBuf,
}

/// The workloads a run may ask for.
pub use workload::WORKLOADS;

/// Runs the nemesis on a running local cluster; progress lines go to `say`.
/// Returns the checkers' report and where the history was written.
pub fn run(o: &Options, say: Say) -> Result<(check::Report, PathBuf)> {
    for f in &o.faults {
        anyhow::ensure!(
            FAULTS.contains(&f.as_str()),
            "--faults: unknown fault {f:?} (known: {})",
            FAULTS.join(", ")
        );
    }
    anyhow::ensure!(!o.faults.is_empty(), "--faults: name at least one fault");
    anyhow::ensure!(
        !o.workloads.is_empty(),
        "--workloads: name at least one workload"
    );
    for w in &o.workloads {
        anyhow::ensure!(
            WORKLOADS.contains(&w.as_str()),
            "--workloads: unknown workload {w:?} (known: {})",
            WORKLOADS.join(", ")
        );
    }
    let duration = o.duration;
    let cluster = ClusterFile::load(&o.cluster).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        cluster.fault_injection,
        "cluster {} runs without fault injection: start it with `pangea cluster up \
         --fault-injection`",
        o.cluster.display()
    );
    anyhow::ensure!(
        !cluster.replicas.is_empty(),
        "cluster file {} lists no replicas",
        o.cluster.display()
    );
    let deployment = local::load(&cluster.topology, cluster.placement.as_deref())?;
    let history_path = o.history.clone().unwrap_or_else(|| {
        o.cluster
            .with_file_name(format!("nemesis-{}.jsonl", o.seed))
    });
    let rec = Arc::new(Recorder::create(&history_path, say)?);
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // The run's key namespace: seed and start time.
    let tag = format!("s{}-{unix_ms:x}", o.seed);
    rec.record(Event::Start {
        unix_ms,
        cluster: cluster.name.clone(),
        seed: o.seed,
        faults: o.faults.clone(),
        workloads: o.workloads.clone(),
        duration_ms: duration.as_millis() as u64,
    });
    rec.say(&format!(
        "nemesis on {:?}: faults {} for {duration:?}, workloads {}, seed {}; history {}",
        cluster.name,
        o.faults.join(","),
        o.workloads.join(","),
        o.seed,
        history_path.display()
    ));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let run = runtime.block_on(async {
        let load = workload::start(
            &cluster,
            &deployment,
            &o.workloads,
            rec.clone(),
            o.seed,
            &tag,
        )
        .await?;
        // Faults on a blocking thread: signals, restarts and admin calls block.
        let faults = {
            let (rec, path, kinds) = (rec.clone(), o.cluster.clone(), o.faults.clone());
            let timing = Timing {
                duration,
                fault: o.fault,
                calm: o.calm,
            };
            let (seed, binary) = (o.seed, o.binary.clone());
            tokio::task::spawn_blocking(move || {
                let mut nemesis = Nemesis::new(&path, binary, rec, seed);
                let result = nemesis.run(&kinds, timing);
                // Whatever happened, leave every replica running and healed.
                let healed = nemesis.heal_all();
                result.and(healed)
            })
        };
        let fault_result = faults.await.context("the fault thread panicked")?;
        rec.record(Event::Heal {
            at_us: rec.now_us(),
        });
        rec.say("healed; stopping the workloads");
        let leftover = load.stop().await;
        fault_result?;
        // The files as the faults left them (a resize changes the processes).
        let cluster = ClusterFile::load(&o.cluster).map_err(anyhow::Error::msg)?;
        let deployment = local::load(&cluster.topology, cluster.placement.as_deref())?;
        let settled = workload::settle(&cluster, &deployment, &rec, o.converge_limit, &tag).await;
        leftover
            .finish(&deployment, &rec, o.converge_limit, &tag)
            .await;
        settled
    });
    let events = rec.finish()?;
    run?;
    Ok((check::check(&events), history_path))
}

/// The checkers run on a history a nemesis run wrote.
pub fn check_history(path: &Path) -> Result<check::Report> {
    Ok(check::check(&history::load(path)?))
}

#[derive(Debug, Clone, Copy)]
struct Timing {
    duration: Duration,
    fault: Duration,
    calm: Duration,
}

/// Injects faults into the cluster of one cluster file.
struct Nemesis {
    path: PathBuf,
    /// The `pangea` binary a restarted replica runs.
    binary: PathBuf,
    rec: Arc<Recorder>,
    rng: Rng,
    /// Replicas currently stopped (SIGSTOP).
    paused: Vec<String>,
}

impl Nemesis {
    fn new(path: &Path, binary: PathBuf, rec: Arc<Recorder>, seed: u64) -> Nemesis {
        Nemesis {
            path: path.to_path_buf(),
            binary,
            rec,
            rng: Rng::new(seed),
            paused: Vec::new(),
        }
    }

    fn cluster(&self) -> Result<ClusterFile> {
        ClusterFile::load(&self.path).map_err(anyhow::Error::msg)
    }

    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[(self.rng.next_u64() % from.len() as u64) as usize]
    }

    fn log(&self, fault: &str, phase: Phase, targets: &[String], detail: String) {
        self.rec.say(&format!(
            "{fault} {} {}{}",
            match phase {
                Phase::Start => "start",
                Phase::End => "end  ",
            },
            targets.join(","),
            if detail.is_empty() {
                String::new()
            } else {
                format!(" ({detail})")
            }
        ));
        self.rec.record(Event::Fault {
            at_us: self.rec.now_us(),
            fault: fault.to_owned(),
            phase,
            targets: targets.to_vec(),
            detail,
        });
    }

    fn run(&mut self, kinds: &[String], t: Timing) -> Result<()> {
        let started = Instant::now();
        // A first calm period: the workloads warm up on a healthy cluster.
        std::thread::sleep(t.calm);
        // Rounds: every fault once per round, in an order the seed shuffles, so a
        // short run still meets each of them.
        loop {
            let mut round = kinds.to_vec();
            for i in (1..round.len()).rev() {
                round.swap(i, (self.rng.next_u64() % (i as u64 + 1)) as usize);
            }
            for kind in round {
                if started.elapsed() + t.fault > t.duration {
                    // No room for another fault: the workloads run on, healthy, to
                    // the end of the duration.
                    std::thread::sleep(t.duration.saturating_sub(started.elapsed()));
                    return Ok(());
                }
                self.inject(&kind, t.fault)?;
                std::thread::sleep(t.calm);
            }
        }
    }

    fn inject(&mut self, kind: &str, hold: Duration) -> Result<()> {
        let cluster = self.cluster()?;
        let regions: Vec<String> = regions(&cluster).into_keys().collect();
        match kind {
            "kill" => {
                let r = self.pick(&cluster.replicas).clone();
                self.kill(&[r], hold, kind)
            }
            "restart-region" => {
                let region = self.pick(&regions).clone();
                let members: Vec<ClusterReplica> = cluster
                    .replicas
                    .iter()
                    .filter(|r| r.region == region)
                    .cloned()
                    .collect();
                self.kill(&members, hold, kind)
            }
            "pause" => {
                let r = self.pick(&cluster.replicas).clone();
                let pid = r.pid.context("replica without a pid")?;
                self.log(
                    kind,
                    Phase::Start,
                    std::slice::from_ref(&r.id),
                    "SIGSTOP".into(),
                );
                signal(pid, Signal::SIGSTOP);
                self.paused.push(r.id.clone());
                std::thread::sleep(hold);
                signal(pid, Signal::SIGCONT);
                self.paused.retain(|p| *p != r.id);
                self.log(kind, Phase::End, &[r.id], "SIGCONT".into());
                Ok(())
            }
            "partition" | "loss" => {
                let a = self.pick(&regions).clone();
                let others: Vec<String> = regions.iter().filter(|r| **r != a).cloned().collect();
                // A partition cuts one region from all others; loss thins one pair.
                let (side_b, query, detail) = if kind == "partition" {
                    let detail = format!("{a} cut from {}, both ways", others.join(","));
                    (others, "partitioned=true", detail)
                } else {
                    let b = self.pick(&others).clone();
                    let detail = format!("30 % of datagrams lost between {a} and {b}");
                    (vec![b], "loss=0.3", detail)
                };
                let in_a = |r: &&ClusterReplica| r.region == a;
                let in_b = |r: &&ClusterReplica| side_b.contains(&r.region);
                let ids = |f: &dyn Fn(&&ClusterReplica) -> bool| -> Vec<String> {
                    cluster
                        .replicas
                        .iter()
                        .filter(f)
                        .map(|r| r.id.clone())
                        .collect()
                };
                let (ids_a, ids_b) = (ids(&in_a), ids(&in_b));
                let mut targets = vec![a.clone()];
                targets.extend(side_b.iter().cloned());
                self.log(kind, Phase::Start, &targets, detail);
                for r in cluster.replicas.iter().filter(in_a) {
                    fault_post(r, &format!("/fault/link?peers={}&{query}", ids_b.join(",")))?;
                }
                for r in cluster.replicas.iter().filter(in_b) {
                    fault_post(r, &format!("/fault/link?peers={}&{query}", ids_a.join(",")))?;
                }
                std::thread::sleep(hold);
                for r in &cluster.replicas {
                    fault_post(r, "/fault/heal")?;
                }
                self.log(kind, Phase::End, &targets, "healed".into());
                Ok(())
            }
            "skew" => {
                let r = self.pick(&cluster.replicas).clone();
                // Within max_offset (500 ms) both ways, and beyond it both ways: behind
                // fences the replica, ahead makes its peers refuse its timestamps.
                let offset = *self.pick(&[300_i64, -300, 2_000, -2_000]);
                self.log(
                    kind,
                    Phase::Start,
                    std::slice::from_ref(&r.id),
                    format!("clock offset {offset:+} ms"),
                );
                fault_post(&r, &format!("/fault/clock?offset_ms={offset}"))?;
                std::thread::sleep(hold);
                fault_post(&r, "/fault/clock?offset_ms=0")?;
                self.log(kind, Phase::End, &[r.id], "clock offset 0".into());
                Ok(())
            }
            "disk-full" => {
                let r = self.pick(&cluster.replicas).clone();
                self.log(
                    kind,
                    Phase::Start,
                    std::slice::from_ref(&r.id),
                    "free space reads 0: writes refused, replication held back".into(),
                );
                fault_post(&r, "/fault/disk?full=true")?;
                std::thread::sleep(hold);
                fault_post(&r, "/fault/disk?full=false")?;
                self.log(kind, Phase::End, &[r.id], "free space as it is".into());
                Ok(())
            }
            "flood" => {
                let r = self.pick(&cluster.replicas).clone();
                let n = FLOOD_PER_SECOND * hold.as_millis() as u64 / 1_000;
                self.log(
                    kind,
                    Phase::Start,
                    std::slice::from_ref(&r.id),
                    format!("{n} QUIC Initials from 100 source ports"),
                );
                flood(&cluster, &r, n as usize, hold)?;
                self.log(kind, Phase::End, &[r.id], "flood over".into());
                Ok(())
            }
            "new-replica" => {
                let r = self.pick(&cluster.replicas).clone();
                self.new_replica(&cluster, &r, hold)
            }
            "resize" => self.resize(&cluster),
            other => anyhow::bail!("unknown fault {other:?}"),
        }
    }

    /// Replaces `r` by an empty replica no peer can reach, holds, then lets it be
    /// reached: a lost disk, replaced, under the replica's old id. Its acknowledged
    /// writes reach its peers first (its disk reads full, so it takes no more,
    /// until every peer has applied its stream): a write no peer received is lost
    /// with the disk under asynchronous replication, which no checker should
    /// blame. It must stay not-ready while cut off, relearn its own stream before
    /// it writes (no sequence reused: C1, C5), and catch up once reached.
    fn new_replica(
        &mut self,
        cluster: &ClusterFile,
        r: &ClusterReplica,
        hold: Duration,
    ) -> Result<()> {
        let kind = "new-replica";
        fault_post(r, "/fault/disk?full=true")?;
        let own = own_sequences(r)?;
        let others: Vec<&ClusterReplica> =
            cluster.replicas.iter().filter(|o| o.id != r.id).collect();
        let started = Instant::now();
        loop {
            let mut behind = false;
            for o in &others {
                for (scope, seq) in watermarks_of(o, &r.id)? {
                    if own.get(&scope).is_some_and(|own| seq < *own) {
                        behind = true;
                    }
                }
            }
            if !behind {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < RESTART_HEALTHY_MAX,
                "{}'s writes did not reach its peers within {RESTART_HEALTHY_MAX:?}",
                r.id
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.log(
            kind,
            Phase::Start,
            std::slice::from_ref(&r.id),
            "replaced by an empty replica no peer can reach".into(),
        );
        if let Some(pid) = r.pid {
            signal(pid, Signal::SIGKILL);
            let dead = Instant::now();
            while alive(pid) && dead.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        std::fs::remove_dir_all(&r.data_dir)
            .with_context(|| format!("removing {}", r.data_dir.display()))?;
        for o in &others {
            fault_post(o, &format!("/fault/link?peers={}&partitioned=true", r.id))?;
        }
        local::restart_replica(&self.binary, &self.path, &r.id)?;
        std::thread::sleep(hold);
        let a = Admin::new(&r.admin)?.get("/health")?;
        let (code, body) = (a.status, a.body);
        let closed = code == 503 && body.contains("waiting to hear a peer");
        for o in &others {
            fault_post(o, "/fault/heal")?;
        }
        let healed = Instant::now();
        let cluster = self.cluster()?;
        let restarted = cluster
            .replica(&r.id)
            .context("replaced replica vanished")?;
        local::wait_healthy(restarted, RESTART_HEALTHY_MAX, &mut |_| {})?;
        self.log(
            kind,
            Phase::End,
            std::slice::from_ref(&r.id),
            format!(
                "{} while cut off; caught up {:.1} s after its peers reached it",
                if closed {
                    "not ready".to_owned()
                } else {
                    format!("SERVED an empty store ({code} {})", body.trim())
                },
                healed.elapsed().as_secs_f64()
            ),
        );
        anyhow::ensure!(
            closed,
            "new-replica: {} answered /health {code} while cut off: {}",
            r.id,
            body.trim()
        );
        Ok(())
    }

    /// SIGKILL `replicas`, wait `hold`, restart them and wait until they are healthy.
    /// Grows a replica by two processes (at most to one per shard group), the
    /// mover SIGKILLed once while it waits in a step and run again, then drains
    /// it back by one. Skipped, and said, where no replica can grow.
    fn resize(&mut self, cluster: &ClusterFile) -> Result<()> {
        let kind = "resize";
        let d = local::load(&cluster.topology, cluster.placement.as_deref())?;
        let groups = d.topology.shard_groups;
        let growable: Vec<(String, u32)> = d
            .topology
            .replicas
            .values()
            .filter(|r| r.index == 0 && r.resize.is_none() && r.processes < groups)
            .map(|r| (r.id.to_string(), r.processes))
            .collect();
        if growable.is_empty() {
            self.rec.say(&format!(
                "resize skipped: every replica already runs one process per shard group ({groups})"
            ));
            return Ok(());
        }
        let (id, before) = self.pick(&growable).clone();
        let grown = (before + 2).min(groups);
        let back = (grown - 1).max(before);
        let targets = std::slice::from_ref(&id);
        self.log(
            kind,
            Phase::Start,
            targets,
            format!("{before} -> {grown} processes, the mover killed once, then -> {back}"),
        );
        let killed = self.mover(&id, grown, true)?;
        anyhow::ensure!(
            self.mover(&id, grown, false)? == MoverEnd::Finished,
            "resize of {id} did not finish after its mover was resumed"
        );
        if back != grown {
            anyhow::ensure!(
                self.mover(&id, back, false)? == MoverEnd::Finished,
                "resize of {id} back to {back} processes did not finish"
            );
        }
        self.log(
            kind,
            Phase::End,
            targets,
            format!(
                "{id} runs {back} processes; mover {}",
                match killed {
                    MoverEnd::Killed(step) => format!("killed in its {step} step and resumed"),
                    MoverEnd::Finished => "finished before it could be killed".to_owned(),
                }
            ),
        );
        Ok(())
    }

    /// Runs `pangea cluster resize` for `replica` to `processes`, its lines
    /// relayed. With `kill`, SIGKILLs it at its first progress line that finds it
    /// waiting: the copy step with groups not yet caught up, or the serve step
    /// (which lasts its `--serve-min` at least).
    fn mover(&self, replica: &str, processes: u32, kill: bool) -> Result<MoverEnd> {
        use std::io::BufRead;
        let mut child = std::process::Command::new(&self.binary)
            .args(["cluster", "resize", "--cluster"])
            .arg(&self.path)
            .args(["--replica", replica, "--processes", &processes.to_string()])
            .args(["--step-limit", "120s"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting pangea cluster resize")?;
        let stdout = child.stdout.take().context("the mover's stdout")?;
        let mut end = MoverEnd::Finished;
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line?;
            self.rec.say(&format!("  mover: {line}"));
            let waiting = match line.trim_start().split_once(':') {
                Some(("copy", rest)) => rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.split_once('/'))
                    .is_some_and(|(a, b)| a != b),
                Some(("serve", _)) => true,
                _ => false,
            };
            if kill && waiting {
                signal(child.id(), Signal::SIGKILL);
                let step = line.trim_start().split(':').next().unwrap_or_default();
                self.rec
                    .say(&format!("  mover SIGKILLed in its {step} step"));
                end = MoverEnd::Killed(step.to_owned());
                break;
            }
        }
        let status = child.wait()?;
        anyhow::ensure!(
            end != MoverEnd::Finished || status.success(),
            "pangea cluster resize --replica {replica} --processes {processes} failed \
             ({status}; its error above)"
        );
        Ok(end)
    }

    fn kill(&mut self, replicas: &[ClusterReplica], hold: Duration, kind: &str) -> Result<()> {
        let ids: Vec<String> = replicas.iter().map(|r| r.id.clone()).collect();
        self.log(kind, Phase::Start, &ids, "SIGKILL".into());
        for r in replicas {
            if let Some(pid) = r.pid {
                signal(pid, Signal::SIGKILL);
            }
        }
        std::thread::sleep(hold);
        let restarted = Instant::now();
        for r in replicas {
            local::restart_replica(&self.binary, &self.path, &r.id)?;
        }
        let cluster = self.cluster()?;
        for id in &ids {
            let r = cluster.replica(id).context("restarted replica vanished")?;
            local::wait_healthy(r, RESTART_HEALTHY_MAX, &mut |_| {})?;
        }
        self.log(
            kind,
            Phase::End,
            &ids,
            format!(
                "restarted, healthy after {:.1} s",
                restarted.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }

    /// Resumes paused replicas, restarts dead ones, heals every link and clock.
    fn heal_all(&mut self) -> Result<()> {
        let cluster = self.cluster()?;
        for r in &cluster.replicas {
            if let Some(pid) = r.pid {
                signal(pid, Signal::SIGCONT);
            }
        }
        self.paused.clear();
        for r in &cluster.replicas {
            if !r.pid.is_some_and(alive) {
                local::restart_replica(&self.binary, &self.path, &r.id)?;
            }
        }
        let cluster = self.cluster()?;
        for r in &cluster.replicas {
            local::wait_healthy(r, RESTART_HEALTHY_MAX, &mut |_| {})?;
            fault_post(r, "/fault/heal")?;
        }
        Ok(())
    }
}

/// How a run of the mover ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MoverEnd {
    Finished,
    /// SIGKILLed while waiting in this step.
    Killed(String),
}

/// Per scope, the sequence replica `r`'s own stream has reached (its /watermarks).
fn own_sequences(r: &ClusterReplica) -> Result<BTreeMap<String, u64>> {
    watermarks_of(r, &r.id)
}

/// Per scope, how far replica `at` has applied `origin`'s stream.
fn watermarks_of(at: &ClusterReplica, origin: &str) -> Result<BTreeMap<String, u64>> {
    let w = Admin::new(&at.admin)?
        .watermarks()
        .with_context(|| format!("watermarks of {}", at.id))?;
    Ok(w.sequences_of(origin))
}

/// Sends `n` QUIC Initials to replica `r` over `over`, from 100 source ports: what
/// anyone can send, no certificate needed (made with quinn-proto; nobody answers
/// the Retry or the handshake).
fn flood(cluster: &ClusterFile, r: &ClusterReplica, n: usize, over: Duration) -> Result<()> {
    let to: std::net::SocketAddr = r.address.parse()?;
    // Any certificate makes the same Initial: the cluster's operator one.
    let ca = pangea_net::certs::load_ca(&cluster.certs)?;
    let own = pangea_net::certs::load_credential(
        &cluster.certs,
        &pangea_net::Credential::Operator(local::CLUSTER_OPERATOR.into()),
    )?;
    let config = pangea_net::tls::client_config(&ca, own)?;
    let mut ep = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        None,
    );
    let now = Instant::now();
    let mut initials = Vec::with_capacity(n);
    for _ in 0..n {
        let (_, mut conn) =
            ep.connect(now, config.clone(), to, pangea_net::tls::server_name(&r.id))?;
        let mut buf = Vec::new();
        if let Some(t) = conn.poll_transmit(now, 1, &mut buf) {
            buf.truncate(t.size);
            initials.push(buf);
        }
    }
    let started = Instant::now();
    let per_port = initials.len().div_ceil(100).max(1);
    for (i, chunk) in initials.chunks(per_port).enumerate() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        for d in chunk {
            let _ = s.send_to(d, to);
        }
        // Spread over `over`.
        let due = over.mul_f64((i + 1) as f64 / 100.0);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    Ok(())
}

/// A `/fault` POST to one replica's admin endpoint; anything but 200 is an error.
fn fault_post(r: &ClusterReplica, path: &str) -> Result<()> {
    let a = Admin::new(&r.admin)?
        .post(path)
        .with_context(|| format!("{}: POST {path}", r.id))?;
    anyhow::ensure!(
        a.status == 200,
        "{}: POST {path}: {} {}",
        r.id,
        a.status,
        a.body.trim()
    );
    Ok(())
}

/// The regions of a cluster and their replicas.
pub fn regions(cluster: &ClusterFile) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &cluster.replicas {
        out.entry(r.region.clone()).or_default().push(r.id.clone());
    }
    out
}
