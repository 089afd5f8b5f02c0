//! Replication links: one task per peer sends what the core queued for it over a
//! long-lived QUIC connection (reconnecting with backoff), and incoming peer
//! connections are read frame by frame into the driver.
//!
//! Each connection carries two unidirectional streams: `main` (heartbeats, gap
//! traffic, mutations — FIFO, so a heartbeat rarely overtakes the mutations it
//! describes) and `bulk` (snapshot chunks, lower priority, so a snapshot never
//! delays the stream). Both start with a `Hello` that must match the peer's
//! certificate.

use crate::Shared;
use crate::driver::Input;
use pangea_core::frame::{Frame, FrameClass};
use pangea_core::link::{LinkDecoder, LinkEncoder};
use pangea_core::replica::Transmit;
use pangea_net::{Backoff, FRAME_BYTES_MAX, PeerIdentity, read_frame, tls, write_frame};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::ReplicaId;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Frames waiting for one peer; beyond it the driver drops them (gap repair).
pub const PEER_QUEUE_FRAMES_MAX: usize = 4_096;
/// QUIC application error codes we close connections with.
pub const CLOSE_HELLO_MISMATCH: u32 = 1;
pub const CLOSE_UNKNOWN_REPLICA: u32 = 2;
pub const CLOSE_SHUTDOWN: u32 = 3;
/// The peer used its certificate for what its role does not do: a replica
/// certificate sending client requests, or a client, loader or operator
/// certificate opening a replication link. The reason names which.
pub const CLOSE_WRONG_ROLE: u32 = 6;
/// A replication stream's condensed heartbeats did not decode: the two ends'
/// tables are out of step, and a new connection starts them afresh.
pub const CLOSE_MALFORMED: u32 = 7;
/// The close reason a replica certificate gets for a client request.
pub const REPLICA_AS_CLIENT: &[u8] =
    b"replica certificates carry replication only; client requests need a client, loader or operator certificate";

struct Link {
    connection: quinn::Connection,
    main: quinn::SendStream,
    /// The main stream's codec state (heartbeats go condensed on it).
    encoder: LinkEncoder,
    bulk: quinn::SendStream,
    /// Re-verified on every certificate reload while the link lives: a peer whose
    /// certificate is revoked (or whose CA is dropped) is disconnected from this side
    /// too, not only by the replica that accepted the connection.
    _tracked: pangea_net::reload::TrackedConnection,
}

fn hello(shared: &Shared) -> pb::ReplicationFrame {
    pb::ReplicationFrame {
        frame: Some(pb::replication_frame::Frame::Hello(pb::Hello {
            replica_id: shared.id.to_string(),
            region: shared.region.to_string(),
            protocol_version: pangea_proto::PROTOCOL_VERSION,
        })),
    }
}

/// The flow-control windows of the link between replicas `me` and `peer`: the
/// bandwidth-delay product of their round trip in the topology and of the
/// bandwidth of the link between their regions (`bandwidth_mbps`, else
/// [`tls::LINK_BANDWIDTH_DEFAULT_MBPS`]). Inside a region, and for replicas the
/// topology does not know, the defaults.
pub(crate) fn link_windows(
    d: &pangea_topology::Deployment,
    me: &ReplicaId,
    peer: &ReplicaId,
) -> tls::Windows {
    let t = &d.topology;
    let Some(rtt_ms) = t.rtt_ms(me, peer) else {
        return tls::Windows::DEFAULT;
    };
    let bandwidth_mbps = t
        .region_of(me.as_str())
        .zip(t.region_of(peer.as_str()))
        .and_then(|(a, b)| t.link(a, b))
        .and_then(|l| l.bandwidth_mbps)
        .unwrap_or(tls::LINK_BANDWIDTH_DEFAULT_MBPS);
    tls::Windows::for_link(rtt_ms, bandwidth_mbps)
}

/// The replica whose address (in the topology) `remote` is, if any.
pub(crate) fn replica_at(d: &pangea_topology::Deployment, remote: SocketAddr) -> Option<ReplicaId> {
    d.topology
        .replicas
        .values()
        .find(|r| {
            r.address
                .as_deref()
                .and_then(|a| a.parse::<SocketAddr>().ok())
                == Some(remote)
        })
        .map(|r| r.id.clone())
}

