//! Local clusters: every replica of a topology as a process on 127.0.0.1, for
//! development, drills on real processes and tests (`pangea cluster up | down |
//! start | stop`). The processes are `pangea start` of the binary the caller names
//! ([`UpOptions::binary`], [`Local::binary`]), each in its own process group with
//! its sockets bound here and handed over (no window in which a picked port is free),
//! its log appended to under the cluster directory. The cluster file
//! (`DIR/cluster.toml`) records addresses, data directories and pids.

use crate::admin::Admin;
use anyhow::{Context, Result};
pub use pangea_node::config::Durability;
use pangea_topology::Deployment;
use pangea_topology::cluster::{ClusterFile, ClusterReplica};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `up` waits for every replica to report healthy.
pub const HEALTH_WAIT: Duration = Duration::from_secs(120);

/// The operator certificate a local cluster issues for its operator commands
/// (placement, watermarks, topology apply).
pub const CLUSTER_OPERATOR: &str = "operator";

/// The deployment of a topology file and its placement file.
pub fn load(topology: &Path, placement: Option<&Path>) -> Result<Deployment> {
    Deployment::load(topology, placement).map_err(|p| anyhow::anyhow!("{p}"))
}

/// A client of `cluster` in `region` that presents the cluster's operator
/// certificate (requests are routed with the topology's first app profile).
pub fn operator_config(cluster: &ClusterFile, region: &str) -> Result<pangea_client::ClientConfig> {
    let d = load(&cluster.topology, cluster.placement.as_deref())?;
    let profile = d
        .topology
        .app_profiles
        .keys()
        .next()
        .cloned()
        .context("the topology has no app profile to route operator requests with")?;
    Ok(
        pangea_client::ClientConfig::from_cluster(cluster, region, &profile)?
            .with_credential(pangea_client::Credential::Operator(CLUSTER_OPERATOR.into())),
    )
}

pub fn cluster_path(dir: &Path) -> PathBuf {
    dir.join("cluster.toml")
}

#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The `pangea` binary the replicas run (`pangea start`).
    pub binary: PathBuf,
    pub topology: PathBuf,
    pub placement: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub emulate_wan: bool,
    pub durability: Durability,
    pub fault_injection: bool,
}

impl UpOptions {
    /// A cluster of `topology` in `data_dir` with emulated WAN and the default
    /// durability, no fault injection: how the demo and the calibration run.
    pub fn emulated_wan(
        binary: PathBuf,
        topology: PathBuf,
        placement: Option<PathBuf>,
        data_dir: PathBuf,
    ) -> UpOptions {
        UpOptions {
            binary,
            topology,
            placement,
            data_dir,
            emulate_wan: true,
            durability: Durability::default(),
            fault_injection: false,
        }
    }
}

/// How a replica process is started, beyond its files and sockets.
#[derive(Debug, Clone, Copy)]
pub struct StartFlags {
    pub emulate_wan: bool,
    pub fault_injection: bool,
    pub durability: Durability,
    /// A replica of a cluster being created (`--new-cluster`).
    pub new_cluster: bool,
}

impl StartFlags {
    /// As the cluster file records them (restarts and added replicas: fsync).
    pub fn of(cluster: &ClusterFile) -> StartFlags {
        StartFlags {
            emulate_wan: cluster.emulate_wan,
            fault_injection: cluster.fault_injection,
            durability: Durability::Fsync,
            new_cluster: false,
        }
    }
}

/// A replica's QUIC socket and admin listener, bound here and handed to its process
/// (`pangea start` takes them from `LISTEN_FDS`). Binding in the parent and passing
/// the socket leaves no moment in which a port we picked is free for another process
/// to take, as "pick a free port, release it, let the child bind it" would.
#[derive(Debug)]
pub struct ReplicaSockets {
    quic: std::net::UdpSocket,
    admin: std::net::TcpListener,
}

impl ReplicaSockets {
    /// Fresh ports on 127.0.0.1, picked by the OS.
    pub fn fresh() -> Result<ReplicaSockets> {
        ReplicaSockets::bind("127.0.0.1:0", "127.0.0.1:0", "a new replica")
    }

