//! `pangea cluster up | down | status`: every replica of a topology as a local
//! process on 127.0.0.1, for development, drills on real processes and tests.

use anyhow::{Context, Result};
use clap::Subcommand;
use pangea_topology::cluster::{ClusterFile, ClusterReplica};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `up` waits for every replica to report healthy.
const HEALTH_WAIT: Duration = Duration::from_secs(120);
/// How long `down` waits after SIGTERM before SIGKILL.
const GRACE_DEFAULT_MS: u64 = 10_000;

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Start every replica of TOPOLOGY as a local process; write DIR/cluster.toml.
    Up {
        topology: PathBuf,
        #[arg(long)]
        placement: Option<PathBuf>,
        #[arg(long)]
        data_dir: PathBuf,
        /// Delay traffic between replicas by the topology's latencies.
        #[arg(long)]
        emulate_wan: bool,
        /// fsync (default) or os-buffer.
        #[arg(long, default_value = "fsync", value_parser = ["fsync", "os-buffer"])]
        durability: String,
        /// Let replicas take runtime faults on their admin endpoint (partitions,
        /// packet loss, clock offsets), for `pangea cluster nemesis`.
        #[arg(long)]
        fault_injection: bool,
    },
    /// Stop the cluster in DIR: SIGTERM, then SIGKILL after the grace period.
    Down {
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long, default_value_t = GRACE_DEFAULT_MS)]
        grace_ms: u64,
    },
    /// Stop some replicas of the cluster in DIR (SIGTERM, then SIGKILL after the
    /// grace period); the others keep running.
    Stop {
        #[arg(long)]
        data_dir: PathBuf,
        /// Replica ids (at least one; `cluster down` stops them all).
        #[arg(required = true)]
        replicas: Vec<String>,
        #[arg(long, default_value_t = GRACE_DEFAULT_MS)]
        grace_ms: u64,
    },
    /// Start replicas of the cluster in DIR that are not running, on their own
    /// addresses and data, and wait until they are healthy.
    Start {
        #[arg(long)]
        data_dir: PathBuf,
        /// Replica ids (none: every replica that is not running).
        replicas: Vec<String>,
    },
    /// Stop, then start, replicas of the cluster in DIR (none named: all, one by one).
    Restart {
        #[arg(long)]
        data_dir: PathBuf,
        replicas: Vec<String>,
        #[arg(long, default_value_t = GRACE_DEFAULT_MS)]
        grace_ms: u64,
    },
    /// Inject faults into a running cluster while checker workloads run, record a
    /// history and check it (C1, C4, C5, residency); see docs/reliability.md.
    Nemesis(crate::nemesis::NemesisArgs),
    /// Run the checkers on a history recorded by `nemesis`.
    CheckHistory(crate::nemesis::CheckArgs),
    /// Process and health of every replica.
    Status {
        #[arg(long, conflicts_with = "cluster")]
        data_dir: Option<PathBuf>,
        #[arg(long)]
        cluster: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

pub(crate) fn run(cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::Up {
            topology,
            placement,
            data_dir,
            emulate_wan,
            durability,
            fault_injection,
        } => {
            let cluster = up(&UpOptions {
                topology,
                placement,
                data_dir,
                emulate_wan,
                durability,
                fault_injection,
            })?;
            println!(
                "cluster {:?} is up: {} replicas",
                cluster.name,
                cluster.replicas.len()
            );
            println!(
                "  cluster file: {}",
                cluster_path(&cluster_dir(&cluster)).display()
            );
            Ok(())
        }
        ClusterCommand::Down { data_dir, grace_ms } => {
            down(&data_dir, Duration::from_millis(grace_ms))
        }
        ClusterCommand::Stop {
            data_dir,
            replicas,
            grace_ms,
        } => stop(&data_dir, &replicas, Duration::from_millis(grace_ms)),
        ClusterCommand::Start { data_dir, replicas } => start(&data_dir, &replicas),
        ClusterCommand::Restart {
            data_dir,
            replicas,
            grace_ms,
        } => {
            let ids = match replicas.is_empty() {
                true => ClusterFile::load(&cluster_path(&data_dir))
                    .map_err(anyhow::Error::msg)?
                    .replicas
                    .iter()
                    .map(|r| r.id.clone())
                    .collect(),
                false => replicas,
            };
            // One at a time: the others keep serving.
            for id in &ids {
                stop(
                    &data_dir,
                    std::slice::from_ref(id),
                    Duration::from_millis(grace_ms),
                )?;
                start(&data_dir, std::slice::from_ref(id))?;
            }
            Ok(())
        }
        ClusterCommand::Nemesis(a) => crate::nemesis::nemesis(a),
        ClusterCommand::CheckHistory(a) => crate::nemesis::check_history(a),
        ClusterCommand::Status {
            data_dir,
            cluster,
            json,
        } => {
            let path = match (data_dir, cluster) {
                (Some(d), _) => cluster_path(&d),
                (None, Some(c)) => c,
                (None, None) => anyhow::bail!("say --data-dir DIR or --cluster FILE"),
            };
            status(&path, json)
        }
    }
}