async fn connect(
    shared: &Shared,
    endpoint: &quinn::Endpoint,
    peer: &ReplicaId,
    addr: SocketAddr,
) -> anyhow::Result<Link> {
    let name = tls::server_name(peer.as_str());
    // Windows sized for this link; the peer sizes its own for what it receives
    // (`handle_incoming`).
    let windows = link_windows(&shared.deployment(), &shared.id, peer);
    let connecting = if windows == tls::Windows::DEFAULT {
        endpoint.connect(addr, name)?
    } else {
        let mut config = shared.tls.client_config()?;
        config.transport_config(Arc::new(tls::transport_config_with(windows)));
        endpoint.connect_with(config, addr, name)?
    };
    let connection = connecting.await?;
    match pangea_net::peer_identity(&connection)? {
        PeerIdentity::Replica { id, .. } if id == peer.as_str() => {}
        other => anyhow::bail!("{addr} presented {other}, expected replica {peer}"),
    }
    let server_name = quinn::rustls::pki_types::ServerName::try_from(name.to_owned())?;
    let tracked = shared
        .tls
        .track(&connection, pangea_net::reload::Side::Dialled(server_name))?;
    let mut main = connection.open_uni().await?;
    let mut bulk = connection.open_uni().await?;
    // Serving traffic outranks replication, and the stream outranks snapshots.
    let _ = main.set_priority(0);
    let _ = bulk.set_priority(-1);
    write_frame(&mut main, &hello(shared)).await?;
    write_frame(&mut bulk, &hello(shared)).await?;
    Ok(Link {
        connection,
        main,
        encoder: LinkEncoder::default(),
        bulk,
        _tracked: tracked,
    })
}

/// Starts the link task of one peer, on the node's main runtime, and returns its
/// queue. A span per tree edge (outgoing side) carries both ends in its logs.
pub fn spawn(shared: &Arc<Shared>, peer: ReplicaId, addr: SocketAddr) -> mpsc::Sender<Transmit> {
    let (tx, rx) = mpsc::channel(PEER_QUEUE_FRAMES_MAX);
    let span = tracing::info_span!("edge", from = %shared.id, to = %peer);
    let task = run_peer(shared.clone(), shared.endpoint.clone(), peer, addr, rx);
    shared
        .runtime
        .spawn(tracing::Instrument::instrument(task, span));
    tx
}