    /// Fresh sockets for the `n` processes of replica `id`: QUIC ports that
    /// follow one another (process p on the first's port + p, as the topology
    /// gives them), admin ports wherever the OS puts them.
    pub fn fresh_run(n: u32, id: &str) -> Result<Vec<ReplicaSockets>> {
        const TRIES: usize = 64;
        for _ in 0..TRIES {
            let first = ReplicaSockets::fresh()?;
            let port = first.quic.local_addr()?.port();
            let mut run = vec![first];
            for p in 1..n {
                let Some(next) = port.checked_add(p as u16) else {
                    break;
                };
                match ReplicaSockets::bind(&format!("127.0.0.1:{next}"), "127.0.0.1:0", id) {
                    Ok(s) => run.push(s),
                    Err(_) => break,
                }
            }
            if run.len() == n as usize {
                return Ok(run);
            }
        }
        anyhow::bail!("replica {id}: found no {n} consecutive free UDP ports in {TRIES} tries")
    }

    /// The recorded addresses of replica `id` (a restart keeps its ports).
    pub fn bind(address: &str, admin: &str, id: &str) -> Result<ReplicaSockets> {
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

    /// The recorded addresses of replica `id`, just stopped: as [`ReplicaSockets::bind`],
    /// retrying for up to 5 s while the stopped process's sockets are still being
    /// released by the kernel.
    pub fn rebind(address: &str, admin: &str, id: &str) -> Result<ReplicaSockets> {
        let started = Instant::now();
        loop {
            match ReplicaSockets::bind(address, admin, id) {
                Ok(s) => return Ok(s),
                Err(e) if started.elapsed() > Duration::from_secs(5) => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    pub fn addresses(&self) -> Result<(String, String)> {
        Ok((
            self.quic.local_addr()?.to_string(),
            self.admin.local_addr()?.to_string(),
        ))
    }
}

/// Starts a local cluster and returns its cluster file (also written to DIR).
pub fn up(o: &UpOptions) -> Result<ClusterFile> {
    let deployment = load(&o.topology, o.placement.as_deref())?;
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
    let operator = CLUSTER_OPERATOR;
    if !pangea_net::certs::operator_cert_path(&certs, operator).exists() {
        pangea_net::certs::issue_operator(&certs, operator)?;
    }
    // Addresses: reuse the ports of an earlier run of this directory when possible,
    // so data directories and cluster files stay valid across restarts.
    let earlier = ClusterFile::load(&cluster_path(&dir)).ok();
    let mut replicas = Vec::new();
    let mut sockets = Vec::new();
    // A replica's processes listen on consecutive ports (process p on the
    // replica's port + p), so they are bound together.
    for r in deployment
        .topology
        .replicas
        .values()
        .filter(|r| r.index == 0)
    {
        let ids: Vec<_> = (0..r.processes)
            .map(|p| pangea_topology::process_id(r.id.as_str(), p))
            .collect();
        let before: Option<Vec<_>> = ids
            .iter()
            .map(|id| earlier.as_ref().and_then(|c| c.replica(id.as_str())))
            .collect();
        let bound = match before {
            Some(before) => before
                .iter()
                .map(|b| ReplicaSockets::bind(&b.address, &b.admin, &b.id))
                .collect::<Result<Vec<_>>>()?,
            None => ReplicaSockets::fresh_run(r.processes, r.id.as_str())?,
        };
        for (id, bound) in ids.iter().zip(bound) {
            replicas.push(record(&dir, id.as_str(), r.region.as_str(), &bound)?);
            sockets.push(bound);
        }
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
    // A start that fails leaves nothing of its own running: the replicas it
    // started are stopped before the error is returned.
    let mut started: Vec<(String, u32)> = Vec::new();
    let cluster = ClusterFile {
        name: deployment.topology.name,
        topology,
        placement,
        certs,
        emulate_wan: o.emulate_wan,
        fault_injection: o.fault_injection,
        replicas,
    };
    let result = start_all(o, &dir, cluster, sockets, earlier.is_none(), &mut started);
    if result.is_err() && !started.is_empty() {
        terminate(&started, Duration::from_secs(2));
    }
    result
}

/// `up`'s second half: starts `cluster`'s replicas on `sockets`, records them in
/// its cluster file and waits for them to turn healthy; `started` gets each as it
/// starts.
fn start_all(
    o: &UpOptions,
    dir: &Path,
    mut cluster: ClusterFile,
    sockets: Vec<ReplicaSockets>,
    new_cluster: bool,
    started: &mut Vec<(String, u32)>,
) -> Result<ClusterFile> {
    for (r, sockets) in cluster.replicas.iter_mut().zip(sockets) {
        r.pid = Some(
            spawn_replica(
                &o.binary,
                &cluster.topology,
                cluster.placement.as_deref(),
                &cluster.certs,
                r,
                sockets,
                StartFlags {
                    emulate_wan: o.emulate_wan,
                    fault_injection: o.fault_injection,
                    durability: o.durability,
                    // A directory this command has not run a cluster in yet.
                    new_cluster,
                },
                &[],
            )?
            .id(),
        );
        started.extend(r.pid.map(|p| (r.id.clone(), p)));
    }
    cluster
        .save(&cluster_path(dir))
        .map_err(anyhow::Error::msg)?;
    // Wait for every replica to report healthy.
    for r in &cluster.replicas {
        wait_healthy(r, HEALTH_WAIT, &mut |_| {})?;
    }
    Ok(cluster)
}

/// The cluster file's record of replica `id` of `region` in the cluster directory
/// `dir`, on `sockets` (not started yet).
pub fn record(
    dir: &Path,
    id: &str,
    region: &str,
    sockets: &ReplicaSockets,
) -> Result<ClusterReplica> {
    let (address, admin) = sockets.addresses()?;
    Ok(ClusterReplica {
        id: id.to_owned(),
        region: region.to_owned(),
        address,
        admin,
        data_dir: dir.join("replicas").join(id),
        pid: None,
        log: Some(dir.join("logs").join(format!("{id}.log"))),
    })
}

/// The topology text with every replica's `address` set from `replicas` (comments and
/// layout kept).
pub fn fill_addresses(text: &str, replicas: &[ClusterReplica]) -> Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("topology")?;
    let addr_of = |id: &str| {
        replicas
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.address.clone())
    };
    for_each_replica(&mut doc, |rep| {
        let id = rep
            .get("id")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        if let Some(a) = addr_of(&id) {
            rep["address"] = toml_edit::value(a);
        }
    });
    Ok(doc.to_string())
}

/// Calls `f` on every `[[continents.regions.replicas]]` table of a topology
/// document, in file order.
pub fn for_each_replica(
    doc: &mut toml_edit::DocumentMut,
    mut f: impl FnMut(&mut toml_edit::Table),
) {
    let Some(continents) = doc
        .get_mut("continents")
        .and_then(|c| c.as_array_of_tables_mut())
    else {
        return;
    };
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
                f(rep);
            }
        }
    }
}

