//! Test harness: a throwaway PKI and a small echo server.
//!
//! The echo server is the least server that exercises the transport: it accepts
//! connections, reports each peer's identity, and on every bidirectional stream
//! echoes `ClientRequest` frames back until the stream ends, reporting any frame
//! error it meets (then resetting only that stream, so others keep working).

#![allow(dead_code, unreachable_pub)] // Each test binary uses a different subset.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use pangea_net::{
    PeerIdentity, WanEmulator, bind_endpoint, certs, peer_identity, read_frame, tls, write_frame,
};
use pangea_proto::v1::ClientRequest;
use rustls::pki_types::CertificateDer;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Upper bound on any single wait in these tests, so a bug fails instead of hanging.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(10);

pub const SERVER_REPLICA: &str = "us-east1-a";
pub const SERVER_REGION: &str = "us-east1";
pub const CLIENT_NAME: &str = "frontend-1";
pub const CLIENT_PROFILE: &str = "serving";

/// A CA with one replica and one client certificate in a temporary directory.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: CertificateDer<'static>,
}

impl Pki {
    pub fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        certs::init_ca(dir.path())?;
        certs::issue_replica(dir.path(), SERVER_REPLICA, SERVER_REGION)?;
        certs::issue_client(dir.path(), CLIENT_NAME, CLIENT_PROFILE)?;
        let ca = certs::load_ca(dir.path())?;
        Ok(Self { dir, ca })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn replica_server_config(&self) -> Result<quinn::ServerConfig> {
        Ok(tls::server_config(
            &self.ca,
            certs::load_replica(self.path(), SERVER_REPLICA)?,
        )?)
    }

    pub fn replica_client_config(&self) -> Result<quinn::ClientConfig> {
        Ok(tls::client_config(
            &self.ca,
            certs::load_replica(self.path(), SERVER_REPLICA)?,
        )?)
    }

    pub fn client_config(&self) -> Result<quinn::ClientConfig> {
        Ok(tls::client_config(
            &self.ca,
            certs::load_client(self.path(), CLIENT_NAME)?,
        )?)
    }
}

pub fn localhost() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// What the echo server saw.
#[derive(Debug)]
pub enum ServerEvent {
    /// A handshake completed; the client is this identity.
    Accepted(PeerIdentity),
    /// A handshake failed (e.g. the client certificate was refused).
    HandshakeFailed(String),
    /// Reading a frame failed on one stream.
    StreamError(pangea_net::Error),
}

pub struct EchoServer {
    pub endpoint: quinn::Endpoint,
    pub events: mpsc::UnboundedReceiver<ServerEvent>,
    task: JoinHandle<()>,
}

impl EchoServer {
    /// Starts the replica `SERVER_REPLICA` on 127.0.0.1, port 0, reading frames of
    /// at most `limit_bytes`.
    pub fn start(pki: &Pki, limit_bytes: usize, wan: Option<WanEmulator>) -> Result<Self> {
        let socket = pangea_net::bind_udp_socket(localhost())?;
        Self::start_on(pki, socket, limit_bytes, wan, None)
    }

    /// As [`EchoServer::start`], on a socket bound by the caller and with a given
    /// stateless-reset key (`None`: a random one).
    pub fn start_on(
        pki: &Pki,
        socket: std::net::UdpSocket,
        limit_bytes: usize,
        wan: Option<WanEmulator>,
        reset_key: Option<&pangea_net::ResetKey>,
    ) -> Result<Self> {
        let endpoint = pangea_net::endpoint_on_socket(
            socket,
            Some(pki.replica_server_config()?),
            pki.replica_client_config()?,
            wan,
            reset_key,
        )?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(accept_loop(endpoint.clone(), limit_bytes, events_tx));
        Ok(Self {
            endpoint,
            events,
            task,
        })
    }

    pub fn addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// The next event, or an error after `TEST_TIMEOUT`.
    pub async fn next_event(&mut self) -> Result<ServerEvent> {
        tokio::time::timeout(TEST_TIMEOUT, self.events.recv())
            .await
            .context("no server event in time")?
            .context("server event channel closed")
    }

    pub async fn shutdown(self) {
        self.endpoint.close(0u32.into(), b"test over");
        self.task.abort();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
    }
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    limit_bytes: usize,
    events: mpsc::UnboundedSender<ServerEvent>,
) {
    while let Some(incoming) = endpoint.accept().await {
        let events = events.clone();
        tokio::spawn(async move {
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => {
                    let _ = events.send(ServerEvent::HandshakeFailed(e.to_string()));
                    return;
                }
            };
            match peer_identity(&conn) {
                Ok(identity) => {
                    let _ = events.send(ServerEvent::Accepted(identity));
                }
                Err(e) => {
                    let _ = events.send(ServerEvent::HandshakeFailed(e.to_string()));
                    conn.close(1u32.into(), b"no identity");
                    return;
                }
            }
            while let Ok((send, recv)) = conn.accept_bi().await {
                tokio::spawn(echo_stream(send, recv, limit_bytes, events.clone()));
            }
        });
    }
}

async fn echo_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    limit_bytes: usize,
    events: mpsc::UnboundedSender<ServerEvent>,
) {
    loop {
        match read_frame::<ClientRequest>(&mut recv, limit_bytes).await {
            Ok(Some(msg)) => {
                if let Err(e) = write_frame(&mut send, &msg).await {
                    let _ = events.send(ServerEvent::StreamError(e));
                    return;
                }
            }
            Ok(None) => {
                let _ = send.finish();
                return;
            }
            Err(e) => {
                let _ = events.send(ServerEvent::StreamError(e));
                // Only this stream is abandoned; the connection serves on.
                let _ = recv.stop(1u32.into());
                let _ = send.reset(1u32.into());
                return;
            }
        }
    }
}

/// A dial-only endpoint on 127.0.0.1 with `config`.
pub fn client_endpoint(
    config: quinn::ClientConfig,
    wan: Option<WanEmulator>,
) -> Result<quinn::Endpoint> {
    Ok(bind_endpoint(localhost(), None, config, wan, None)?)
}

/// Connects to the echo server as `SERVER_REPLICA`'s TLS name.
pub async fn connect(endpoint: &quinn::Endpoint, server: SocketAddr) -> Result<quinn::Connection> {
    let connecting = endpoint.connect(server, tls::server_name(SERVER_REPLICA))?;
    Ok(tokio::time::timeout(TEST_TIMEOUT, connecting)
        .await
        .context("handshake timed out")??)
}

pub fn request(seq: u64) -> ClientRequest {
    ClientRequest {
        deadline_us: seq,
        app_profile: CLIENT_PROFILE.into(),
        traceparent: String::new(),
        known_watermarks: 0,
        request: None,
    }
}

/// One request on a fresh stream, answered by the echo (within `TEST_TIMEOUT`).
pub async fn round_trip(conn: &quinn::Connection, msg: &ClientRequest) -> Result<ClientRequest> {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (mut send, mut recv) = conn.open_bi().await?;
        write_frame(&mut send, msg).await?;
        send.finish()?;
        read_frame::<ClientRequest>(&mut recv, pangea_net::FRAME_BYTES_MAX)
            .await?
            .context("stream ended without a response")
    })
    .await
    .context("no response in time")?
}

/// Closes a client endpoint and waits (bounded) for it to go idle.
pub async fn close_client(endpoint: quinn::Endpoint) {
    endpoint.close(0u32.into(), b"test over");
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
}

/// rustls provider used by tests that build configurations by hand.
pub fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