/// Sends everything queued for `peer`, connecting (and reconnecting) as needed.
pub async fn run_peer(
    shared: Arc<Shared>,
    endpoint: quinn::Endpoint,
    peer: ReplicaId,
    addr: SocketAddr,
    mut rx: mpsc::Receiver<Transmit>,
) {
    let mut backoff = Backoff::new(
        Duration::from_millis(50),
        Duration::from_secs(5),
        shared.seed ^ addr.port() as u64,
    );
    let mut link: Option<Link> = None;
    let mut retry_at = tokio::time::Instant::now();
    let class_of = |a: &ReplicaId, b: &ReplicaId| {
        shared
            .deployment()
            .topology
            .link_class(a, b)
            .map_or("inter_region", |c| c.as_str())
    };
    while let Some(t) = rx.recv().await {
        if link
            .as_ref()
            .is_some_and(|l| l.connection.close_reason().is_some())
        {
            link = None;
        }
        if link.is_none() && tokio::time::Instant::now() >= retry_at {
            match connect(&shared, &endpoint, &peer, addr).await {
                Ok(l) => {
                    backoff.reset();
                    tracing::info!(%peer, %addr, "replication link up");
                    link = Some(l);
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::debug!(%peer, %addr, error = %e, ?delay, "cannot reach peer");
                    retry_at = tokio::time::Instant::now() + delay;
                }
            }
        }
        // Residency (I10): the core never addresses a restricted scope's frames to a
        // replica outside it; count it if it ever did.
        let outsider = match &t.frame {
            Frame::Mutations(es) => es
                .iter()
                .any(|e| !shared.deployment().allowed(&peer, &e.scope)),
            Frame::GapFill(g) => !shared.deployment().allowed(&peer, &g.scope),
            Frame::SnapshotChunk(c) => !shared.deployment().allowed(&peer, &c.scope),
            _ => false,
        };
        if outsider {
            shared
                .residency
                .to_outsiders
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            shared.metrics.inc_residency_violation();
            tracing::error!(%peer, kind = t.frame.kind(), "restricted frame addressed to a replica outside its policy; dropped");
            let _ = shared
                .driver
                .send(Input::Sent {
                    to: peer.clone(),
                    bytes: t.bytes,
                })
                .await;
            continue;
        }
        // Bytes on the wire (heartbeats condensed), for the metrics.
        let mut sent = None;
        if let Some(l) = link.as_mut() {
            let (stream, wire) = if t.class == FrameClass::Bulk {
                (&mut l.bulk, t.frame.to_proto())
            } else {
                (&mut l.main, l.encoder.encode(&t.frame))
            };
            match write_frame(stream, &wire).await {
                Ok(()) => sent = Some(wire.encoded_len()),
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "replication link lost");
                    link = None;
                }
            }
        }
        if let Some(bytes) = sent {
            shared
                .metrics
                .add_bytes_sent(class_of(&shared.id, &peer), bytes as u64);
            shared
                .metrics
                .inc_frames_sent(t.frame.kind(), peer.as_str());
        }
        // Sent or dropped, the bytes are no longer in flight.
        if shared
            .driver
            .send(Input::Sent {
                to: peer.clone(),
                bytes: t.bytes,
            })
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Reads an incoming replica connection: every unidirectional stream it opens.
pub async fn handle_peer(
    shared: Arc<Shared>,
    connection: quinn::Connection,
    id: String,
    region: String,
) {
    let d = shared.deployment();
    let known = d
        .topology
        .replica(&id)
        .is_some_and(|r| r.region.as_str() == region);
    if !known {
        tracing::warn!(peer = %id, %region, "refused: not a replica of this topology in that region");
        shared.metrics.inc_frames_rejected("unknown_replica");
        connection.close(
            CLOSE_UNKNOWN_REPLICA.into(),
            b"unknown replica or wrong region",
        );
        return;
    }
    let peer = ReplicaId::from(id.as_str());
    loop {
        // Replication is unidirectional streams; a bidirectional one is a client
        // request, which a replica certificate may not make.
        let recv = tokio::select! {
            uni = connection.accept_uni() => match uni {
                Ok(recv) => recv,
                Err(_) => return,
            },
            bi = connection.accept_bi() => {
                if bi.is_ok() {
                    tracing::warn!(peer = %id, "refused: a replica certificate sent a client request");
                    shared.metrics.inc_frames_rejected("wrong_role");
                    connection.close(CLOSE_WRONG_ROLE.into(), REPLICA_AS_CLIENT);
                }
                return;
            }
        };
        let (shared, connection, peer, region) = (
            shared.clone(),
            connection.clone(),
            peer.clone(),
            region.clone(),
        );
        // A span per tree edge (incoming side).
        let span = tracing::info_span!("edge", from = %peer, to = %shared.id);
        tokio::spawn(tracing::Instrument::instrument(
            async move { read_stream(shared, connection, peer, region, recv).await },
            span,
        ));
    }
}

