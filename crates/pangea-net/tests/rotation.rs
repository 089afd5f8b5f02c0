//! Certificates that change under running endpoints: a re-issued leaf is presented
//! on the next handshake, a revoked one is refused and its connections closed, and
//! a dual-CA bundle carries a CA rotation.

mod common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use common::*;
use pangea_net::reload::{
    CLOSE_CERTIFICATE_REVOKED, CLOSE_CERTIFICATE_UNTRUSTED, LiveTls, Side, TlsFiles, spawn_poller,
};
use pangea_net::rotation::{self, CertInfo};
use pangea_net::{bind_endpoint, certs, tls};
use rustls::pki_types::CertificateDer;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A replica endpoint on [`LiveTls`] that tracks every accepted connection (as the
/// node does) and echoes request frames.
struct LiveServer {
    tls: Arc<LiveTls>,
    endpoint: quinn::Endpoint,
    accepted: mpsc::UnboundedReceiver<Result<String, String>>,
    task: JoinHandle<()>,
}

impl LiveServer {
    fn start(pki: &Pki) -> Result<Self> {
        let tls = LiveTls::load(TlsFiles::replica(
            pki.path(),
            SERVER_REPLICA,
            SERVER_REGION,
        )?)?;
        let endpoint = bind_endpoint(
            localhost(),
            Some(tls.server_config()?),
            tls.client_config()?,
            None,
            None,
        )?;
        let (tx, accepted) = mpsc::unbounded_channel();
        let task = tokio::spawn(accept_loop(endpoint.clone(), tls.clone(), tx));
        Ok(Self {
            tls,
            endpoint,
            accepted,
            task,
        })
    }

    fn addr(&self) -> Result<std::net::SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// The serial of the next accepted client certificate, or the handshake error.
    async fn next_accepted(&mut self) -> Result<Result<String, String>> {
        tokio::time::timeout(TEST_TIMEOUT, self.accepted.recv())
            .await
            .context("no handshake reported in time")?
            .context("server stopped")
    }

    async fn shutdown(self) {
        self.endpoint.close(0u32.into(), b"test over");
        self.task.abort();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
    }
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    tls: Arc<LiveTls>,
    accepted: mpsc::UnboundedSender<Result<String, String>>,
) {
    while let Some(incoming) = endpoint.accept().await {
        let (tls, accepted) = (tls.clone(), accepted.clone());
        tokio::spawn(async move {
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    let _ = accepted.send(Err(e.to_string()));
                    return;
                }
            };
            let _tracked = match tls.track(&conn, Side::Accepted) {
                Ok(t) => t,
                Err(e) => {
                    let _ = accepted.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = accepted.send(peer_serial(&conn));
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    while let Ok(Some(msg)) = pangea_net::read_frame::<
                        pangea_proto::v1::ClientRequest,
                    >(
                        &mut recv, pangea_net::FRAME_BYTES_MAX
                    )
                    .await
                    {
                        if pangea_net::write_frame(&mut send, &msg).await.is_err() {
                            return;
                        }
                    }
                    let _ = send.finish();
                });
            }
        });
    }
}

