//! Mutual TLS: who may connect, and who the peer turns out to be.

mod common;

use std::sync::Arc;

use anyhow::{Result, bail};
use common::*;
use pangea_net::{Credential, PeerIdentity, certs, peer_identity, tls};
use quinn::crypto::rustls::QuicClientConfig;

#[tokio::test]
async fn handshake_succeeds_and_both_sides_see_the_right_identity() -> Result<()> {
    let pki = Pki::new()?;
    let mut server = EchoServer::start(&pki, pangea_net::FRAME_BYTES_MAX, None)?;
    let client = client_endpoint(pki.client_config()?, None)?;

    let conn = connect(&client, server.addr()?).await?;
    // The client sees the replica it dialled...
    assert_eq!(
        peer_identity(&conn)?,
        PeerIdentity::Replica {
            id: SERVER_REPLICA.into(),
            region: SERVER_REGION.into()
        }
    );
    assert_eq!(
        conn.handshake_data()
            .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|d| d.protocol),
        Some(tls::ALPN_PANGEA_V1.to_vec())
    );
    // ...and the replica sees the client and its app profile.
    match server.next_event().await? {
        ServerEvent::Accepted(identity) => assert_eq!(
            identity,
            PeerIdentity::Client {
                name: CLIENT_NAME.into(),
                app_profile: CLIENT_PROFILE.into()
            }
        ),
        other => bail!("expected an accepted connection, got {other:?}"),
    }
    // And the connection carries frames.
    assert_eq!(round_trip(&conn, &request(7)).await?, request(7));

    close_client(client).await;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn replica_to_replica_identities() -> Result<()> {
    let pki = Pki::new()?;
    certs::issue_replica(pki.path(), "eu-west1-b", "eu-west1")?;
    let mut server = EchoServer::start(&pki, pangea_net::FRAME_BYTES_MAX, None)?;
    let dialer = client_endpoint(
        tls::client_config(&pki.ca, certs::load_replica(pki.path(), "eu-west1-b")?)?,
        None,
    )?;
    let conn = connect(&dialer, server.addr()?).await?;
    assert_eq!(peer_identity(&conn)?.replica_id(), Some(SERVER_REPLICA));
    match server.next_event().await? {
        ServerEvent::Accepted(identity) => assert_eq!(
            identity,
            PeerIdentity::Replica {
                id: "eu-west1-b".into(),
                region: "eu-west1".into()
            }
        ),
        other => bail!("expected an accepted connection, got {other:?}"),
    }
    close_client(dialer).await;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn operators_and_loaders_connect_as_themselves() -> Result<()> {
    let pki = Pki::new()?;
    certs::issue_operator(pki.path(), "alice")?;
    certs::issue_loader(pki.path(), "nightly", CLIENT_PROFILE)?;
    let mut server = EchoServer::start(&pki, pangea_net::FRAME_BYTES_MAX, None)?;
    for (bundle, expected) in [
        (
            certs::load_operator(pki.path(), "alice")?,
            PeerIdentity::Operator {
                name: "alice".into(),
            },
        ),
        (
            certs::load_credential(pki.path(), &Credential::Loader("nightly".into()))?,
            PeerIdentity::Loader {
                name: "nightly".into(),
                app_profile: CLIENT_PROFILE.into(),
            },
        ),
    ] {
        let client = client_endpoint(tls::client_config(&pki.ca, bundle)?, None)?;
        let conn = connect(&client, server.addr()?).await?;
        assert_eq!(peer_identity(&conn)?.replica_id(), Some(SERVER_REPLICA));
        match server.next_event().await? {
            ServerEvent::Accepted(identity) => assert_eq!(identity, expected),
            other => bail!("expected an accepted connection, got {other:?}"),
        }
        assert_eq!(round_trip(&conn, &request(9)).await?, request(9));
        close_client(client).await;
    }
    server.shutdown().await;
    Ok(())
}

/// Dials with `config` and expects the connection to be refused: either the
/// handshake fails, or (TLS 1.3 clients finish before the server has checked their
/// certificate) the first request fails. The server must report a failed handshake.
async fn expect_refused(pki: &Pki, config: quinn::ClientConfig) -> Result<()> {
    let mut server = EchoServer::start(pki, pangea_net::FRAME_BYTES_MAX, None)?;
    let client = client_endpoint(config, None)?;
    let addr = server.addr()?;
    let attempt = tokio::time::timeout(TEST_TIMEOUT, async {
        let conn = client
            .connect(addr, tls::server_name(SERVER_REPLICA))?
            .await?;
        round_trip(&conn, &request(1)).await
    })
    .await?;
    assert!(
        attempt.is_err(),
        "refused client got an answer: {attempt:?}"
    );
    match server.next_event().await? {
        ServerEvent::HandshakeFailed(reason) => {
            println!("server refused the handshake: {reason}");
        }
        other => bail!("expected a refused handshake, got {other:?}"),
    }
    close_client(client).await;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() -> Result<()> {
    let pki = Pki::new()?;
    // A second cluster with its own CA and a client of the same name.
    let other = Pki::new()?;
    // The rogue client trusts our CA (so it would accept our server) but its own
    // certificate is signed by the other CA.
    let config = tls::client_config(&pki.ca, certs::load_client(other.path(), CLIENT_NAME)?)?;
    expect_refused(&pki, config).await
}

#[tokio::test]
async fn client_without_certificate_is_refused() -> Result<()> {
    let pki = Pki::new()?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone())?;
    let mut crypto = rustls::ClientConfig::builder_with_provider(ring())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    crypto.alpn_protocols = vec![tls::ALPN_PANGEA_V1.to_vec()];
    let config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(crypto)?));
    expect_refused(&pki, config).await
}

#[tokio::test]
async fn server_from_another_ca_is_refused_by_the_client() -> Result<()> {
    let pki = Pki::new()?;
    let other = Pki::new()?;
    // The server is `other`'s replica; the client trusts only `pki`'s CA.
    let server = EchoServer::start(&other, pangea_net::FRAME_BYTES_MAX, None)?;
    let client = client_endpoint(pki.client_config()?, None)?;
    let result = tokio::time::timeout(
        TEST_TIMEOUT,
        client.connect(server.addr()?, tls::server_name(SERVER_REPLICA))?,
    )
    .await?;
    assert!(result.is_err(), "client accepted a server from another CA");
    close_client(client).await;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn dialling_the_wrong_replica_fails_the_server_name_check() -> Result<()> {
    let pki = Pki::new()?;
    let server = EchoServer::start(&pki, pangea_net::FRAME_BYTES_MAX, None)?;
    let client = client_endpoint(pki.client_config()?, None)?;
    // The server is us-east1-a; we think we are dialling eu-west1-b.
    let result = tokio::time::timeout(
        TEST_TIMEOUT,
        client.connect(server.addr()?, tls::server_name("eu-west1-b"))?,
    )
    .await?;
    assert!(
        result.is_err(),
        "server name of another replica was accepted"
    );
    close_client(client).await;
    server.shutdown().await;
    Ok(())
}
