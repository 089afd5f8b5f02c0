//! Harness for tests on real replica processes: a local cluster that always stops,
//! a raw QUIC client for requests the client library would never send, and the
//! admin endpoint over plain HTTP.
//!
//! Every wait here has a deadline, so a broken node fails a test instead of hanging
//! it, and [`Cluster`]'s `Drop` stops every process it knows of, also when the test
//! panics: `pangea cluster down --grace-ms 2000`, then SIGKILL of every pid still in
//! the cluster file, then of replicas the test restarted itself.
//!
//! Debugging: with `PANGEA_TEST_KEEP=1` the cluster directory (logs, data,
//! certificates) is kept after the test and its path printed; `PANGEA_LOG` reaches
//! the replicas (e.g. `info,pangea_node=debug`).

#![allow(dead_code, unreachable_pub)]

use anyhow::{Context, Result, anyhow, bail, ensure};
use pangea_net::{FRAME_BYTES_MAX, certs, read_frame, tls, write_frame};
use pangea_ops::local;
use pangea_proto::v1 as pb;
use pangea_topology::cluster::{ClusterFile, ClusterReplica};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `pangea` binary built for these tests.
pub const PANGEA: &str = env!("CARGO_BIN_EXE_pangea");

/// Longest `pangea cluster up` may take (it comes up in about a second).
pub const UP_TIME_MAX: Duration = Duration::from_secs(30);
/// Grace period the clean-up gives replicas before SIGKILL.
pub const CLEANUP_GRACE_MS: u64 = 2_000;
/// Bound on one QUIC request made by the raw client.
pub const CALL_TIME_MAX: Duration = Duration::from_secs(5);

/// The regions of topology/local-3-regions.toml.
pub const US: &str = "us-east-1";
pub const EU: &str = "eu-west-1";
pub const AP: &str = "ap-northeast-1";

pub fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// The tests' tokio runtime: two worker threads, timers and I/O.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Runs `pangea cluster nemesis --cluster C ARGS --history H` on `cluster`
/// (bounded to 300 s), writing the history to `DIR/history.jsonl`; its stdout
/// and the history's path, or an error with both outputs if it failed.
pub fn nemesis(cluster: &Cluster, args: &[&str]) -> Result<(String, PathBuf)> {
    let path = cluster.cluster_path();
    let history = cluster.dir.path().join("history.jsonl");
    let mut all = vec!["cluster", "nemesis", "--cluster"];
    all.push(path.to_str().context("path")?);
    all.extend_from_slice(args);
    all.push("--history");
    all.push(history.to_str().context("path")?);
    let out = pangea(&all, Duration::from_secs(300))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "nemesis failed:\n{stdout}\n{stderr}");
    Ok((stdout, history))
}

/// Runs `pangea ARGS`, killing it after `limit`.
pub fn pangea(args: &[&str], limit: Duration) -> Result<Output> {
    pangea_env(args, &[], limit)
}

