//! Certificate rotation on a real replica process, without restarting it:
//!
//! - a client connection authenticated by a certificate that `pangea certs revoke`
//!   revokes is closed within the replica's poll interval (1 s here), while other
//!   clients keep being served, and the revoked certificate cannot connect again;
//! - after `pangea certs reissue` of the replica's own certificate, the next
//!   handshake is served with the new certificate (its serial), by the same pid —
//!   through the poller, and, with polling off, at once on SIGHUP.
//!
//! Every wait is bounded; the only sleeps are between polls of a condition.

mod common;

use anyhow::{Context, Result, bail, ensure};
use common::*;
use pangea_net::rotation::CertInfo;
use pangea_net::{certs, tls};
use pangea_proto::v1 as pb;
use rustls::pki_types::CertificateDer;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The poll interval the replica runs with in these tests.
const POLL_MS: u64 = 1_000;
/// How long after `certs revoke` the revoked connection must be closed: one poll
/// interval plus slack for a loaded 2-core machine. (Production: 30 s interval,
/// 60 s promise.)
const CLOSE_TIME_MAX: Duration = Duration::from_millis(POLL_MS + 4_000);
/// Bound on waiting for a replica to come up, or a condition to hold.
const WAIT_MAX: Duration = Duration::from_secs(30);
const REPLICA: &str = "solo";
const REGION: &str = "local-1";
const PROFILE: &str = "frontend";

/// One `pangea start` process of topology/single-replica.toml with its own
/// certificate directory; killed (SIGTERM, then SIGKILL) when dropped.
struct Replica {
    dir: tempfile::TempDir,
    child: Child,
    addr: SocketAddr,
    admin: String,
}