/// Starts one replica process as `cluster up` does (its own process group, log file
/// appended to when `append`) on `sockets`, which must be bound to `r`'s addresses.
/// `env`: environment variables for this start only. Returns its process.
#[allow(clippy::too_many_arguments)]
pub fn spawn_replica(
    binary: &Path,
    topology: &Path,
    placement: Option<&Path>,
    certs: &Path,
    r: &ClusterReplica,
    sockets: ReplicaSockets,
    flags: StartFlags,
    env: &[(&str, &str)],
) -> Result<std::process::Child> {
    let log_path = r.log.as_ref().context("replica without a log file")?;
    // Appended to, never truncated: a restart's log follows the one before it.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)?;
    let mut cmd = Command::new(binary);
    cmd.envs(env.iter().copied());
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
        .arg(flags.durability.as_str());
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
    cmd.spawn()
        .with_context(|| format!("starting replica {}", r.id))
}

/// Starts replica `id` of the cluster in `path` again on its recorded addresses
/// (after a crash or a kill), appending to its log, and records its new pid in the
/// cluster file. Its ports are taken back at once; for a few seconds after a kill
/// the kernel may still hold them, so binding is retried.
pub fn restart_replica(binary: &Path, path: &Path, id: &str) -> Result<u32> {
    let mut cluster = ClusterFile::load(path).map_err(anyhow::Error::msg)?;
    let r = cluster
        .replica(id)
        .with_context(|| format!("replica {id} is not in {}", path.display()))?
        .clone();
    let sockets = ReplicaSockets::rebind(&r.address, &r.admin, id)?;
    let pid = spawn_replica(
        binary,
        &cluster.topology,
        cluster.placement.as_deref(),
        &cluster.certs,
        &r,
        sockets,
        StartFlags::of(&cluster),
        &[],
    )?
    .id();
    if let Some(rep) = cluster.replicas.iter_mut().find(|x| x.id == id) {
        rep.pid = Some(pid);
    }
    cluster.save(path).map_err(anyhow::Error::msg)?;
    Ok(pid)
}

