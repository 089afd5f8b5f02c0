//! Frames over real QUIC streams: limits, truncation, and isolation of bad streams.

mod common;

use anyhow::{Result, bail};
use common::*;
use pangea_net::{Error, read_answer, read_frame, write_frame};
use pangea_proto::v1::{ClientRequest, GetRequest, client_request};

/// Small limit so the tests move little data; the logic is the same at 17 MiB.
const TEST_LIMIT_BYTES: usize = 64 * 1024;

async fn expect_stream_error(server: &mut EchoServer) -> Result<Error> {
    match server.next_event().await? {
        ServerEvent::StreamError(e) => Ok(e),
        other => bail!("expected a stream error, got {other:?}"),
    }
}

async fn expect_accepted(server: &mut EchoServer) -> Result<()> {
    match server.next_event().await? {
        ServerEvent::Accepted(_) => Ok(()),
        other => bail!("expected an accepted connection, got {other:?}"),
    }
}

#[tokio::test]
async fn oversized_frames_are_refused_and_the_server_keeps_serving() -> Result<()> {
    let pki = Pki::new()?;
    let mut server = EchoServer::start(&pki, TEST_LIMIT_BYTES, None)?;
    let client = client_endpoint(pki.client_config()?, None)?;
    let conn = connect(&client, server.addr()?).await?;
    expect_accepted(&mut server).await?;

    // 1. A header announcing 1 GiB, and no body: refused at once (the server
    //    cannot be waiting to fill a 1 GiB buffer, which it would never get).
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(&(1u32 << 30).to_be_bytes()).await?;
    match expect_stream_error(&mut server).await? {
        Error::FrameTooLarge {
            size_bytes,
            limit_bytes,
        } => {
            assert_eq!(size_bytes, 1 << 30);
            assert_eq!(limit_bytes, TEST_LIMIT_BYTES);
        }
        other => bail!("expected FrameTooLarge, got {other:?}"),
    }
    // The server reset that stream: our read fails rather than hangs.
    let reply = tokio::time::timeout(
        TEST_TIMEOUT,
        read_frame::<ClientRequest>(&mut recv, TEST_LIMIT_BYTES),
    )
    .await?;
    assert!(reply.is_err(), "expected a reset stream, got {reply:?}");

    // 2. A real message just over the limit, written with write_frame.
    let big = ClientRequest {
        deadline_us: 1,
        app_profile: CLIENT_PROFILE.into(),
        traceparent: String::new(),
        known_watermarks: 0,
        request: Some(client_request::Request::Get(GetRequest {
            table: "profiles".into(),
            row_key: vec![7u8; TEST_LIMIT_BYTES].into(),
            filter: None,
            consistency: None,
        })),
    };
    let (mut send, _recv) = conn.open_bi().await?;
    // The write itself may or may not see the server's STOP; either is fine.
    let _ = write_frame(&mut send, &big).await;
    match expect_stream_error(&mut server).await? {
        Error::FrameTooLarge { size_bytes, .. } => {
            assert!(size_bytes > TEST_LIMIT_BYTES as u64);
        }
        other => bail!("expected FrameTooLarge, got {other:?}"),
    }

    // 3. Meanwhile the same connection still serves ordinary requests.
    for seq in 0..3 {
        assert_eq!(round_trip(&conn, &request(seq)).await?, request(seq));
    }

    close_client(client).await;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn truncated_frames_are_errors() -> Result<()> {
    let pki = Pki::new()?;
    let mut server = EchoServer::start(&pki, TEST_LIMIT_BYTES, None)?;
    let client = client_endpoint(pki.client_config()?, None)?;
    let conn = connect(&client, server.addr()?).await?;
    expect_accepted(&mut server).await?;

    // The body stops after 10 of the 100 announced bytes.
    let (mut send, _recv) = conn.open_bi().await?;
    send.write_all(&100u32.to_be_bytes()).await?;
    send.write_all(&[0u8; 10]).await?;
    send.finish()?;
    match expect_stream_error(&mut server).await? {
        Error::FrameTruncated {
            expected_bytes,
            received_bytes,
        } => {
            assert_eq!((expected_bytes, received_bytes), (100, 10));
        }
        other => bail!("expected FrameTruncated, got {other:?}"),
    }

    // The header itself stops after 2 of its 4 bytes.
    let (mut send, _recv) = conn.open_bi().await?;
    send.write_all(&[0, 0]).await?;
    send.finish()?;
    match expect_stream_error(&mut server).await? {
        Error::FrameTruncated {
            expected_bytes,
            received_bytes,
        } => {
            assert_eq!((expected_bytes, received_bytes), (4, 2));
        }
        other => bail!("expected FrameTruncated, got {other:?}"),
    }

    // A stream that ends cleanly between frames is not an error: the echo
    // answers both frames, then finishes its side, and we read a clean end.
    let (mut send, mut recv) = conn.open_bi().await?;
    write_frame(&mut send, &request(1)).await?;
    write_frame(&mut send, &request(2)).await?;
    send.finish()?;
    let mut echoed = Vec::new();
    while let Some(msg) = tokio::time::timeout(
        TEST_TIMEOUT,
        read_frame::<ClientRequest>(&mut recv, TEST_LIMIT_BYTES),
    )
    .await??
    {
        echoed.push(msg);
    }
    assert_eq!(echoed, vec![request(1), request(2)]);

    close_client(client).await;
    server.shutdown().await;
    Ok(())
}

/// Over loopback, path-MTU discovery raises the packet size to the jumbo-frame
/// bound, and megabyte frames then travel in batches of such packets (over the
/// 65,507 bytes one UDP send may carry, so split: `gso::GsoBatches`) with no
/// packet lost and no black hole detected — a refused batch would show as both,
/// and would drop the MTU back to 1,200 bytes.
#[tokio::test]
async fn megabyte_frames_travel_in_jumbo_packets_over_loopback_without_loss() -> Result<()> {
    let pki = Pki::new()?;
    let mut server = EchoServer::start(&pki, pangea_net::FRAME_BYTES_MAX, None)?;
    let client = client_endpoint(pki.client_config()?, None)?;
    let conn = connect(&client, server.addr()?).await?;
    expect_accepted(&mut server).await?;
    let bound = pangea_net::tls::MTU_UPPER_BOUND;
    let mut big = request(1);
    big.traceparent = "x".repeat(1 << 20);
    let deadline = tokio::time::Instant::now() + TEST_TIMEOUT;
    while conn.stats().path.current_mtu < bound {
        if tokio::time::Instant::now() > deadline {
            bail!(
                "path MTU still {} after {TEST_TIMEOUT:?}",
                conn.stats().path.current_mtu
            );
        }
        assert_eq!(round_trip(&conn, &request(2)).await?, request(2));
    }
    for _ in 0..4 {
        assert_eq!(round_trip(&conn, &big).await?, big);
    }
    let path = conn.stats().path;
    assert_eq!(
        (
            path.current_mtu,
            path.black_holes_detected,
            path.lost_packets
        ),
        (bound, 0, 0),
        "{path:?}"
    );
    close_client(client).await;
    server.shutdown().await;
    Ok(())
}

/// `read_answer` reads what `read_frame` reads: a small answer (one piece) and
/// a 200 KiB one (many packets, gathered), each the stream's only frame; then a
/// clean end of the stream is `None`.
#[tokio::test]
async fn answers_read_whole_in_one_piece_or_many() -> Result<()> {
    let pki = Pki::new()?;
    let mut server = EchoServer::start(&pki, pangea_net::FRAME_BYTES_MAX, None)?;
    let client = client_endpoint(pki.client_config()?, None)?;
    let conn = connect(&client, server.addr()?).await?;
    expect_accepted(&mut server).await?;
    let mut big = request(2);
    big.traceparent = "y".repeat(200 << 10);
    for msg in [request(1), big] {
        let (mut send, mut recv) = conn.open_bi().await?;
        write_frame(&mut send, &msg).await?;
        send.finish()?;
        let read = async {
            let answer =
                read_answer::<ClientRequest>(&mut recv, pangea_net::FRAME_BYTES_MAX).await?;
            let end = read_answer::<ClientRequest>(&mut recv, pangea_net::FRAME_BYTES_MAX).await?;
            anyhow::Ok((answer, end))
        };
        let (answer, end) = tokio::time::timeout(TEST_TIMEOUT, read).await??;
        assert_eq!(answer.as_ref(), Some(&msg));
        assert_eq!(end, None, "the echo finished its side after the answer");
    }
    close_client(client).await;
    server.shutdown().await;
    Ok(())
}