/// Runs `pangea ARGS` with extra environment variables (its children inherit them),
/// killing it after `limit`.
pub fn pangea_env(args: &[&str], env: &[(String, String)], limit: Duration) -> Result<Output> {
    let mut child = Command::new(PANGEA)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running pangea")?;
    let started = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            return Ok(child.wait_with_output()?);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            bail!(
                "`pangea {}` did not finish within {limit:?}; stderr:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` is running (not a zombie): `pangea_ops::local::alive`.
pub use pangea_ops::local::alive;

/// SIGKILL to `pid`.
pub fn sigkill(pid: u32) {
    local::signal(pid, nix::sys::signal::Signal::SIGKILL);
}

/// A local cluster of topology/local-3-regions.toml in a temporary directory. Dropping
/// it stops every replica (see the module documentation).
pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// The cluster file as last loaded (restarts update it).
    pub file: ClusterFile,
    /// Replicas this test restarted itself (its children: reaped on drop).
    restarted: Vec<Child>,
    /// The topology and placement files (relative to the repository root).
    topology: String,
    placement: String,
    /// Extra environment of `pangea cluster up`, which its replicas inherit.
    env: Vec<(String, String)>,
}

impl Cluster {
    /// `pangea cluster up topology/local-3-regions.toml --placement … [--emulate-wan]`.
    pub fn up(emulate_wan: bool) -> Result<Cluster> {
        Cluster::up_with(
            "topology/local-3-regions.toml",
            "topology/local-3-regions.placement.toml",
            emulate_wan,
        )
    }

    /// A local cluster of any topology and placement (paths from the repository root).
    pub fn up_with(topology: &str, placement: &str, emulate_wan: bool) -> Result<Cluster> {
        Cluster::up_with_env(topology, placement, emulate_wan, vec![])
    }

    /// [`Cluster::up`] with runtime fault injection on (`--fault-injection`), for
    /// `pangea cluster nemesis`.
    pub fn up_with_faults(emulate_wan: bool) -> Result<Cluster> {
        Cluster::up_inner(
            "topology/local-3-regions.toml",
            "topology/local-3-regions.placement.toml",
            emulate_wan,
            true,
            vec![],
        )
    }

    /// [`Cluster::up_with`] with runtime fault injection on, for `pangea cluster
    /// nemesis`.
    pub fn up_with_faults_of(topology: &str, placement: &str) -> Result<Cluster> {
        Cluster::up_inner(topology, placement, false, true, vec![])
    }

    /// [`Cluster::up_with`] whose replicas run with extra environment variables.
    pub fn up_with_env(
        topology: &str,
        placement: &str,
        emulate_wan: bool,
        env: Vec<(String, String)>,
    ) -> Result<Cluster> {
        Cluster::up_inner(topology, placement, emulate_wan, false, env)
    }

    fn up_inner(
        topology: &str,
        placement: &str,
        emulate_wan: bool,
        fault_injection: bool,
        env: Vec<(String, String)>,
    ) -> Result<Cluster> {
        let dir = tempfile::Builder::new().prefix("pangea-node-").tempdir()?;
        let mut cluster = Cluster {
            file: ClusterFile {
                name: String::new(),
                topology: PathBuf::new(),
                placement: None,
                certs: PathBuf::new(),
                emulate_wan,
                fault_injection,
                replicas: vec![],
            },
            dir,
            restarted: vec![],
            topology: topology.to_owned(),
            placement: placement.to_owned(),
            env,
        };
        cluster.start(emulate_wan)?;
        Ok(cluster)
    }

    /// (Re)starts the cluster in this directory (`cluster up` reuses its ports).
    pub fn start(&mut self, emulate_wan: bool) -> Result<Duration> {
        let topology = repo_file(&self.topology);
        let placement = repo_file(&self.placement);
        let dir = self
            .dir
            .path()
            .to_str()
            .context("temp dir path")?
            .to_owned();
        let mut args = vec![
            "cluster",
            "up",
            topology.to_str().context("path")?,
            "--placement",
            placement.to_str().context("path")?,
            "--data-dir",
            &dir,
        ];
        if emulate_wan {
            args.push("--emulate-wan");
        }
        if self.file.fault_injection {
            args.push("--fault-injection");
        }
        let started = Instant::now();
        let out = pangea_env(&args, &self.env, UP_TIME_MAX);
        // Whatever happened, learn the pids so that Drop can stop them.
        let _ = self.reload();
        let out = out?;
        ensure!(
            out.status.success(),
            "cluster up failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.reload()?;
        ensure!(
            !self.file.replicas.is_empty(),
            "no replicas in the cluster file"
        );
        Ok(started.elapsed())
    }

    pub fn cluster_path(&self) -> PathBuf {
        self.dir.path().join("cluster.toml")
    }

    pub fn reload(&mut self) -> Result<()> {
        self.file = ClusterFile::load(&self.cluster_path()).map_err(|e| anyhow!(e))?;
        Ok(())
    }

    pub fn replica(&self, id: &str) -> Result<&ClusterReplica> {
        self.file
            .replica(id)
            .with_context(|| format!("no replica {id} in the cluster file"))
    }

    pub fn addr(&self, id: &str) -> Result<SocketAddr> {
        Ok(self.replica(id)?.address.parse()?)
    }

    pub fn pid(&self, id: &str) -> Result<u32> {
        self.replica(id)?.pid.context("no pid")
    }

    pub fn ids(&self) -> Vec<String> {
        self.file.replicas.iter().map(|r| r.id.clone()).collect()
    }

    pub fn ids_in(&self, region: &str) -> Vec<String> {
        self.file
            .replicas
            .iter()
            .filter(|r| r.region == region)
            .map(|r| r.id.clone())
            .collect()
    }

    pub fn region_of(&self, id: &str) -> Option<&str> {
        self.file.replica(id).map(|r| r.region.as_str())
    }

    /// SIGKILL one replica and wait until it is gone.
    pub fn kill9(&self, id: &str) -> Result<()> {
        let pid = self.pid(id)?;
        sigkill(pid);
        let until = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            ensure!(Instant::now() < until, "replica {id} survived SIGKILL");
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Starts replica `id` again exactly as `pangea cluster up` does (same topology,
    /// placement, data directory, certificates, admin address, durability; the QUIC
    /// address comes from the topology), appending to its log, and records its new
    /// pid in the cluster file so that `cluster down` stops it.
    pub fn restart(&mut self, id: &str) -> Result<u32> {
        self.restart_with_env(id, &[])
    }

    /// As [`Cluster::restart`], with extra environment variables for this start
    /// only (e.g. `PANGEA_CLOCK_OFFSET_MS` to skew its clock).
    pub fn restart_with_env(&mut self, id: &str, extra: &[(&str, &str)]) -> Result<u32> {
        let r = self.replica(id)?.clone();
        // Its sockets bound here and handed down, as `cluster up` does: the ports it
        // had are taken back as soon as the kernel has released them (a clear error
        // if another process got one).
        let sockets = local::ReplicaSockets::rebind(&r.address, &r.admin, id)?;
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(extra.iter().copied())
            .collect();
        let child = local::spawn_replica(
            Path::new(PANGEA),
            &self.file.topology,
            self.file.placement.as_deref(),
            &self.file.certs,
            &r,
            sockets,
            local::StartFlags::of(&self.file),
            &env,
        )
        .with_context(|| format!("restarting {id}"))?;
        let pid = child.id();
        self.restarted.push(child);
        if let Some(rep) = self.file.replicas.iter_mut().find(|x| x.id == id) {
            rep.pid = Some(pid);
        }
        self.file
            .save(&self.cluster_path())
            .map_err(|e| anyhow!(e))?;
        Ok(pid)
    }

    /// `pangea cluster down --data-dir D --grace-ms G`.
    pub fn down(&self, grace_ms: u64) -> Result<Output> {
        let dir = self.dir.path().to_str().context("temp dir path")?;
        pangea(
            &[
                "cluster",
                "down",
                "--data-dir",
                dir,
                "--grace-ms",
                &grace_ms.to_string(),
            ],
            Duration::from_millis(grace_ms) + Duration::from_secs(10),
        )
    }

    /// The last lines of a replica's log, for failure messages.
    pub fn log_tail(&self, id: &str, lines: usize) -> String {
        let text = self
            .file
            .replica(id)
            .and_then(|r| r.log.as_ref())
            .and_then(|l| std::fs::read_to_string(l).ok())
            .unwrap_or_default();
        let v: Vec<&str> = text.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }

    /// A client of the library, acting from `region` for `app_profile`.
    pub async fn client(&self, region: &str, app_profile: &str) -> Result<pangea_client::Client> {
        let config = pangea_client::ClientConfig::from_cluster(&self.file, region, app_profile)?;
        Ok(tokio::time::timeout(
            Duration::from_secs(10),
            pangea_client::Client::connect(config),
        )
        .await
        .context("client connect timed out")??)
    }

    /// A client acting as the cluster's operator (`operators/operator`, which
    /// `pangea cluster up` issues), from `region`.
    pub async fn operator(&self, region: &str) -> Result<pangea_client::Client> {
        let config = pangea_client::ClientConfig::from_cluster(&self.file, region, "frontend")?
            .with_credential(pangea_client::Credential::Operator("operator".into()));
        Ok(tokio::time::timeout(
            Duration::from_secs(10),
            pangea_client::Client::connect(config),
        )
        .await
        .context("operator connect timed out")??)
    }

    /// A raw QUIC client presenting the cluster's `client-<app_profile>` certificate.
    pub fn raw_client(&self, app_profile: &str) -> Result<RawClient> {
        let ca = certs::load_ca(&self.file.certs)?;
        let own = certs::load_client(&self.file.certs, &format!("client-{app_profile}"))?;
        RawClient::new(tls::client_config(&ca, own)?)
    }

    /// The app profile that may use replica `id` (batch replicas serve only
    /// `batch-training`).
    pub fn profile_for(id: &str) -> &'static str {
        if id.contains("batch") {
            "batch-training"
        } else {
            "frontend"
        }
    }

    /// `GET path` on a replica's admin endpoint.
    pub fn admin_get(&self, id: &str, path: &str) -> Result<(u16, String)> {
        http_get(&self.replica(id)?.admin, path)
    }

    /// Every live pid of the cluster file.
    pub fn live_pids(&self) -> Vec<(String, u32)> {
        let file = ClusterFile::load(&self.cluster_path()).unwrap_or_else(|_| self.file.clone());
        file.replicas
            .iter()
            .filter_map(|r| r.pid.map(|p| (r.id.clone(), p)))
            .filter(|(_, p)| alive(*p))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.cluster_path().exists() {
            let _ = self.down(CLEANUP_GRACE_MS);
            // Last resort: anything the cluster file names that is still running.
            for (_, pid) in self.live_pids() {
                sigkill(pid);
            }
        }
        for child in &mut self.restarted {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Debugging aid: PANGEA_TEST_KEEP=1 keeps the directory (logs, data).
        if std::env::var_os("PANGEA_TEST_KEEP").is_some()
            && let Ok(spare) = tempfile::tempdir()
        {
            let dir = std::mem::replace(&mut self.dir, spare);
            eprintln!("kept {}", dir.keep().display());
        }
    }
}

/// `GET path` on an admin endpoint (`pangea_ops::admin`): (status, body).
pub fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let a = pangea_ops::admin::Admin::new(addr)?.get(path)?;
    Ok((a.status, a.body))
}

/// `POST path` (no body) on an admin endpoint: the status and the body.
pub fn http_post(addr: &str, path: &str) -> Result<(u16, String)> {
    let a = pangea_ops::admin::Admin::new(addr)?.post(path)?;
    Ok((a.status, a.body))
}

/// The value of one series in a Prometheus exposition (0 when absent).
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(series))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|v| v.parse::<f64>().ok())
        .next()
        .unwrap_or(0.0)
}