/// Waits until a replica's admin endpoint reports healthy; `on_phase` hears each
/// new readiness phase it reports meanwhile (a replica catching up says how far it
/// is).
pub fn wait_healthy(
    r: &ClusterReplica,
    limit: Duration,
    on_phase: &mut dyn FnMut(&str),
) -> Result<()> {
    let admin = Admin::new(&r.admin)?;
    let started = Instant::now();
    let mut shown = String::new();
    loop {
        match admin.health() {
            Ok((true, _)) => return Ok(()),
            Ok((false, h)) => {
                let phase = h.detail["phase"].as_str().unwrap_or_default();
                if !phase.is_empty() && phase != shown {
                    on_phase(phase);
                    shown = phase.to_owned();
                }
            }
            Err(_) => {}
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

pub fn alive(pid: u32) -> bool {
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // A zombie still answers signal 0; a reaped or dead process does not.
    kill(Pid::from_raw(pid), None).is_ok() && !is_zombie(pid)
}

/// Whether `pid` has exited and only its exit status is left. The leader of a
/// threaded process turns `Z` as soon as *it* exits, while its other threads may
/// still be tearing down and holding the shared file table (its sockets, its
/// ports); the process is gone only when no thread but the leader is listed.
fn is_zombie(pid: i32) -> bool {
    let leader_exited = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    leader_exited && threads <= 1
}

pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), sig);
    }
}

/// Ends `pids`: SIGTERM, then SIGKILL for those still alive after `grace`.
/// Returns the ids that had to be killed.
pub fn terminate(pids: &[(String, u32)], grace: Duration) -> Vec<String> {
    use nix::sys::signal::Signal;
    for (_, pid) in pids {
        signal(*pid, Signal::SIGTERM);
    }
    let started = Instant::now();
    while pids.iter().any(|(_, p)| alive(*p)) && started.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut killed = Vec::new();
    for (id, pid) in pids {
        if alive(*pid) {
            signal(*pid, Signal::SIGKILL);
            killed.push(id.clone());
        }
    }
    killed
}

/// What `down` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub cluster: String,
    /// Replicas that were running.
    pub replicas: usize,
    /// Those killed after the grace period.
    pub killed: Vec<String>,
}

/// Stops every replica of the cluster in `dir` (SIGTERM, SIGKILL after `grace`).
pub fn down(dir: &Path, grace: Duration) -> Result<Stopped> {
    let cluster = ClusterFile::load(&cluster_path(dir)).map_err(anyhow::Error::msg)?;
    let pids: Vec<(String, u32)> = cluster
        .replicas
        .iter()
        .filter_map(|r| r.pid.map(|p| (r.id.clone(), p)))
        .collect();
    let killed = terminate(&pids, grace);
    Ok(Stopped {
        cluster: cluster.name,
        replicas: pids.len(),
        killed,
    })
}

/// A local cluster this process starts for itself (`sim calibrate`'s live runs):
/// stopped when the guard drops — an error, a panic — and when the process is
/// interrupted (SIGINT, SIGTERM), which runs no destructor. Its replicas run in
/// process groups of their own (`spawn_replica`), so without this a Ctrl-C would
/// leave them running, serving and loading the machine. Take it before `up`:
/// only a cluster file written after it was taken is stopped (never a cluster
/// that already ran there, which `up` refuses), and a failed `up` stops what it
/// started itself. A temporary directory (`remove`) is removed at the end.
#[derive(Debug)]
pub struct StopOnExit {
    dir: PathBuf,
    remove: bool,
    since: std::time::SystemTime,
}

/// The clusters to stop if the process is interrupted (`StopOnExit`): directory,
/// whether to remove it, and since when the guard holds it.
type Owned = Vec<(PathBuf, bool, std::time::SystemTime)>;
static OWNED: std::sync::Mutex<Owned> = std::sync::Mutex::new(Vec::new());
/// Held while a guard's clusters are being stopped, by a drop or by the signal's
/// thread: the signal waits for a drop's stop to finish before it ends the
/// process.
static STOPPING: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// Set once SIGINT or SIGTERM arrived.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl StopOnExit {
    /// Guards the cluster to be started in `dir`. Fails only if the signal
    /// handlers cannot be installed.
    pub fn new(dir: PathBuf, remove: bool) -> Result<StopOnExit> {
        stop_owned_on_signal()?;
        let since = std::time::SystemTime::now();
        OWNED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((dir.clone(), remove, since));
        Ok(StopOnExit { dir, remove, since })
    }
}

impl Drop for StopOnExit {
    fn drop(&mut self) {
        // Interrupted: the signal's thread stops every guarded cluster and ends
        // the process as the signal would; this thread (whose run is failing as
        // its replicas go) must not end it first with an error of its own.
        if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            park_forever();
        }
        {
            // A signal now waits for this stop to finish.
            let _stopping = STOPPING.lock().unwrap_or_else(|p| p.into_inner());
            stop_owned(&self.dir, self.remove, self.since);
            OWNED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(d, _, _)| *d != self.dir);
        }
        if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            park_forever();
        }
    }
}

