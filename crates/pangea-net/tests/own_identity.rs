//! A process holds the identity it claims: [`LiveTls`] refuses, at load and at
//! every reload, a certificate that is not the one its [`TlsFiles`] expect, and
//! keeps the certificate it has when a reload is refused.

mod common;

use std::path::Path;

use anyhow::{Result, bail, ensure};
use common::*;
use pangea_net::reload::{LiveTls, TlsFiles};
use pangea_net::rotation::CertInfo;
use pangea_net::{Credential, Error, PeerIdentity, certs};
use rustls::pki_types::CertificateDer;

/// Copies the certificate and key of `from` over those of `to` (as an operator
/// copying files to the wrong place would).
fn copy_pair(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)?;
    std::fs::copy(from.with_extension("key"), to.with_extension("key"))?;
    Ok(())
}

fn replica_files(pki: &Pki) -> Result<TlsFiles> {
    Ok(TlsFiles::replica(
        pki.path(),
        SERVER_REPLICA,
        SERVER_REGION,
    )?)
}

#[test]
fn a_replica_refuses_to_start_with_a_certificate_that_is_not_its_own() -> Result<()> {
    let pki = Pki::new()?;
    let own = certs::replica_cert_path(pki.path(), SERVER_REPLICA);
    // Its own certificate loads, and says who it is.
    let tls = LiveTls::load(replica_files(&pki)?)?;
    assert_eq!(
        tls.identity(),
        PeerIdentity::Replica {
            id: SERVER_REPLICA.into(),
            region: SERVER_REGION.into()
        }
    );
    drop(tls);

    // The right replica id in another region than the one it runs in.
    let elsewhere = TlsFiles::replica(pki.path(), SERVER_REPLICA, "eu-west1")?;
    match LiveTls::load(elsewhere) {
        Err(e @ Error::WrongIdentity { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "{} holds the identity of replica us-east1-a (region us-east1), not of replica \
                 us-east1-a (region eu-west1)",
                own.display()
            )
        ),
        other => bail!("expected WrongIdentity, got {other:?}"),
    }

    // Another replica's certificate in its file.
    certs::issue_replica(pki.path(), "us-east1-b", SERVER_REGION)?;
    copy_pair(&certs::replica_cert_path(pki.path(), "us-east1-b"), &own)?;
    let err = LiveTls::load(replica_files(&pki)?).err();
    ensure!(
        matches!(&err, Some(Error::WrongIdentity { path, .. }) if *path == own),
        "{err:?}"
    );

    // A client's certificate in its file.
    copy_pair(&certs::client_cert_path(pki.path(), CLIENT_NAME), &own)?;
    match LiveTls::load(replica_files(&pki)?) {
        Err(e) => assert_eq!(
            e.to_string(),
            format!(
                "{} holds the identity of client frontend-1 (app profile serving), not of \
                 replica us-east1-a (region us-east1)",
                own.display()
            )
        ),
        Ok(_) => bail!("a replica started with a client certificate"),
    }

    // A certificate without any identity, named by its file.
    let key = rcgen::KeyPair::generate()?;
    let bare = rcgen::CertificateParams::new(vec!["localhost".to_string()])?.self_signed(&key)?;
    std::fs::write(&own, bare.pem())?;
    std::fs::write(own.with_extension("key"), key.serialize_pem())?;
    let err = LiveTls::load(replica_files(&pki)?).err();
    ensure!(
        matches!(&err, Some(Error::Pem { path, reason }) if *path == own && reason.contains("identity")),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn a_replica_certificate_is_refused_as_a_client_credential() -> Result<()> {
    let pki = Pki::new()?;
    let client = certs::client_cert_path(pki.path(), CLIENT_NAME);
    copy_pair(
        &certs::replica_cert_path(pki.path(), SERVER_REPLICA),
        &client,
    )?;
    match LiveTls::load(TlsFiles::client(pki.path(), CLIENT_NAME)?) {
        Err(e @ Error::ReplicaCertificateAsCredential { .. }) => {
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("{} is a replica certificate", client.display())),
                "{message}"
            );
            assert!(
                message.ends_with("a client, operator or loader certificate is needed"),
                "{message}"
            );
        }
        other => bail!("expected ReplicaCertificateAsCredential, got {other:?}"),
    }
    Ok(())
}