async fn read_stream(
    shared: Arc<Shared>,
    connection: quinn::Connection,
    peer: ReplicaId,
    region: String,
    mut recv: quinn::RecvStream,
) {
    // The first frame must be a Hello agreeing with the certificate.
    let first = read_frame::<pb::ReplicationFrame>(&mut recv, FRAME_BYTES_MAX).await;
    let ok = match &first {
        Ok(Some(pb::ReplicationFrame {
            frame: Some(pb::replication_frame::Frame::Hello(h)),
        })) => {
            h.replica_id == peer.as_str()
                && h.region == region
                && h.protocol_version == pangea_proto::PROTOCOL_VERSION
        }
        _ => false,
    };
    if !ok {
        // Only what identifies the sender: a frame other than a hello may carry
        // user rows, which never reach logs.
        let got = match &first {
            Ok(Some(pb::ReplicationFrame {
                frame: Some(pb::replication_frame::Frame::Hello(h)),
            })) => format!(
                "hello from {:?} in {:?}, protocol {}",
                h.replica_id, h.region, h.protocol_version
            ),
            Ok(Some(pb::ReplicationFrame { frame: Some(_) })) => "a frame other than hello".into(),
            Ok(Some(_)) => "an empty frame".into(),
            Ok(None) => "end of stream".into(),
            Err(e) => format!("unreadable frame: {e}"),
        };
        tracing::warn!(%peer, %got, "refused: hello does not match the certificate");
        shared.metrics.inc_frames_rejected("hello_mismatch");
        connection.close(
            CLOSE_HELLO_MISMATCH.into(),
            b"hello does not match certificate",
        );
        return;
    }
    let limits = shared.core_limits;
    let frame_limits = pangea_core::frame::FrameLimits::default();
    // Heartbeats arrive condensed against what this stream carried before.
    let mut decoder = LinkDecoder::default();
    loop {
        let input = match read_frame::<pb::ReplicationFrame>(&mut recv, FRAME_BYTES_MAX).await {
            Ok(Some(p)) => {
                let stateful = matches!(p.frame, Some(pb::replication_frame::Frame::Heartbeats(_)));
                match decoder.decode(p, &limits, &frame_limits) {
                    Ok(frame) => Input::Frame {
                        from: peer.clone(),
                        frame,
                    },
                    Err(e) if stateful => {
                        // The decoder is out of step with the peer's encoder: only a
                        // new stream (the peer reconnects) brings them together.
                        tracing::warn!(%peer, error = %e, "malformed heartbeats; closing the link");
                        let _ = shared
                            .driver
                            .send(Input::Malformed {
                                from: peer.clone(),
                                reason: "malformed",
                            })
                            .await;
                        connection.close(CLOSE_MALFORMED.into(), b"malformed heartbeats");
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "malformed frame");
                        Input::Malformed {
                            from: peer.clone(),
                            reason: "malformed",
                        }
                    }
                }
            }
            Ok(None) => return,
            Err(e @ pangea_net::Error::FrameTooLarge { .. }) => {
                // The length prefix is all we read: the stream cannot be resynchronized.
                tracing::warn!(%peer, error = %e, "closing a replication stream");
                let _ = shared
                    .driver
                    .send(Input::Malformed {
                        from: peer.clone(),
                        reason: "frame_too_large",
                    })
                    .await;
                return;
            }
            Err(pangea_net::Error::FrameDecode(_)) => Input::Malformed {
                from: peer.clone(),
                reason: "malformed",
            },
            Err(_) => return,
        };
        if shared.driver.send(input).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;

    fn deployment() -> pangea_topology::Deployment {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../topology/local-3-regions.toml");
        let text = std::fs::read_to_string(&path)
            .expect("topology")
            .replacen(
                "id = \"euw1-a\"",
                "id = \"euw1-a\"\n    address = \"127.0.0.1:7101\"",
                1,
            )
            .replacen("rtt_ms = 149.3", "rtt_ms = 149.3\nbandwidth_mbps = 100", 1);
        pangea_topology::Deployment::parse(&path, &text, None).expect("deployment")
    }

    /// Each link's windows come from its round trip and bandwidth in the topology;
    /// inside a region they are the defaults.
    #[test]
    fn peer_links_get_the_windows_of_their_bandwidth_delay_product() {
        let d = deployment();
        let w = |a: &str, b: &str| link_windows(&d, &ReplicaId::from(a), &ReplicaId::from(b));
        assert_eq!(w("use1-a", "use1-b"), tls::Windows::DEFAULT);
        // Dublin – Tokyo, 201 ms at the default 1 Gbit/s: 25.1 MB a round trip.
        assert_eq!(
            w("euw1-a", "apne1-b"),
            tls::Windows::for_link(201.0, 1_000.0)
        );
        assert_eq!(w("euw1-a", "apne1-b").stream_bytes, 25_125_000);
        assert_eq!(w("apne1-b", "euw1-a"), w("euw1-a", "apne1-b"));
        // Virginia – Tokyo is declared at 100 Mbit/s: 1.9 MB, the defaults.
        assert_eq!(w("use1-a", "apne1-a"), tls::Windows::DEFAULT);
        assert_eq!(w("use1-a", "nobody"), tls::Windows::DEFAULT);
    }

    /// An accepted connection is a peer's when it comes from a replica's address.
    #[test]
    fn a_peer_is_known_by_its_address() {
        let d = deployment();
        let at = |a: &str| replica_at(&d, a.parse().expect("address"));
        assert_eq!(at("127.0.0.1:7101"), Some(ReplicaId::from("euw1-a")));
        assert_eq!(at("127.0.0.1:7102"), None);
    }
}