/// A replica's applied sequence per origin in `scope`, from its admin `/watermarks`.
pub fn admin_watermarks(
    admin: &str,
    scope: &str,
) -> Result<std::collections::BTreeMap<String, u64>> {
    let w = pangea_ops::admin::Admin::new(admin)?.watermarks()?;
    Ok(w.scopes
        .into_iter()
        .filter(|s| s.scope == scope)
        .flat_map(|s| s.origins)
        .map(|(origin, o)| (origin, o.sequence))
        .collect())
}

/// A QUIC endpoint that dials replicas with a configuration the test chooses and
/// speaks the client protocol by hand.
pub struct RawClient {
    pub endpoint: quinn::Endpoint,
}

impl RawClient {
    pub fn new(config: quinn::ClientConfig) -> Result<RawClient> {
        let endpoint = pangea_net::bind_endpoint(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            None,
            config,
            None,
            None,
        )?;
        Ok(RawClient { endpoint })
    }

    /// Connects to replica `id` at `addr` (TLS server name as the client library uses).
    pub async fn connect(&self, addr: SocketAddr, id: &str) -> Result<quinn::Connection> {
        let connecting = self.endpoint.connect(addr, tls::server_name(id))?;
        Ok(tokio::time::timeout(CALL_TIME_MAX, connecting)
            .await
            .context("handshake timed out")??)
    }
}