fn cluster_dir(c: &ClusterFile) -> PathBuf {
    c.topology
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

pub(crate) fn cluster_path(dir: &Path) -> PathBuf {
    dir.join("cluster.toml")
}

pub(crate) struct UpOptions {
    pub topology: PathBuf,
    pub placement: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub emulate_wan: bool,
    pub durability: String,
    pub fault_injection: bool,
}

/// How a replica process is started, beyond its files and sockets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StartFlags<'a> {
    pub emulate_wan: bool,
    pub fault_injection: bool,
    pub durability: &'a str,
    /// A replica of a cluster being created (`--new-cluster`).
    pub new_cluster: bool,
}

impl StartFlags<'_> {
    /// As the cluster file records them (restarts and added replicas: fsync).
    pub(crate) fn of(cluster: &ClusterFile) -> StartFlags<'static> {
        StartFlags {
            emulate_wan: cluster.emulate_wan,
            fault_injection: cluster.fault_injection,
            durability: "fsync",
            new_cluster: false,
        }
    }
}

/// A replica's QUIC socket and admin listener, bound here and handed to its process
/// (`pangea start` takes them from `LISTEN_FDS`). Binding in the parent and passing
/// the socket leaves no moment in which a port we picked is free for another process
/// to take, as "pick a free port, release it, let the child bind it" would.
pub(crate) struct ReplicaSockets {
    quic: std::net::UdpSocket,
    admin: std::net::TcpListener,
}

impl ReplicaSockets {
    /// Fresh ports on 127.0.0.1, picked by the OS.
    fn fresh() -> Result<ReplicaSockets> {
        ReplicaSockets::bind("127.0.0.1:0", "127.0.0.1:0", "a new replica")
    }

    /// The recorded addresses of replica `id` (a restart keeps its ports).
    fn bind(address: &str, admin: &str, id: &str) -> Result<ReplicaSockets> {
        let quic_addr: SocketAddr = address
            .parse()
            .with_context(|| format!("replica {id}: address {address:?} is not host:port"))?;
        let admin_addr: SocketAddr = admin
            .parse()
            .with_context(|| format!("replica {id}: admin {admin:?} is not host:port"))?;
        let quic = pangea_net::bind_udp_socket(quic_addr)
            .with_context(|| format!("replica {id}: binding its QUIC address {quic_addr}"))?;
        let admin = std::net::TcpListener::bind(admin_addr)
            .with_context(|| format!("replica {id}: binding its admin address {admin_addr}"))?;
        Ok(ReplicaSockets { quic, admin })
    }

    fn addresses(&self) -> Result<(String, String)> {
        Ok((
            self.quic.local_addr()?.to_string(),
            self.admin.local_addr()?.to_string(),
        ))
    }
}

