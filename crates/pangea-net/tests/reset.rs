//! Stateless reset across a restart: a replica that keeps its reset key (as
//! `pangea start` does, in its data directory) makes its predecessor's connections
//! fail on their next packet; with a fresh key they are left to time out.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use common::*;
use pangea_net::{ResetKey, WanControl, WanEmulator};

/// What the first request on a client's connection to a replica that died silently
/// and was restarted on the same socket gets, and how long it took. `same_key`:
/// whether the restarted replica has its predecessor's reset key.
async fn request_on_a_stale_connection(same_key: bool) -> Result<(String, Duration)> {
    let pki = Pki::new()?;
    let socket = pangea_net::bind_udp_socket(localhost())?;
    // Keeps the port across the "restart" (a parent holding the socket, like
    // `pangea cluster up`), so nothing else can take it in between.
    let kept = socket.try_clone()?;
    let addr = socket.local_addr()?;
    let key = ResetKey::random()?;
    let control = WanControl::new();
    let wan = WanEmulator::new(control.clone(), 1);
    let server = EchoServer::start_on(&pki, socket, 1 << 20, Some(wan), Some(&key))?;
    let client = client_endpoint(pki.client_config()?, None)?;
    let conn = connect(&client, addr).await?;
    round_trip(&conn, &request(1)).await?;

    // Die like `kill -9`: nothing the old endpoint says on its way out reaches the
    // client, which still believes the connection is up.
    control.partition(client.local_addr()?);
    server.shutdown().await;
    if conn.close_reason().is_some() {
        bail!("the client heard of the shutdown; the test would prove nothing");
    }
    let restarted_key = if same_key { key } else { ResetKey::random()? };
    let restarted = EchoServer::start_on(&pki, kept, 1 << 20, None, Some(&restarted_key))?;

    let started = Instant::now();
    let outcome = match tokio::time::timeout(Duration::from_secs(2), round_trip(&conn, &request(2)))
        .await
    {
        Ok(Ok(_)) => bail!("a stale connection got an answer from a process that never knew it"),
        Ok(Err(e)) => format!("{e:#}"),
        Err(_) => "no answer within 2 s".to_owned(),
    };
    let waited = started.elapsed();
    restarted.shutdown().await;
    close_client(client).await;
    Ok((outcome, waited))
}

#[tokio::test]
async fn a_restarted_replica_with_its_reset_key_resets_stale_connections_at_once() -> Result<()> {
    let (outcome, waited) = request_on_a_stale_connection(true).await?;
    assert!(
        outcome.contains("reset"),
        "expected a stateless reset, got: {outcome}"
    );
    // One round trip on loopback; the bound only keeps a loaded machine from failing.
    assert!(waited < Duration::from_secs(1), "reset took {waited:?}");
    Ok(())
}

#[tokio::test]
async fn with_a_new_reset_key_a_stale_connection_is_left_to_time_out() -> Result<()> {
    let (outcome, _) = request_on_a_stale_connection(false).await?;
    assert_eq!(outcome, "no answer within 2 s");
    Ok(())
}