/// One request on its own stream, one response.
pub async fn call(conn: &quinn::Connection, req: &pb::ClientRequest) -> Result<pb::ClientResponse> {
    tokio::time::timeout(CALL_TIME_MAX, async {
        let (mut send, mut recv) = conn.open_bi().await?;
        write_frame(&mut send, req).await?;
        let _ = send.finish();
        read_frame::<pb::ClientResponse>(&mut recv, FRAME_BYTES_MAX)
            .await?
            .context("stream closed without a response")
    })
    .await
    .context("request timed out")?
}

/// Raw bytes on a new request stream; the response, if the replica sent one.
pub async fn call_bytes(
    conn: &quinn::Connection,
    bytes: &[u8],
) -> Result<Option<pb::ClientResponse>> {
    tokio::time::timeout(CALL_TIME_MAX, async {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(bytes).await?;
        let _ = send.finish();
        Ok(read_frame::<pb::ClientResponse>(&mut recv, FRAME_BYTES_MAX).await?)
    })
    .await
    .context("request timed out")?
}

pub fn request(
    app_profile: &str,
    deadline_us: u64,
    r: pb::client_request::Request,
) -> pb::ClientRequest {
    pb::ClientRequest {
        deadline_us,
        app_profile: app_profile.to_owned(),
        traceparent: String::new(),
        known_watermarks: 0,
        request: Some(r),
    }
}