/// Starts a local cluster and returns its cluster file (also written to DIR).
pub(crate) fn up(o: &UpOptions) -> Result<ClusterFile> {
    let deployment = crate::topology_cmd::load(&o.topology, o.placement.as_deref())?;
    let dir = std::fs::canonicalize({
        std::fs::create_dir_all(&o.data_dir)
            .with_context(|| format!("creating {}", o.data_dir.display()))?;
        &o.data_dir
    })?;
    if let Ok(existing) = ClusterFile::load(&cluster_path(&dir))
        && existing.replicas.iter().any(|r| r.pid.is_some_and(alive))
    {
        anyhow::bail!(
            "a cluster is already running in {} (pangea cluster down --data-dir {0})",
            dir.display()
        );
    }
    // Certificates: a CA, one per replica, one client per app profile.
    let certs = dir.join("certs");
    if !pangea_net::certs::ca_cert_path(&certs).exists() {
        pangea_net::certs::init_ca(&certs)?;
    }
    for r in deployment.topology.replicas.values() {
        if !pangea_net::certs::replica_cert_path(&certs, r.id.as_str()).exists() {
            pangea_net::certs::issue_replica(&certs, r.id.as_str(), r.region.as_str())?;
        }
    }
    for p in deployment.topology.app_profiles.keys() {
        let name = format!("client-{p}");
        if !pangea_net::certs::client_cert_path(&certs, &name).exists() {
            pangea_net::certs::issue_client(&certs, &name, p)?;
        }
        let name = format!("loader-{p}");
        if !pangea_net::certs::loader_cert_path(&certs, &name).exists() {
            pangea_net::certs::issue_loader(&certs, &name, p)?;
        }
    }
    // The operator commands' certificate (placement, watermarks, topology apply).
    let operator = crate::data_cmd::CLUSTER_OPERATOR;
    if !pangea_net::certs::operator_cert_path(&certs, operator).exists() {
        pangea_net::certs::issue_operator(&certs, operator)?;
    }
    // Addresses: reuse the ports of an earlier run of this directory when possible,
    // so data directories and cluster files stay valid across restarts.
    let earlier = ClusterFile::load(&cluster_path(&dir)).ok();
    let mut replicas = Vec::new();
    let mut sockets = Vec::new();
    for r in deployment.topology.replicas.values() {
        let before = earlier.as_ref().and_then(|c| c.replica(r.id.as_str()));
        let bound = match before {
            Some(b) => ReplicaSockets::bind(&b.address, &b.admin, r.id.as_str())?,
            None => ReplicaSockets::fresh()?,
        };
        let (address, admin) = bound.addresses()?;
        sockets.push(bound);
        replicas.push(ClusterReplica {
            id: r.id.to_string(),
            region: r.region.to_string(),
            address,
            admin,
            data_dir: dir.join("replicas").join(r.id.as_str()),
            pid: None,
            log: Some(dir.join("logs").join(format!("{}.log", r.id))),
        });
    }
    // The topology with addresses filled in (comments kept).
    let text = fill_addresses(&std::fs::read_to_string(&o.topology)?, &replicas)?;
    let topology = dir.join("topology.toml");
    std::fs::write(&topology, text)?;
    let placement = match &o.placement {
        Some(p) => {
            let to = dir.join("placement.toml");
            std::fs::copy(p, &to).with_context(|| format!("copying {}", p.display()))?;
            Some(to)
        }
        None => None,
    };
    std::fs::create_dir_all(dir.join("logs"))?;
    for (r, sockets) in replicas.iter_mut().zip(sockets) {
        r.pid = Some(spawn_replica(
            &topology,
            placement.as_deref(),
            &certs,
            r,
            sockets,
            StartFlags {
                emulate_wan: o.emulate_wan,
                fault_injection: o.fault_injection,
                durability: &o.durability,
                // A directory this command has not run a cluster in yet.
                new_cluster: earlier.is_none(),
            },
        )?);
    }
    let cluster = ClusterFile {
        name: deployment.topology.name,
        topology,
        placement,
        certs,
        emulate_wan: o.emulate_wan,
        fault_injection: o.fault_injection,
        replicas,
    };
    cluster
        .save(&cluster_path(&dir))
        .map_err(anyhow::Error::msg)?;
    // Wait for every replica to report healthy.
    for r in &cluster.replicas {
        wait_healthy(r, HEALTH_WAIT, false)?;
    }
    Ok(cluster)
}