/// The serial of the certificate the peer of `conn` authenticated with.
fn peer_serial(conn: &quinn::Connection) -> Result<String, String> {
    let chain = conn
        .peer_identity()
        .and_then(|a| a.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or("no peer certificate")?;
    let leaf = chain.first().ok_or("empty chain")?;
    CertInfo::of(leaf)
        .map(|i| i.serial)
        .map_err(|e| e.to_string())
}

fn file_serial(path: &std::path::Path) -> Result<String> {
    let pem = std::fs::read(path)?;
    let leaf = rustls::pki_types::pem::PemObject::from_pem_slice(&pem)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let leaf: CertificateDer<'static> = leaf;
    Ok(CertInfo::of(&leaf)?.serial)
}

/// A client endpoint on the client certificate of `pki`, reloadable.
fn live_client(pki: &Pki) -> Result<(Arc<LiveTls>, quinn::Endpoint)> {
    let tls = LiveTls::load(TlsFiles::client(pki.path(), CLIENT_NAME)?)?;
    let endpoint = client_endpoint(tls.client_config()?, None)?;
    Ok((tls, endpoint))
}

/// Waits (bounded) for `conn` to be closed and returns its application error code.
async fn closed_code(conn: &quinn::Connection) -> Result<u64> {
    match tokio::time::timeout(TEST_TIMEOUT, conn.closed())
        .await
        .context("connection not closed in time")?
    {
        quinn::ConnectionError::ApplicationClosed(c) => Ok(c.error_code.into_inner()),
        other => bail!("closed, but not by the application: {other}"),
    }
}

#[tokio::test]
async fn rotated_leaves_are_presented_on_the_next_handshake_without_a_restart() -> Result<()> {
    let pki = Pki::new()?;
    let mut server = LiveServer::start(&pki)?;
    let (client_tls, client) = live_client(&pki)?;
    let server_cert = certs::replica_cert_path(pki.path(), SERVER_REPLICA);
    let client_cert = certs::client_cert_path(pki.path(), CLIENT_NAME);

    let first = connect(&client, server.addr()?).await?;
    let served_before = peer_serial(&first).map_err(anyhow::Error::msg)?;
    assert_eq!(served_before, file_serial(&server_cert)?);
    let client_before = server.next_accepted().await?.map_err(anyhow::Error::msg)?;

    // Both leaves are re-issued; both processes reload (as on SIGHUP).
    let server_new = rotation::reissue(pki.path(), SERVER_REPLICA, None, false)?;
    let client_new = rotation::reissue(pki.path(), CLIENT_NAME, None, false)?;
    ensure!(
        server_new.new.serial != served_before,
        "re-issue kept the serial"
    );
    let report = server.tls.reload()?;
    assert_eq!(report.previous_serial, served_before);
    assert_eq!(report.serial, server_new.new.serial);
    assert!(report.closed.is_empty(), "a rotation closes nothing");
    client_tls.reload()?;

    // The next handshake carries the new certificates, both ways...
    let second = connect(&client, server.addr()?).await?;
    assert_eq!(
        peer_serial(&second).map_err(anyhow::Error::msg)?,
        server_new.new.serial
    );
    let client_after = server.next_accepted().await?.map_err(anyhow::Error::msg)?;
    assert_eq!(client_after, client_new.new.serial);
    assert_eq!(client_after, file_serial(&client_cert)?);
    assert_ne!(client_after, client_before);
    // ...and the connection made with the old ones keeps working.
    assert_eq!(round_trip(&first, &request(1)).await?, request(1));
    assert_eq!(round_trip(&second, &request(2)).await?, request(2));

    close_client(client).await;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_poller_picks_up_changed_files_and_survives_a_half_written_pair() -> Result<()> {
    let pki = Pki::new()?;
    let server = LiveServer::start(&pki)?;
    let reloads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reloads.clone();
    let _poller = spawn_poller(&server.tls, Duration::from_millis(100), move |_| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    })?;
    let before = server.tls.serial();

    // A key that does not match the certificate (a re-issue caught between its
    // renames) is refused: the old pair stays in use.
    let key_path = certs::replica_cert_path(pki.path(), SERVER_REPLICA).with_extension("key");
    let good_key = std::fs::read(&key_path)?;
    let other = rcgen::KeyPair::generate()?;
    std::fs::write(&key_path, other.serialize_pem())?;
    assert!(server.tls.reload_if_changed().is_err());
    assert_eq!(server.tls.serial(), before);
    std::fs::write(&key_path, good_key)?;

    let new = rotation::reissue(pki.path(), SERVER_REPLICA, None, false)?;
    let deadline = tokio::time::Instant::now() + TEST_TIMEOUT;
    while server.tls.serial() != new.new.serial {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the poller did not reload"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reloads.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    // Unchanged files are not reloaded again.
    assert!(server.tls.reload_if_changed()?.is_none());
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_revoked_client_is_refused_and_its_live_connection_closed() -> Result<()> {
    let pki = Pki::new()?;
    let mut server = LiveServer::start(&pki)?;
    let (_client_tls, client) = live_client(&pki)?;
    let conn = connect(&client, server.addr()?).await?;
    let serial = server.next_accepted().await?.map_err(anyhow::Error::msg)?;
    assert_eq!(round_trip(&conn, &request(1)).await?, request(1));
    assert_eq!(server.tls.tracked(), 1);

    let revoked = rotation::revoke(pki.path(), CLIENT_NAME, None)?;
    assert_eq!(revoked.cert.serial, serial);
    let report = server.tls.reload()?;
    assert_eq!(report.crls, 1);
    assert_eq!(report.closed.len(), 1);
    assert!(report.closed[0].revoked);
    assert_eq!(report.closed[0].serial, serial);
    assert_eq!(
        closed_code(&conn).await?,
        u64::from(CLOSE_CERTIFICATE_REVOKED)
    );

    // A new handshake with the same certificate is refused by the server.
    let attempt = tokio::time::timeout(TEST_TIMEOUT, async {
        let c = connect(&client, server.addr()?).await?;
        round_trip(&c, &request(2)).await
    })
    .await?;
    assert!(attempt.is_err(), "revoked client got an answer");
    match server.next_accepted().await? {
        Err(reason) => assert!(reason.to_lowercase().contains("revoked"), "{reason}"),
        Ok(s) => bail!("revoked certificate {s} was accepted"),
    }
    // A re-issued certificate gets in again.
    rotation::reissue(pki.path(), CLIENT_NAME, None, false)?;
    let (_tls, fresh) = live_client(&pki)?;
    let c = connect(&fresh, server.addr()?).await?;
    assert_eq!(round_trip(&c, &request(3)).await?, request(3));

    close_client(client).await;
    close_client(fresh).await;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn connections_to_a_revoked_replica_are_closed_from_either_side() -> Result<()> {
    let pki = Pki::new()?;
    let mut server = LiveServer::start(&pki)?;
    let (client_tls, client) = live_client(&pki)?;
    // conn1 is tracked by the dialling side too; conn2 only by the server (as the
    // client library and replication links do).
    let conn1 = connect(&client, server.addr()?).await?;
    let name: rustls::pki_types::ServerName<'static> =
        tls::server_name(SERVER_REPLICA).to_owned().try_into()?;
    let _guard = client_tls.track(&conn1, Side::Dialled(name))?;
    let conn2 = connect(&client, server.addr()?).await?;
    for _ in 0..2 {
        server.next_accepted().await?.map_err(anyhow::Error::msg)?;
    }
    let replica_serial = peer_serial(&conn2).map_err(anyhow::Error::msg)?;

    rotation::revoke(pki.path(), SERVER_REPLICA, None)?;
    // The dialler that reloads closes its tracked connection...
    let report = client_tls.reload()?;
    assert_eq!(report.closed.len(), 1, "{:?}", report.closed);
    assert!(report.closed[0].revoked && !report.closed[0].local);
    assert_eq!(report.closed[0].serial, replica_serial);
    assert!(conn1.close_reason().is_some());
    assert!(conn2.close_reason().is_none(), "conn2 is not tracked here");
    // ...and the replica closes what it served with its now revoked certificate.
    let report = server.tls.reload()?;
    assert!(
        report
            .closed
            .iter()
            .any(|c| c.local && c.revoked && c.serial == replica_serial),
        "{:?}",
        report.closed
    );
    assert_eq!(
        closed_code(&conn2).await?,
        u64::from(CLOSE_CERTIFICATE_REVOKED)
    );
    match conn2.close_reason() {
        Some(quinn::ConnectionError::ApplicationClosed(c)) => {
            assert_eq!(&c.reason[..], b"local certificate revoked");
        }
        other => bail!("unexpected close: {other:?}"),
    }
    // A client that reloaded the CRL refuses the replica's certificate.
    let refused = tokio::time::timeout(
        TEST_TIMEOUT,
        client.connect(server.addr()?, tls::server_name(SERVER_REPLICA))?,
    )
    .await?;
    match refused {
        Err(e) => assert!(e.to_string().to_lowercase().contains("revoked"), "{e}"),
        Ok(_) => bail!("client accepted a revoked replica certificate"),
    }
    close_client(client).await;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_dual_ca_bundle_carries_a_ca_rotation() -> Result<()> {
    let pki = Pki::new()?;
    let d = pki.path();
    // A client that will keep its old-CA certificate to the end.
    certs::issue_client(d, "laggard", CLIENT_PROFILE)?;
    let mut server = LiveServer::start(&pki)?;

    // Step 1: the new CA joins the bundle; every process reloads it.
    let next = rotation::rotate_ca_start(d)?;
    assert_eq!(server.tls.reload()?.cas, 2);
    // Step 2: leaves come from the new CA (all but the laggard's).
    rotation::rotate_ca_promote(d)?;
    rotation::reissue(d, SERVER_REPLICA, None, false)?;
    rotation::reissue(d, CLIENT_NAME, None, false)?;
    server.tls.reload()?;
    assert_eq!(
        CertInfo::of(&certs::load_client(d, CLIENT_NAME)?.chain[0])?.issuer,
        next.subject
    );

    // While the bundle holds both CAs, leaves of both are accepted, both ways: the
    // laggard (old-CA leaf) and the re-issued client (new-CA leaf) both reach the
    // server, which presents a new-CA leaf.
    let (_n, new_client) = live_client(&pki)?;
    let new_conn = connect(&new_client, server.addr()?).await?;
    assert_eq!(round_trip(&new_conn, &request(1)).await?, request(1));
    server.next_accepted().await?.map_err(anyhow::Error::msg)?;
    let laggard_tls = LiveTls::load(TlsFiles::client(d, "laggard")?)?;
    let laggard = client_endpoint(laggard_tls.client_config()?, None)?;
    let laggard_conn = connect(&laggard, server.addr()?).await?;
    assert_eq!(round_trip(&laggard_conn, &request(2)).await?, request(2));
    server.next_accepted().await?.map_err(anyhow::Error::msg)?;

    // Step 3: the old CA leaves the bundle; refused while a leaf still needs it,
    // forced here to show what happens to that leaf.
    assert!(matches!(
        rotation::rotate_ca_finish(d, false),
        Err(pangea_net::Error::CaStillInUse { .. })
    ));
    rotation::rotate_ca_finish(d, true)?;
    let report = server.tls.reload()?;
    assert_eq!(report.cas, 1);
    // The laggard's live connection is closed as no longer trusted; the new-CA one
    // stays up.
    assert_eq!(report.closed.len(), 1, "{:?}", report.closed);
    assert!(!report.closed[0].revoked);
    assert_eq!(
        closed_code(&laggard_conn).await?,
        u64::from(CLOSE_CERTIFICATE_UNTRUSTED)
    );
    assert_eq!(round_trip(&new_conn, &request(3)).await?, request(3));
    // And an old-CA leaf cannot connect any more.
    let again = tokio::time::timeout(TEST_TIMEOUT, async {
        let c = connect(&laggard, server.addr()?).await?;
        round_trip(&c, &request(4)).await
    })
    .await?;
    assert!(
        again.is_err(),
        "an old-CA leaf was accepted after the rotation"
    );
    match server.next_accepted().await? {
        Err(reason) => println!("old-CA leaf refused: {reason}"),
        Ok(s) => bail!("old-CA leaf {s} was accepted"),
    }

    close_client(new_client).await;
    close_client(laggard).await;
    server.shutdown().await;
    Ok(())
}