pub fn get_request(
    table: &str,
    key: &[u8],
    consistency: Option<pb::Consistency>,
) -> pb::client_request::Request {
    pb::client_request::Request::Get(pb::GetRequest {
        table: table.to_owned(),
        row_key: key.to_vec().into(),
        filter: None,
        consistency,
    })
}

pub fn set_cell(
    table: &str,
    key: &[u8],
    family: &str,
    column: &[u8],
    value: Vec<u8>,
) -> pb::client_request::Request {
    pb::client_request::Request::Mutate(pb::MutateRequest {
        mutation: Some(pb::RowMutation {
            event_time_ms: None,
            table: table.to_owned(),
            row_key: key.to_vec().into(),
            mutations: vec![pb::Mutation {
                kind: Some(pb::mutation::Kind::SetCell(pb::mutation::SetCell {
                    family: family.to_owned(),
                    column: column.to_vec().into(),
                    value: value.into(),
                })),
            }],
        }),
        ..Default::default()
    })
}

/// A raw `Increment` of counter `family`:`column` of `table`/`key` by `delta`.
pub fn increment(
    table: &str,
    key: &[u8],
    family: &str,
    column: &[u8],
    delta: i64,
) -> pb::client_request::Request {
    pb::client_request::Request::Mutate(pb::MutateRequest {
        mutation: Some(pb::RowMutation {
            event_time_ms: None,
            table: table.to_owned(),
            row_key: key.to_vec().into(),
            mutations: vec![pb::Mutation {
                kind: Some(pb::mutation::Kind::Increment(pb::mutation::Increment {
                    family: family.to_owned(),
                    column: column.to_vec().into(),
                    delta,
                })),
            }],
        }),
        ..Default::default()
    })
}