#[test]
fn credentials_load_only_their_own_kind_and_name() -> Result<()> {
    let pki = Pki::new()?;
    let d = pki.path();
    certs::issue_operator(d, "alice")?;
    certs::issue_loader(d, "nightly", CLIENT_PROFILE)?;
    certs::issue_client(d, "frontend-2", CLIENT_PROFILE)?;

    let operator = Credential::Operator("alice".into());
    let tls = LiveTls::load(TlsFiles::for_credential(d, &operator)?)?;
    assert_eq!(
        tls.identity(),
        PeerIdentity::Operator {
            name: "alice".into()
        }
    );
    assert_eq!(tls.files().cert, certs::operator_cert_path(d, "alice"));
    let loader = Credential::Loader("nightly".into());
    let tls = LiveTls::load(TlsFiles::for_credential(d, &loader)?)?;
    assert_eq!(
        tls.identity(),
        PeerIdentity::Loader {
            name: "nightly".into(),
            app_profile: CLIENT_PROFILE.into()
        }
    );

    // Same name, wrong kind: a client certificate in the operator's file.
    certs::issue_client(d, "alice", CLIENT_PROFILE)?;
    copy_pair(
        &certs::client_cert_path(d, "alice"),
        &certs::operator_cert_path(d, "alice"),
    )?;
    match LiveTls::load(TlsFiles::for_credential(d, &operator)?) {
        Err(e @ Error::WrongIdentity { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "{} holds the identity of client alice (app profile serving), not of operator \
                 alice",
                certs::operator_cert_path(d, "alice").display()
            )
        ),
        other => bail!("expected WrongIdentity, got {other:?}"),
    }
    // Same kind, wrong name.
    copy_pair(
        &certs::client_cert_path(d, "frontend-2"),
        &certs::client_cert_path(d, CLIENT_NAME),
    )?;
    let err = LiveTls::load(TlsFiles::client(d, CLIENT_NAME)?).err();
    ensure!(matches!(err, Some(Error::WrongIdentity { .. })), "{err:?}");
    // Names are validated before any file is read.
    let err = TlsFiles::for_credential(d, &Credential::Loader("../x".into())).err();
    ensure!(
        matches!(
            err,
            Some(Error::InvalidName {
                what: "loader name",
                ..
            })
        ),
        "{err:?}"
    );
    Ok(())
}

/// The serial of the certificate the peer of `conn` presented.
fn peer_serial(conn: &quinn::Connection) -> Result<String> {
    let chain = conn
        .peer_identity()
        .and_then(|a| a.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or_else(|| anyhow::anyhow!("no peer certificate"))?;
    let leaf = chain
        .first()
        .ok_or_else(|| anyhow::anyhow!("empty chain"))?;
    Ok(CertInfo::of(leaf)?.serial)
}

#[tokio::test]
async fn a_reload_refuses_another_identity_and_keeps_the_current_certificate() -> Result<()> {
    let pki = Pki::new()?;
    let own = certs::replica_cert_path(pki.path(), SERVER_REPLICA);
    let tls = LiveTls::load(replica_files(&pki)?)?;
    let endpoint = pangea_net::bind_endpoint(
        localhost(),
        Some(tls.server_config()?),
        tls.client_config()?,
        None,
        None,
    )?;
    let acceptor = endpoint.clone();
    let accept = tokio::spawn(async move {
        while let Some(incoming) = acceptor.accept().await {
            tokio::spawn(async move {
                if let Ok(conn) = incoming.await {
                    conn.closed().await;
                }
            });
        }
    });
    let before = tls.serial();

    // Another replica's pair lands in this replica's files: the poller's reload...
    certs::issue_replica(pki.path(), "us-east1-b", SERVER_REGION)?;
    copy_pair(&certs::replica_cert_path(pki.path(), "us-east1-b"), &own)?;
    match tls.reload_if_changed() {
        Err(e @ Error::WrongIdentity { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "{} holds the identity of replica us-east1-b (region us-east1), not of replica \
                 us-east1-a (region us-east1)",
                own.display()
            )
        ),
        other => bail!("expected WrongIdentity, got {other:?}"),
    }
    // ...and a SIGHUP's are refused; the current certificate stays in use.
    let err = tls.reload().err();
    ensure!(matches!(err, Some(Error::WrongIdentity { .. })), "{err:?}");
    assert_eq!(tls.serial(), before);
    assert_eq!(tls.identity().replica_id(), Some(SERVER_REPLICA));
    let client = client_endpoint(pki.client_config()?, None)?;
    let conn = connect(&client, endpoint.local_addr()?).await?;
    assert_eq!(
        peer_serial(&conn)?,
        before,
        "the refused certificate was presented"
    );
    assert_eq!(
        pangea_net::peer_identity(&conn)?.replica_id(),
        Some(SERVER_REPLICA)
    );

    // A client's certificate is refused the same way.
    copy_pair(&certs::client_cert_path(pki.path(), CLIENT_NAME), &own)?;
    let err = tls.reload_if_changed().err();
    ensure!(matches!(err, Some(Error::WrongIdentity { .. })), "{err:?}");
    assert_eq!(tls.serial(), before);

    // Its own re-issued certificate is taken.
    certs::issue_replica(pki.path(), SERVER_REPLICA, SERVER_REGION)?;
    let report = tls
        .reload_if_changed()?
        .ok_or_else(|| anyhow::anyhow!("the repaired files were not reloaded"))?;
    assert_eq!(report.previous_serial, before);
    assert_ne!(tls.serial(), before);
    let again = connect(&client, endpoint.local_addr()?).await?;
    assert_eq!(peer_serial(&again)?, tls.serial());

    close_client(client).await;
    endpoint.close(0u32.into(), b"test over");
    accept.abort();
    Ok(())
}