impl Replica {
    /// Creates the CA, the replica's certificate and clients `c1`, `c2`, then starts
    /// the replica with `--certs-reload-interval-ms poll_ms`.
    fn start(poll_ms: u64) -> Result<Replica> {
        let dir = tempfile::Builder::new().prefix("pangea-certs-").tempdir()?;
        let certs_dir = dir.path().join("certs");
        let c = certs_dir.to_str().context("path")?;
        run(&["certs", "init", "--dir", c])?;
        run(&[
            "certs",
            "issue",
            "--dir",
            c,
            "--replica",
            REPLICA,
            "--region",
            REGION,
        ])?;
        for name in ["c1", "c2"] {
            run(&[
                "certs",
                "issue",
                "--dir",
                c,
                "--client",
                name,
                "--app-profile",
                PROFILE,
            ])?;
        }
        let addr: SocketAddr = format!(
            "127.0.0.1:{}",
            std::net::UdpSocket::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
        )
        .parse()?;
        let admin = format!(
            "127.0.0.1:{}",
            std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
        );
        let log = std::fs::File::create(dir.path().join("replica.log"))?;
        use std::os::unix::process::CommandExt;
        let child = Command::new(PANGEA)
            .arg("start")
            .arg("--topology")
            .arg(repo_file("topology/single-replica.toml"))
            .arg("--placement")
            .arg(repo_file("topology/single-replica.placement.toml"))
            .arg("--replica")
            .arg(REPLICA)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--certs")
            .arg(&certs_dir)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--admin")
            .arg(&admin)
            .arg("--durability")
            .arg("os-buffer")
            .arg("--certs-reload-interval-ms")
            .arg(poll_ms.to_string())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting pangea")?;
        let mut replica = Replica {
            dir,
            child,
            addr,
            admin,
        };
        let until = Instant::now() + WAIT_MAX;
        loop {
            if http_get(&replica.admin, "/health").is_ok_and(|(code, _)| code == 200) {
                return Ok(replica);
            }
            if let Some(status) = replica.child.try_wait()? {
                bail!("replica exited with {status}:\n{}", replica.log());
            }
            ensure!(
                Instant::now() < until,
                "replica not healthy in time:\n{}",
                replica.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("replica.log")).unwrap_or_default()
    }

    /// A raw QUIC client presenting client certificate `name` (fixed at creation).
    fn client(&self, name: &str) -> Result<RawClient> {
        let ca = certs::load_ca(&self.certs())?;
        RawClient::new(tls::client_config(
            &ca,
            certs::load_client(&self.certs(), name)?,
        )?)
    }

    /// The process is the one started (never restarted).
    fn still_running(&mut self) -> Result<()> {
        ensure!(
            self.child.try_wait()?.is_none(),
            "replica exited:\n{}",
            self.log()
        );
        Ok(())
    }

    /// `pangea_frames_rejected_total{reason="..."}` on the admin endpoint.
    fn rejected(&self, reason: &str) -> Result<f64> {
        let (code, text) = http_get(&self.admin, "/metrics")?;
        ensure!(code == 200, "/metrics answered {code}");
        Ok(metric(
            &text,
            &format!("pangea_frames_rejected_total{{reason=\"{reason}\"}}"),
        ))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pangea ARGS`, which must succeed; its stdout.
fn run(args: &[&str]) -> Result<String> {
    let out = pangea(args, Duration::from_secs(30))?;
    ensure!(
        out.status.success(),
        "`pangea {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The serial of the certificate in a PEM file.
fn file_serial(path: &Path) -> Result<String> {
    let leaf = certs_of(path)?;
    Ok(CertInfo::of(&leaf)?.serial)
}

fn certs_of(path: &Path) -> Result<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject as _;
    CertificateDer::from_pem_file(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The serial of the certificate the server of `conn` presented.
fn served_serial(conn: &quinn::Connection) -> Result<String> {
    let chain = conn
        .peer_identity()
        .and_then(|a| a.downcast::<Vec<CertificateDer<'static>>>().ok())
        .context("no server certificate")?;
    Ok(CertInfo::of(chain.first().context("empty chain")?)?.serial)
}

/// A read the replica answers (a missing row is an answer too).
fn a_read() -> pb::ClientRequest {
    request(
        PROFILE,
        2_000_000,
        get_request("ad_profiles", b"user-1", None),
    )
}

/// Polls `f` until it returns `Some`, at most `limit`.
async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        ensure!(Instant::now() < until, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_client_is_cut_off_and_a_reissued_replica_certificate_is_served_without_restart()
-> Result<()> {
    let mut replica = Replica::start(POLL_MS)?;
    let certs_dir = replica.certs();
    let cd = certs_dir.to_str().context("path")?.to_owned();
    let replica_pem = certs::replica_cert_path(&certs_dir, REPLICA);

    // Two clients, both served.
    let c1 = replica.client("c1")?;
    let c2 = replica.client("c2")?;
    let conn1 = c1.connect(replica.addr, REPLICA).await?;
    let conn2 = c2.connect(replica.addr, REPLICA).await?;
    call(&conn1, &a_read()).await?;
    call(&conn2, &a_read()).await?;
    let first_serial = served_serial(&conn1)?;
    assert_eq!(first_serial, file_serial(&replica_pem)?);

    // Revoke c1: its established connection is closed within the poll interval.
    let out = run(&["certs", "revoke", "--dir", &cd, "c1"])?;
    println!("{out}");
    let revoked_at = Instant::now();
    let closed = tokio::time::timeout(CLOSE_TIME_MAX, conn1.closed())
        .await
        .with_context(|| {
            format!(
                "revoked client still connected after {CLOSE_TIME_MAX:?}:\n{}",
                replica.log()
            )
        })?;
    let took = revoked_at.elapsed();
    println!("revoked client's connection closed {took:?} after `certs revoke`: {closed}");
    match &closed {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(
                c.error_code.into_inner(),
                u64::from(pangea_net::reload::CLOSE_CERTIFICATE_REVOKED)
            );
            assert_eq!(&c.reason[..], b"certificate revoked");
        }
        other => bail!("closed, but not by the replica: {other}"),
    }
    // ...counted and logged...
    assert_eq!(replica.rejected("certificate_revoked")?, 1.0);
    assert!(
        replica.log().contains("no longer verifies"),
        "no log line for the closed connection"
    );
    // ...the other client is still served on its connection...
    call(&conn2, &a_read()).await?;
    // ...and the revoked certificate cannot come back.
    let again = async {
        let conn = c1.connect(replica.addr, REPLICA).await?;
        call(&conn, &a_read()).await
    }
    .await;
    assert!(again.is_err(), "revoked certificate was served: {again:?}");

    // Re-issue the replica's certificate: the next handshake presents it.
    let out = run(&["certs", "reissue", "--dir", &cd, REPLICA])?;
    println!("{out}");
    let new_serial = file_serial(&replica_pem)?;
    assert_ne!(new_serial, first_serial);
    let rotated_at = Instant::now();
    let served = wait_for(WAIT_MAX, "new replica certificate served", || async {
        let conn = c2.connect(replica.addr, REPLICA).await?;
        call(&conn, &a_read()).await?;
        let serial = served_serial(&conn)?;
        conn.close(0u32.into(), b"probe done");
        Ok((serial == new_serial).then_some(serial))
    })
    .await?;
    println!(
        "replica served certificate {served} {:?} after `certs reissue`",
        rotated_at.elapsed()
    );
    // Same process all along, and the connection made under the old certificate
    // still works.
    replica.still_running()?;
    call(&conn2, &a_read()).await?;
    assert_eq!(served_serial(&conn2)?, first_serial);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_certificates_at_once_when_polling_is_off() -> Result<()> {
    let mut replica = Replica::start(0)?;
    let certs_dir = replica.certs();
    let cd = certs_dir.to_str().context("path")?.to_owned();
    let replica_pem = certs::replica_cert_path(&certs_dir, REPLICA);
    let c2 = replica.client("c2")?;
    let first = c2.connect(replica.addr, REPLICA).await?;
    let old_serial = served_serial(&first)?;

    run(&["certs", "reissue", "--dir", &cd, REPLICA])?;
    let new_serial = file_serial(&replica_pem)?;
    // Polling is off: without a signal the old certificate is still served.
    let conn = c2.connect(replica.addr, REPLICA).await?;
    assert_eq!(served_serial(&conn)?, old_serial);

    let pid = i32::try_from(replica.child.id())?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )?;
    let hup_at = Instant::now();
    wait_for(WAIT_MAX, "certificate reloaded on SIGHUP", || async {
        let conn = c2.connect(replica.addr, REPLICA).await?;
        let serial = served_serial(&conn)?;
        conn.close(0u32.into(), b"probe done");
        Ok((serial == new_serial).then_some(()))
    })
    .await?;
    println!(
        "served the new certificate {:?} after SIGHUP",
        hup_at.elapsed()
    );
    replica.still_running()?;
    call(&first, &a_read()).await?;
    Ok(())
}