/// Options for the writes that set a test up (rows to read, authorize or audit
/// later): a generous deadline, since the test judges something else and the
/// default 200 ms budget is a latency target, which a CI machine running other
/// tests beside it can miss (an `Ambiguous` write failed a setup that way).
pub fn setup_writes() -> pangea_client::WriteOptions {
    pangea_client::WriteOptions {
        deadline: Some(std::time::Duration::from_secs(10)),
        ..Default::default()
    }
}

/// A write of `value` into `profile:p` of `ad_profiles` row `key` (the tests' rows).
pub fn profile_set(
    key: impl Into<String>,
    value: impl Into<bytes::Bytes>,
) -> Result<pangea_client::RowMutation> {
    Ok(pangea_client::RowMutation::new(
        "ad_profiles",
        key.into(),
        vec![pangea_client::Mutation::SetCell {
            family: "profile".into(),
            column: bytes::Bytes::from_static(b"p"),
            value: value.into(),
        }],
        &pangea_core::Limits::default(),
    )?)
}

/// The error of a response, if it is one.
pub fn error_of(resp: &pb::ClientResponse) -> Option<(pb::error::Code, &str)> {
    match &resp.response {
        Some(pb::client_response::Response::Error(e)) => Some((
            pb::error::Code::try_from(e.code).unwrap_or(pb::error::Code::Unspecified),
            e.message.as_str(),
        )),
        _ => None,
    }
}

/// The first cell value of family `family`, column `column` of a row.
pub fn cell_value<'a>(row: &'a pb::Row, family: &str, column: &[u8]) -> Option<&'a [u8]> {
    row.families
        .iter()
        .filter(|f| f.name == family)
        .flat_map(|f| f.cells.iter())
        .find(|c| c.column.as_ref() == column)
        .map(|c| c.value.as_ref())
}

/// Polls `f` every `every` until it returns `Some`, or fails after `limit`.
pub async fn eventually<T, F, Fut>(
    limit: Duration,
    every: Duration,
    what: &str,
    mut f: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let until = tokio::time::Instant::now() + limit;
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() >= until {
            bail!("{what}: not within {limit:?} (last error: {last_err:?})");
        }
        tokio::time::sleep(every).await;
    }
}

/// An OpenTelemetry collector stand-in on 127.0.0.1: accepts OTLP/HTTP posts (one
/// thread per connection, keep-alive), answers 200 and keeps every request body, so a
/// test can search what replicas exported. Stops (and joins its threads) on drop.
pub struct OtlpSink {
    pub addr: SocketAddr,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    /// Requests it could not parse (no content-length, a bad head): should stay 0.
    malformed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl OtlpSink {
    pub fn start() -> Result<OtlpSink> {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let malformed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (b, m, st) = (bodies.clone(), malformed.clone(), stop.clone());
        let acceptor = std::thread::spawn(move || {
            let mut connections = Vec::new();
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (b, m, st) = (b.clone(), m.clone(), st.clone());
                        connections.push(std::thread::spawn(move || {
                            serve_otlp(stream, &b, &m, &st);
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            for c in connections {
                let _ = c.join();
            }
        });
        Ok(OtlpSink {
            addr,
            bodies,
            malformed,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// The base URL to put in `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every body received so far.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.bodies.lock().map(|b| b.clone()).unwrap_or_default()
    }

    pub fn malformed(&self) -> usize {
        self.malformed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// One keep-alive connection of [`OtlpSink`]: requests with a content-length body.
fn serve_otlp(
    mut stream: TcpStream,
    bodies: &std::sync::Mutex<Vec<Vec<u8>>>,
    malformed: &std::sync::atomic::AtomicUsize,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut got: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        // Whole requests first.
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let Some(len) = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
            else {
                malformed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            if got.len() >= end + 4 + len {
                let body = got[end + 4..end + 4 + len].to_vec();
                got.drain(..end + 4 + len);
                if let Ok(mut b) = bodies.lock() {
                    b.push(body);
                }
                let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                if stream.write_all(ok).is_err() {
                    return;
                }
                continue;
            }
        }
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}
