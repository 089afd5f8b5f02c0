//! The transport's congestion and acknowledgement settings on a real connection:
//! ten packets of the discovered size as the initial window, and peers asked to
//! acknowledge every few packets instead of every second one.

mod common;

use std::time::Duration;

use anyhow::{Result, bail};
use common::*;
use pangea_net::congestion::initial_window;
use pangea_net::tls::MTU_UPPER_BOUND;

#[tokio::test]
async fn a_fresh_loopback_connection_starts_with_ten_jumbo_packets_and_asks_for_fewer_acks()
-> Result<()> {
    let pki = Pki::new()?;
    let server = EchoServer::start(&pki, pangea_net::FRAME_BYTES_MAX, None)?;
    let client = client_endpoint(pki.client_config()?, None)?;
    let conn = connect(&client, server.addr()?).await?;
    // One exchange, so that both sides have sent and acknowledged 1-RTT packets.
    let echoed = round_trip(&conn, &request(7)).await?;
    assert_eq!(echoed.deadline_us, 7);

    // Path-MTU discovery climbs to the jumbo bound on loopback within a few round
    // trips of the handshake.
    let started = tokio::time::Instant::now();
    while conn.stats().path.current_mtu < MTU_UPPER_BOUND {
        if started.elapsed() > TEST_TIMEOUT {
            bail!("path MTU stayed at {}", conn.stats().path.current_mtu);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = conn.stats();
    // No loss on loopback, so the window is ten jumbo packets plus whatever slow
    // start added for the handshake's and the exchange's acknowledged bytes.
    assert!(
        stats.path.cwnd >= initial_window(MTU_UPPER_BOUND),
        "window {} below ten packets of {} bytes",
        stats.path.cwnd,
        MTU_UPPER_BOUND
    );
    assert!(
        stats.path.cwnd < 2 * initial_window(MTU_UPPER_BOUND),
        "window {} grew from more than the bytes acknowledged",
        stats.path.cwnd
    );
    // Each side asked the other for the ACK frequency it wants (the frame goes out
    // with the first 1-RTT packets).
    assert!(stats.frame_tx.ack_frequency >= 1, "{:?}", stats.frame_tx);
    assert!(stats.frame_rx.ack_frequency >= 1, "{:?}", stats.frame_rx);

    conn.close(0u32.into(), b"done");
    close_client(client).await;
    server.shutdown().await;
    Ok(())
}