/// The topology text with every replica's `address` set from `replicas` (comments and
/// layout kept).
pub(crate) fn fill_addresses(text: &str, replicas: &[ClusterReplica]) -> Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("topology")?;
    let addr_of = |id: &str| {
        replicas
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.address.clone())
    };
    if let Some(continents) = doc
        .get_mut("continents")
        .and_then(|c| c.as_array_of_tables_mut())
    {
        for c in continents.iter_mut() {
            let Some(regions) = c
                .get_mut("regions")
                .and_then(|r| r.as_array_of_tables_mut())
            else {
                continue;
            };
            for region in regions.iter_mut() {
                let Some(reps) = region
                    .get_mut("replicas")
                    .and_then(|r| r.as_array_of_tables_mut())
                else {
                    continue;
                };
                for rep in reps.iter_mut() {
                    let id = rep
                        .get("id")
                        .and_then(|v| v.as_str())
                        .unwrap_or_default()
                        .to_owned();
                    if let Some(a) = addr_of(&id) {
                        rep["address"] = toml_edit::value(a);
                    }
                }
            }
        }
    }
    Ok(doc.to_string())
}

/// Starts one replica process as `cluster up` does (its own process group, log file
/// appended to when `append`) on `sockets`, which must be bound to `r`'s addresses.
/// Returns its pid.
pub(crate) fn spawn_replica(
    topology: &Path,
    placement: Option<&Path>,
    certs: &Path,
    r: &ClusterReplica,
    sockets: ReplicaSockets,
    flags: StartFlags<'_>,
) -> Result<u32> {
    let log_path = r.log.as_ref().context("replica without a log file")?;
    // Appended to, never truncated: a restart's log follows the one before it.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("start")
        .arg("--topology")
        .arg(topology)
        .arg("--replica")
        .arg(&r.id)
        .arg("--data-dir")
        .arg(&r.data_dir)
        .arg("--certs")
        .arg(certs)
        .arg("--admin")
        .arg(&r.admin)
        .arg("--durability")
        .arg(flags.durability);
    if let Some(p) = placement {
        cmd.arg("--placement").arg(p);
    }
    if flags.emulate_wan {
        cmd.arg("--emulate-wan");
    }
    if flags.fault_injection {
        cmd.arg("--fault-injection");
    }
    if flags.new_cluster {
        cmd.arg("--new-cluster");
    }
    // Replicas of a local cluster share this machine's cores (with each other and
    // with the clients): one runtime thread each, unless PANGEA_THREADS says
    // otherwise (see NodeConfig::threads).
    if std::env::var_os("PANGEA_THREADS").is_none() {
        cmd.env("PANGEA_THREADS", "1");
    }
    // The sockets as descriptors 3 (QUIC) and 4 (admin), systemd style. The
    // parent's copies close when `cmd` is dropped, after the spawn.
    use command_fds::{CommandFdExt, FdMapping};
    cmd.env("LISTEN_FDS", "2")
        .env("LISTEN_FDNAMES", "quic:admin")
        .env_remove("LISTEN_PID")
        .fd_mappings(vec![
            FdMapping {
                parent_fd: sockets.quic.into(),
                child_fd: 3,
            },
            FdMapping {
                parent_fd: sockets.admin.into(),
                child_fd: 4,
            },
        ])?;
    // Its own process group: Ctrl-C in this terminal does not reach it.
    use std::os::unix::process::CommandExt;
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting replica {}", r.id))?;
    Ok(child.id())
}

