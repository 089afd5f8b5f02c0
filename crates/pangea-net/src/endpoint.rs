//! QUIC endpoints on a UDP socket we configure ourselves.
//!
//! quinn's `Endpoint::server`/`client` bind with the kernel's default socket
//! buffers (about 208 KiB on Linux). A replica receiving a burst of 100 KiB or
//! more — a few 1 MiB values, a replication batch, a snapshot chunk — from several
//! peers at once overflows that receive buffer, and the kernel silently drops the
//! excess; QUIC then sees loss, halves its congestion window and retransmits,
//! which shows up as latency spikes that look like WAN trouble. So we create the
//! socket with socket2, ask for [`SOCKET_BUFFER_BYTES`] each way, read back what the
//! kernel granted and warn if it is less (raise `net.core.rmem_max` and
//! `net.core.wmem_max` to fix it).

use std::net::SocketAddr;
use std::sync::Arc;

use quinn::AsyncUdpSocket;
use socket2::{Domain, Protocol, Socket, Type};

use crate::error::{Error, Result};
use crate::gso::GsoBatches;
use crate::reset::ResetKey;
use crate::socket::DrainingSocket;
use crate::wan::WanEmulator;

/// Send and receive buffer size we request for every QUIC socket: 8 MiB, room for
/// several concurrent 1 MiB bursts from different peers between two reads.
pub const SOCKET_BUFFER_BYTES: usize = 8 * 1024 * 1024;

/// Creates a non-blocking UDP socket bound to `addr` with [`SOCKET_BUFFER_BYTES`]
/// buffers (warning if the kernel grants less).
pub fn bind_udp_socket(addr: SocketAddr) -> Result<std::net::UdpSocket> {
    let socket_error = |source| Error::Socket { addr, source };
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(socket_error)?;
    // Failing to enlarge a buffer is not fatal (the socket works, just lossier
    // under bursts); the read-back below reports it.
    if let Err(e) = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES) {
        tracing::warn!(%addr, error = %e, "cannot set UDP send buffer size");
    }
    if let Err(e) = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES) {
        tracing::warn!(%addr, error = %e, "cannot set UDP receive buffer size");
    }
    // Linux reports twice the size it books (it counts its own overhead), so a
    // granted request reads back as at least what we asked; a capped one as less.
    let send_bytes = socket.send_buffer_size().map_err(socket_error)?;
    let recv_bytes = socket.recv_buffer_size().map_err(socket_error)?;
    if send_bytes < SOCKET_BUFFER_BYTES || recv_bytes < SOCKET_BUFFER_BYTES {
        tracing::warn!(
            %addr,
            requested_bytes = SOCKET_BUFFER_BYTES,
            send_bytes,
            recv_bytes,
            "kernel granted smaller UDP buffers than requested; bursts may be dropped \
             (raise net.core.rmem_max and net.core.wmem_max)"
        );
    }
    socket.set_nonblocking(true).map_err(socket_error)?;
    socket.bind(&addr.into()).map_err(socket_error)?;
    Ok(socket.into())
}

/// Binds a QUIC endpoint on `addr` (port 0 picks a free port; read it back with
/// `endpoint.local_addr()`).
///
/// - `server_config`: `Some` to accept connections (replicas), `None` for a
///   dial-only endpoint (frontends).
/// - `client_config`: used for every outgoing connection; every Pangea endpoint
///   dials (replicas dial their tree neighbours), so it is required.
/// - `wan`: `Some` to emulate WAN conditions on outgoing datagrams (local clusters).
/// - `reset_key`: the stateless-reset key; replicas pass the one kept in their data
///   directory so that after a restart their old connections are reset at once
///   (see [`crate::reset`]); `None` draws a random one (dial-only endpoints).
///
/// Must be called within a tokio runtime with I/O enabled: the socket is
/// registered with it and the endpoint's driver (and the WAN sender) run on it.
pub fn bind_endpoint(
    addr: SocketAddr,
    server_config: Option<quinn::ServerConfig>,
    client_config: quinn::ClientConfig,
    wan: Option<WanEmulator>,
    reset_key: Option<&ResetKey>,
) -> Result<quinn::Endpoint> {
    // Checked before binding, so that a misuse does not hold a port.
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::NoRuntime("bind_endpoint"));
    }
    on_socket(
        bind_udp_socket(addr)?,
        server_config,
        client_config,
        wan,
        reset_key,
    )
}

/// A QUIC endpoint on a UDP socket bound elsewhere: by [`bind_udp_socket`] in a parent
/// process that handed it down (`pangea cluster up`), or by a test that must know the
/// port before the replica starts. Otherwise as [`bind_endpoint`].
pub fn endpoint_on_socket(
    std_socket: std::net::UdpSocket,
    server_config: Option<quinn::ServerConfig>,
    client_config: quinn::ClientConfig,
    wan: Option<WanEmulator>,
    reset_key: Option<&ResetKey>,
) -> Result<quinn::Endpoint> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::NoRuntime("endpoint_on_socket"));
    }
    on_socket(std_socket, server_config, client_config, wan, reset_key)
}

/// [`endpoint_on_socket`] once the runtime is known to be there.
fn on_socket(
    std_socket: std::net::UdpSocket,
    server_config: Option<quinn::ServerConfig>,
    client_config: quinn::ClientConfig,
    wan: Option<WanEmulator>,
    reset_key: Option<&ResetKey>,
) -> Result<quinn::Endpoint> {
    let addr = std_socket.local_addr().map_err(|source| Error::Socket {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let socket_error = |source| Error::Socket { addr, source };
    std_socket.set_nonblocking(true).map_err(socket_error)?;
    let runtime = Arc::new(quinn::TokioRuntime);
    let real: Arc<dyn AsyncUdpSocket> =
        GsoBatches::wrap(DrainingSocket::new(std_socket).map_err(socket_error)?);
    let socket: Arc<dyn AsyncUdpSocket> = match wan {
        Some(wan) => wan.wrap(real)?,
        None => real,
    };
    let mut endpoint_config = match reset_key {
        Some(key) => key.endpoint_config(),
        None => quinn::EndpointConfig::default(),
    };
    // Peers may send us datagrams as large as path-MTU discovery may go.
    endpoint_config
        .max_udp_payload_size(crate::tls::MTU_UPPER_BOUND)
        .expect("the MTU upper bound is a valid UDP payload size");
    let mut endpoint =
        quinn::Endpoint::new_with_abstract_socket(endpoint_config, server_config, socket, runtime)
            .map_err(socket_error)?;
    endpoint.set_default_client_config(client_config);
    Ok(endpoint)
}