fn park_forever() -> ! {
    loop {
        std::thread::park();
    }
}

/// Stops the cluster in `dir` if its cluster file was written since `since`
/// (this run's), and removes `dir` if `remove`. Writes to stderr without
/// failing: a closed stderr (Ctrl-C in `... | tee log`) must not stop it.
fn stop_owned(dir: &Path, remove: bool, since: std::time::SystemTime) {
    use std::io::Write as _;
    // `up` writes the cluster file after starting every replica, well after the
    // guard was taken (coarse file times lag the clock by a few ms at most).
    let ours = std::fs::metadata(cluster_path(dir))
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since);
    if ours && let Err(e) = down(dir, Duration::from_secs(10)) {
        let _ = writeln!(
            std::io::stderr(),
            "stopping the live cluster in {}: {e:#}",
            dir.display()
        );
        return;
    }
    if remove {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Once per process: a thread that, on SIGINT or SIGTERM, stops every cluster a
/// `StopOnExit` guards and exits as the signal would (128 + its number).
fn stop_owned_on_signal() -> Result<()> {
    static INSTALLED: std::sync::OnceLock<std::result::Result<(), String>> =
        std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            use tokio::signal::unix::{SignalKind, signal};
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .map_err(|e| e.to_string())?;
            // Installed here, before the guard is handed out: from now on the
            // signals reach the thread instead of ending the process.
            let (mut int, mut term) = {
                let _in = runtime.enter();
                (
                    signal(SignalKind::interrupt()).map_err(|e| e.to_string())?,
                    signal(SignalKind::terminate()).map_err(|e| e.to_string())?,
                )
            };
            std::thread::Builder::new()
                .name("pangea-signals".into())
                .spawn(move || {
                    use std::io::Write as _;
                    let code = runtime.block_on(async {
                        tokio::select! {
                            _ = int.recv() => 128 + 2,
                            _ = term.recv() => 128 + 15,
                        }
                    });
                    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
                    let _stopping = STOPPING.lock().unwrap_or_else(|p| p.into_inner());
                    let owned =
                        std::mem::take(&mut *OWNED.lock().unwrap_or_else(|p| p.into_inner()));
                    for (dir, remove, since) in owned {
                        let _ = writeln!(
                            std::io::stderr(),
                            "interrupted: stopping the live cluster in {}",
                            dir.display()
                        );
                        stop_owned(&dir, remove, since);
                    }
                    std::process::exit(code);
                })
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| anyhow::anyhow!("cannot watch for SIGINT and SIGTERM: {e}"))
}

/// Stops replicas `ids` of the cluster in `dir`, as `down` stops them all, and
/// records them as stopped. Returns those killed after the grace period.
pub fn stop(dir: &Path, ids: &[String], grace: Duration) -> Result<Vec<String>> {
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
    let killed = terminate(&pids, grace);
    for r in cluster.replicas.iter_mut().filter(|r| ids.contains(&r.id)) {
        r.pid = None;
    }
    cluster.save(&path).map_err(anyhow::Error::msg)?;
    Ok(killed)
}

/// Starts replicas `ids` (none: every replica not running) of the cluster in
/// `dir` on their recorded addresses and data with `binary`, and waits until each
/// is healthy (`on_phase` hears their readiness phases: replica, phase). Returns
/// the replicas started, as recorded.
pub fn start(
    binary: &Path,
    dir: &Path,
    ids: &[String],
    on_phase: &mut dyn FnMut(&str, &str),
) -> Result<Vec<ClusterReplica>> {
    let path = cluster_path(dir);
    let cluster = ClusterFile::load(&path).map_err(anyhow::Error::msg)?;
    for id in ids {
        anyhow::ensure!(
            cluster.replica(id).is_some(),
            "replica {id:?} is not in {}",
            path.display()
        );
    }
    let todo: Vec<ClusterReplica> = cluster
        .replicas
        .iter()
        .filter(|r| ids.is_empty() || ids.contains(&r.id))
        .filter(|r| !r.pid.is_some_and(alive))
        .cloned()
        .collect();
    let mut started = Vec::new();
    for r in &todo {
        let pid = restart_replica(binary, &path, &r.id)?;
        started.push(ClusterReplica {
            pid: Some(pid),
            ..r.clone()
        });
    }
    for r in &started {
        wait_healthy(r, HEALTH_WAIT, &mut |phase| on_phase(&r.id, phase))?;
    }
    Ok(started)
}