/// Starts replica `id` of the cluster in `path` again on its recorded addresses
/// (after a crash or a kill), appending to its log, and records its new pid in the
/// cluster file. Its ports are taken back at once; for a few seconds after a kill
/// the kernel may still hold them, so binding is retried.
pub(crate) fn restart_replica(path: &Path, id: &str) -> Result<u32> {
    let mut cluster = ClusterFile::load(path).map_err(anyhow::Error::msg)?;
    let r = cluster
        .replica(id)
        .with_context(|| format!("replica {id} is not in {}", path.display()))?
        .clone();
    let started = Instant::now();
    let sockets = loop {
        match ReplicaSockets::bind(&r.address, &r.admin, id) {
            Ok(s) => break s,
            Err(e) if started.elapsed() > Duration::from_secs(5) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let pid = spawn_replica(
        &cluster.topology,
        cluster.placement.as_deref(),
        &cluster.certs,
        &r,
        sockets,
        StartFlags::of(&cluster),
    )?;
    if let Some(rep) = cluster.replicas.iter_mut().find(|x| x.id == id) {
        rep.pid = Some(pid);
    }
    cluster.save(path).map_err(anyhow::Error::msg)?;
    Ok(pid)
}

/// Waits until a replica's admin endpoint reports healthy.
pub(crate) fn wait_healthy(r: &ClusterReplica, limit: Duration, show_progress: bool) -> Result<()> {
    let started = Instant::now();
    let mut shown = String::new();
    loop {
        match health(&r.admin) {
            Ok((200, _)) => return Ok(()),
            // A replica catching up says how far it is (readiness): show it.
            Ok((_, body)) if show_progress => {
                let phase = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["detail"]["phase"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                if !phase.is_empty() && phase != shown {
                    println!("  {}: {phase}", r.id);
                    shown = phase;
                }
            }
            _ => {}
        }
        if !r.pid.is_some_and(alive) {
            let tail = r
                .log
                .as_ref()
                .and_then(|l| std::fs::read_to_string(l).ok())
                .unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(10).collect();
            anyhow::bail!(
                "replica {} exited during start-up; last log lines:\n{}",
                r.id,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if started.elapsed() > limit {
            anyhow::bail!(
                "replica {} not healthy after {limit:?}; see {:?}",
                r.id,
                r.log
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn alive(pid: u32) -> bool {
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // A zombie still answers signal 0; a reaped or dead process does not.
    kill(Pid::from_raw(pid), None).is_ok() && !is_zombie(pid)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

pub(crate) fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), sig);
    }
}

pub(crate) fn down(dir: &Path, grace: Duration) -> Result<()> {
    use nix::sys::signal::Signal;
    let cluster = ClusterFile::load(&cluster_path(dir)).map_err(anyhow::Error::msg)?;
    let pids: Vec<(String, u32)> = cluster
        .replicas
        .iter()
        .filter_map(|r| r.pid.map(|p| (r.id.clone(), p)))
        .collect();
    for (_, pid) in &pids {
        signal(*pid, Signal::SIGTERM);
    }
    let started = Instant::now();
    while pids.iter().any(|(_, p)| alive(*p)) && started.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut killed = 0;
    for (id, pid) in &pids {
        if alive(*pid) {
            eprintln!("replica {id} (pid {pid}) did not stop within {grace:?}: SIGKILL");
            signal(*pid, Signal::SIGKILL);
            killed += 1;
        }
    }
    println!(
        "cluster {:?} stopped: {} replicas ({} killed after the grace period)",
        cluster.name,
        pids.len(),
        killed
    );
    Ok(())
}

/// Stops replicas `ids` of the cluster in `dir`, as `down` stops them all, and
/// records them as stopped.
pub(crate) fn stop(dir: &Path, ids: &[String], grace: Duration) -> Result<()> {
    use nix::sys::signal::Signal;
    let path = cluster_path(dir);
    let mut cluster = ClusterFile::load(&path).map_err(anyhow::Error::msg)?;
    let known: Vec<String> = cluster.replicas.iter().map(|r| r.id.clone()).collect();
    for id in ids {
        anyhow::ensure!(
            known.contains(id),
            "replica {id:?} is not in {} (its replicas: {})",
            path.display(),
            known.join(", ")
        );
    }
    let pids: Vec<(String, u32)> = cluster
        .replicas
        .iter()
        .filter(|r| ids.contains(&r.id))
        .filter_map(|r| r.pid.filter(|p| alive(*p)).map(|p| (r.id.clone(), p)))
        .collect();
    for (_, pid) in &pids {
        signal(*pid, Signal::SIGTERM);
    }
    let started = Instant::now();
    while pids.iter().any(|(_, p)| alive(*p)) && started.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (id, pid) in &pids {
        if alive(*pid) {
            eprintln!("replica {id} (pid {pid}) did not stop within {grace:?}: SIGKILL");
            signal(*pid, Signal::SIGKILL);
        }
    }
    for r in cluster.replicas.iter_mut().filter(|r| ids.contains(&r.id)) {
        r.pid = None;
    }
    cluster.save(&path).map_err(anyhow::Error::msg)?;
    for id in ids {
        println!("stopped replica {id}");
    }
    Ok(())
}

/// Starts replicas `ids` (none: every replica not running) of the cluster in
/// `dir` on their recorded addresses and data, and waits until they are healthy.
pub(crate) fn start(dir: &Path, ids: &[String]) -> Result<()> {
    let path = cluster_path(dir);
    let cluster = ClusterFile::load(&path).map_err(anyhow::Error::msg)?;
    let todo: Vec<ClusterReplica> = cluster
        .replicas
        .iter()
        .filter(|r| ids.is_empty() || ids.contains(&r.id))
        .filter(|r| !r.pid.is_some_and(alive))
        .cloned()
        .collect();
    for id in ids {
        anyhow::ensure!(
            cluster.replica(id).is_some(),
            "replica {id:?} is not in {}",
            path.display()
        );
    }
    let mut started = Vec::new();
    for r in &todo {
        let pid = restart_replica(&path, &r.id)?;
        started.push(ClusterReplica {
            pid: Some(pid),
            ..r.clone()
        });
    }
    for r in &started {
        wait_healthy(r, HEALTH_WAIT, true)?;
        println!("started replica {} ({})", r.id, r.region);
    }
    Ok(())
}

/// `GET /health` on an admin address: (status code, body).
pub(crate) fn health(admin: &str) -> Result<(u16, String)> {
    http_get(admin, "/health")
}

pub(crate) fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    http_request("GET", addr, path)
}

/// One HTTP/1.1 request without a body: (status code, body).
pub(crate) fn http_request(method: &str, addr: &str, path: &str) -> Result<(u16, String)> {
    let addr: SocketAddr = addr.parse()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

fn status(path: &Path, json: bool) -> Result<()> {
    let cluster = ClusterFile::load(path).map_err(anyhow::Error::msg)?;
    let mut rows = Vec::new();
    for r in &cluster.replicas {
        let running = r.pid.is_some_and(alive);
        let healthy = running && health(&r.admin).is_ok_and(|(c, _)| c == 200);
        rows.push(serde_json::json!({
            "id": r.id, "region": r.region, "address": r.address, "admin": r.admin,
            "pid": r.pid, "running": running, "healthy": healthy,
        }));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("cluster {:?} ({})", cluster.name, path.display());
    println!(
        "{:<14} {:<16} {:<22} {:<22} {:>8} {:>8}",
        "REPLICA", "REGION", "ADDRESS", "ADMIN", "PID", "STATE"
    );
    for (r, row) in cluster.replicas.iter().zip(&rows) {
        let state = match (row["running"].as_bool(), row["healthy"].as_bool()) {
            (Some(true), Some(true)) => "healthy",
            (Some(true), _) => "unhealthy",
            _ => "stopped",
        };
        println!(
            "{:<14} {:<16} {:<22} {:<22} {:>8} {:>8}",
            r.id,
            r.region,
            r.address,
            r.admin,
            r.pid.map_or("-".into(), |p| p.to_string()),
            state
        );
    }
    Ok(())
}

/// Where `apply` keeps the files it replaced.
fn previous_dir(cluster_path: &Path) -> PathBuf {
    cluster_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
        .join("previous")
}

/// `pangea topology rollback --cluster FILE`: applies the files the last apply
/// replaced (which become the previous ones in turn).
pub(crate) fn rollback(
    cluster_path: &Path,
    dry_run: bool,
    allow: &crate::topology_cmd::AllowDestructive,
) -> Result<()> {
    let previous = previous_dir(cluster_path);
    let topology = previous.join("topology.toml");
    anyhow::ensure!(
        topology.exists(),
        "no previous files in {}: nothing was applied to this cluster yet",
        previous.display()
    );
    // Copies: the apply overwrites DIR/previous/ with the files it replaces.
    let tmp = tempfile::tempdir()?;
    let t = tmp.path().join("topology.toml");
    std::fs::copy(&topology, &t)?;
    let p = previous.join("placement.toml");
    let p = if p.exists() {
        let to = tmp.path().join("placement.toml");
        std::fs::copy(&p, &to)?;
        Some(to)
    } else {
        None
    };
    apply(cluster_path, &t, p.as_deref(), dry_run, allow)
}

/// Writes `text` beside `path` and renames it over (atomic for readers; safe when
/// the source was `path` itself).
fn write_replacing(path: &Path, text: &[u8]) -> Result<()> {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// Asks each of `running` to reload its files, with the operator certificate of
/// the cluster's certificate directory. A replica that refuses (an invalid or
/// unsafe file) fails the apply, naming the replica and its reason.
fn reload_replicas(
    cluster: &ClusterFile,
    all: &[ClusterReplica],
    running: &[&ClusterReplica],
) -> Result<()> {
    if running.is_empty() {
        return Ok(());
    }
    let mut view = cluster.clone();
    view.replicas = all.to_vec();
    let d = crate::topology_cmd::load(&view.topology, view.placement.as_deref())?;
    let region = running[0].region.clone();
    let profile = d
        .topology
        .app_profiles
        .keys()
        .next()
        .cloned()
        .context("the topology has no app profile to route operator requests with")?;
    let config = pangea_client::ClientConfig::from_cluster(&view, &region, &profile)?
        .with_credential(pangea_client::Credential::Operator(
            crate::data_cmd::CLUSTER_OPERATOR.into(),
        ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = pangea_client::Client::connect(config).await?;
        let mut refused = Vec::new();
        for r in running {
            match client.reload(&r.id.as_str().into()).await {
                Ok(changes) if changes.is_empty() => println!("{}: no changes", r.id),
                Ok(changes) => println!("{}: {}", r.id, changes.join("; ")),
                Err(e) => refused.push(format!("{}: {e}", r.id)),
            }
        }
        anyhow::ensure!(
            refused.is_empty(),
            "reload refused:\n  {}",
            refused.join("\n  ")
        );
        anyhow::Ok(())
    })
}

/// `pangea topology apply --cluster FILE NEW [--placement NEW]` on a local cluster:
/// validates the new files (an invalid file changes nothing and says why), shows the
/// diff, writes the new topology (addresses kept, new replicas given ports), starts
/// added replicas (they bootstrap by snapshot), makes every running replica reload
/// (SIGHUP), then stops removed replicas.
pub(crate) fn apply(
    cluster_path: &Path,
    new_topology: &Path,
    new_placement: Option<&Path>,
    dry_run: bool,
    allow: &crate::topology_cmd::AllowDestructive,
) -> Result<()> {
    use nix::sys::signal::Signal;
    let mut cluster = ClusterFile::load(cluster_path).map_err(anyhow::Error::msg)?;
    let placement = new_placement
        .map(Path::to_path_buf)
        .or_else(|| cluster.placement.clone());
    let new = crate::topology_cmd::load(new_topology, placement.as_deref())
        .context("the new files are invalid; nothing changed")?;
    if new
        .placement
        .schema
        .tables
        .keys()
        .all(|t| t.starts_with('_'))
    {
        anyhow::bail!(
            "the new placement defines no table: every row would lose its schema; nothing changed"
        );
    }
    // Against the running files (what the replicas were last given).
    let old = crate::topology_cmd::load(&cluster.topology, cluster.placement.as_deref())?;
    let diff = old.diff(&new);
    if diff.is_empty() {
        println!("no changes");
    }
    crate::topology_cmd::print_diff(&diff);
    let destructive = old.destructive_changes(&new);
    let refused: Vec<String> = destructive
        .iter()
        .filter(|d| !allow.allows(d))
        .map(|d| format!("{d} (allow with {})", d.flag()))
        .collect();
    for d in destructive.iter().filter(|d| allow.allows(d)) {
        println!("allowed by flag: {d}");
    }
    if !refused.is_empty() {
        anyhow::bail!(
            "refused, nothing changed: the new files would\n  {}",
            refused.join("\n  ")
        );
    }
    if dry_run {
        println!("dry run: nothing changed");
        return Ok(());
    }
    let dir = cluster_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    // Replicas: keep the running ones, add new ones with fresh ports.
    let mut added = Vec::new();
    let mut added_sockets = Vec::new();
    for r in new.topology.replicas.values() {
        if cluster.replica(r.id.as_str()).is_none() {
            pangea_net::certs::issue_replica(&cluster.certs, r.id.as_str(), r.region.as_str())
                .with_context(|| format!("issuing the certificate of replica {}", r.id))?;
            let sockets = ReplicaSockets::fresh()?;
            let (address, admin) = sockets.addresses()?;
            added_sockets.push(sockets);
            added.push(ClusterReplica {
                id: r.id.to_string(),
                region: r.region.to_string(),
                address,
                admin,
                data_dir: dir.join("replicas").join(r.id.as_str()),
                pid: None,
                log: Some(dir.join("logs").join(format!("{}.log", r.id))),
            });
        }
    }
    let removed: Vec<ClusterReplica> = cluster
        .replicas
        .iter()
        .filter(|r| new.topology.replica(&r.id).is_none())
        .cloned()
        .collect();
    let kept: Vec<ClusterReplica> = cluster
        .replicas
        .iter()
        .filter(|r| new.topology.replica(&r.id).is_some())
        .cloned()
        .collect();
    let all: Vec<ClusterReplica> = kept.iter().chain(&added).cloned().collect();
    // What runs now: kept in DIR/previous/ for `pangea topology rollback`, and put
    // back at once if a replica refuses the new files.
    let old_topology = std::fs::read(&cluster.topology)?;
    let old_placement = match &cluster.placement {
        Some(p) => Some((p.clone(), std::fs::read(p)?)),
        None => None,
    };
    let previous = previous_dir(cluster_path);
    std::fs::create_dir_all(&previous)?;
    write_replacing(&previous.join("topology.toml"), &old_topology)?;
    if let Some((_, text)) = &old_placement {
        write_replacing(&previous.join("placement.toml"), text)?;
    }
    let text = fill_addresses(&std::fs::read_to_string(new_topology)?, &all)?;
    let tmp = cluster.topology.with_extension("toml.new");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &cluster.topology)?;
    if let Some(p) = new_placement {
        let to = cluster
            .placement
            .clone()
            .unwrap_or_else(|| dir.join("placement.toml"));
        // Copying the running file onto itself would truncate it: write a copy
        // beside it, then rename over (also atomic for replicas reading it).
        let text = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        write_replacing(&to, &text)?;
        cluster.placement = Some(to);
    }
    // New replicas first, so that the others find them when they reload.
    for (r, sockets) in added.iter_mut().zip(added_sockets) {
        r.pid = Some(spawn_replica(
            &cluster.topology,
            cluster.placement.as_deref(),
            &cluster.certs,
            r,
            sockets,
            StartFlags::of(&cluster),
        )?);
        println!("started replica {} ({})", r.id, r.region);
    }
    // Every running replica re-reads the files, asked as the cluster's operator
    // (authorized and recorded in each replica's audit log).
    let running: Vec<&ClusterReplica> = kept.iter().filter(|r| r.pid.is_some_and(alive)).collect();
    if let Err(e) = reload_replicas(&cluster, &all, &running) {
        // Put the running files back and have every replica re-read them, so files
        // and replicas agree again.
        write_replacing(&cluster.topology, &old_topology)?;
        if let Some((path, text)) = &old_placement {
            write_replacing(path, text)?;
        }
        let _ = reload_replicas(&cluster, &all, &running);
        return Err(e.context(
            "the new files were refused; the previous topology and placement files are back \
             in place and the replicas re-read them",
        ));
    }
    println!("{} running replicas reloaded", running.len());
    for r in &added {
        wait_healthy(r, HEALTH_WAIT, true)?;
    }
    // Removed replicas stop once the others have let them go.
    if !removed.is_empty() {
        std::thread::sleep(Duration::from_millis(500));
        for r in &removed {
            if let Some(pid) = r.pid {
                signal(pid, Signal::SIGTERM);
                println!("stopping replica {} (removed)", r.id);
            }
        }
    }
    // `all` was built before the new replicas had pids.
    cluster.replicas = kept;
    cluster.replicas.extend(added.iter().cloned());
    cluster.replicas.sort_by(|a, b| a.id.cmp(&b.id));
    cluster.name = new.topology.name;
    cluster.save(cluster_path).map_err(anyhow::Error::msg)?;
    println!(
        "applied: {} replicas ({} added, {} removed)",
        cluster.replicas.len(),
        added.len(),
        removed.len()
    );
    Ok(())
}
