//! rustls and quinn configurations: mutual TLS 1.3 against the cluster CA.
//!
//! - Crypto is rustls's *ring* provider, passed explicitly (never the process
//!   default, which another crate could have set to aws-lc-rs).
//! - TLS 1.3 only (QUIC requires it anyway); ALPN [`ALPN_PANGEA_V1`].
//! - Servers *require* a client certificate signed by the cluster CA
//!   (`WebPkiClientVerifier`); clients verify the server against the same CA and
//!   nothing else (no system roots: a public CA must not be able to mint a replica).
//! - 0-RTT is off on both sides: 0-RTT data can be replayed, and a replayed mutation
//!   or replication frame is not something we want to reason about. The cost is one
//!   RTT per new connection, paid rarely since connections are long-lived.
//! - TLS session resumption is off on both sides: a resumed session skips
//!   certificate verification, so a peer whose certificate was revoked (or whose CA
//!   was dropped from the bundle) could reconnect on an old ticket. Every
//!   connection pays a full handshake instead, again rarely.
//!
//! The configurations here are fixed at build time. A running replica or client
//! uses [`crate::reload::LiveTls`] instead, whose configurations read the current
//! certificate, trust bundle and CRL on every handshake.
//!
//! The transport limits below are starting points sized for the design's workload
//! (values up to 1 MiB, frames up to [`crate::frame::FRAME_BYTES_MAX`], WAN RTTs up to
//! ~300 ms); each names its unit and why.

use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{IdleTimeout, TransportConfig, VarInt};
use rustls::pki_types::CertificateDer;

use crate::certs::{CertBundle, replica_dns_name};
use crate::error::Result;

/// The application protocol negotiated by ALPN. A peer speaking anything else (or
/// a future incompatible `pangea/2`) fails the handshake instead of misparsing frames.
pub const ALPN_PANGEA_V1: &[u8] = b"pangea/1";

/// How often an idle connection sends a keep-alive. Well under
/// [`IDLE_TIMEOUT_MS`] so that a few lost keep-alives do not kill a healthy link,
/// and short enough that NAT and firewall state stays warm.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);

/// A connection that hears nothing for this long is dead. This bounds how long a
/// replica keeps routing to a peer that vanished (partition, crash) before failing
/// over; 10 s tolerates several seconds of loss without flapping.
pub const IDLE_TIMEOUT_MS: u32 = 10_000;

/// Concurrent bidirectional streams a peer may open on one connection. A stream
/// carries one client request at a time (then the next), so this is the in-flight
/// request cap per frontend connection (further requests wait for a slot, which is
/// backpressure).
pub const BIDI_STREAMS_MAX: u32 = 256;

/// Concurrent unidirectional streams a peer may open: replication uses a handful
/// of long-lived streams per tree edge.
pub const UNI_STREAMS_MAX: u32 = 16;

/// Bytes a peer may send on one stream ahead of our reading: 2 MiB, twice the
/// largest common value (1 MiB), so a 1 MiB value is never stalled waiting for a
/// stream window update, even across a 300 ms RTT.
pub const STREAM_RECEIVE_WINDOW_BYTES: u32 = 2 * 1024 * 1024;

/// Bytes a peer may have in flight on the whole connection: 16 MiB, eight full
/// stream windows. Also the worst-case unread buffer per connection, which bounds
/// memory per peer.
pub const CONNECTION_RECEIVE_WINDOW_BYTES: u32 = 16 * 1024 * 1024;

/// Bytes we keep buffered for sending on one connection (matches the receive side).
pub const SEND_WINDOW_BYTES: u64 = 16 * 1024 * 1024;

/// The largest UDP payload path-MTU discovery probes for: jumbo frames (9,000-byte
/// MTU less the IPv4 and UDP headers, rounded down to a multiple of 8). Paths that
/// carry less stop below it (probes that are lost are not counted as congestion);
/// loopback and jumbo-frame links inside a region reach it.
pub const MTU_UPPER_BOUND: u16 = 8_952;

/// Ack-eliciting packets a peer may receive from us before it must acknowledge
/// them at once (the QUIC ACK-frequency extension, which quinn speaks to quinn;
/// its default is 1, an ACK for every second packet). A client reading a wave of
/// small answers, two or three jumbo packets per connection, otherwise sends an
/// ACK-only datagram just before the wave of requests that carries the same ACK
/// anyway: 40 % of its `sendmsg` calls at 32 requests in flight. Kept low, so that
/// a large answer is still acknowledged every fourth packet while it arrives; a
/// sender in slow start sends at least the initial window's ten packets a round
/// trip ([`crate::congestion::TenPackets`]) and is never left waiting for the
/// delay below.
pub const ACK_ELICITING_THRESHOLD: u32 = 3;

/// How long a peer may hold an acknowledgement we asked it to delay: quinn's
/// timer granularity, the least a peer must accept. Fewer than
/// [`ACK_ELICITING_THRESHOLD`] packets of an idle moment are acknowledged within it.
pub const ACK_DELAY_MAX: Duration = Duration::from_millis(1);

/// The TLS server name a client should use to dial replica `replica_id`.
///
/// The replica id itself when it is a valid DNS name (every replica certificate
/// carries its id as a DNS SAN then): the handshake then fails unless the server
/// holds *that* replica's certificate, which catches a stale address book before
/// any frame is sent. Otherwise `localhost`, which every replica certificate
/// carries; callers must then rely on [`crate::identity::peer_identity`] after the
/// handshake (which they should check in any case: the URI SAN is the identity).
pub fn server_name(replica_id: &str) -> &str {
    replica_dns_name(replica_id).unwrap_or("localhost")
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A root store of every CA in `cas` (a trust bundle).
pub(crate) fn roots(cas: &[CertificateDer<'static>]) -> Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(ca.clone())?;
    }
    Ok(Arc::new(roots))
}

/// Settings every Pangea server configuration shares (see the module doc): ALPN,
/// no 0-RTT, no session resumption.
pub(crate) fn harden_server(config: &mut rustls::ServerConfig) {
    config.alpn_protocols = vec![ALPN_PANGEA_V1.to_vec()];
    // No 0-RTT (QUIC allows only 0 or u32::MAX here).
    config.max_early_data_size = 0;
    // No resumption: every handshake verifies the client certificate afresh.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
}

/// Settings every Pangea client configuration shares: ALPN, no 0-RTT, no resumption.
pub(crate) fn harden_client(config: &mut rustls::ClientConfig) {
    config.alpn_protocols = vec![ALPN_PANGEA_V1.to_vec()];
    // The default, stated: never send 0-RTT data.
    config.enable_early_data = false;
    config.resumption = rustls::client::Resumption::disabled();
}

/// rustls server configuration: presents `own`, requires a client certificate
/// chaining to `ca`.
pub fn server_crypto(
    ca: &CertificateDer<'static>,
    own: CertBundle,
) -> Result<rustls::ServerConfig> {
    server_crypto_bundle(std::slice::from_ref(ca), own)
}

/// [`server_crypto`] trusting every CA of a bundle.
pub fn server_crypto_bundle(
    cas: &[CertificateDer<'static>],
    own: CertBundle,
) -> Result<rustls::ServerConfig> {
    let provider = provider();
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(cas)?, provider.clone())
            .build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(own.chain, own.key)?;
    harden_server(&mut config);
    Ok(config)
}

/// rustls client configuration: presents `own` (a client or replica certificate),
/// trusts only `ca`.
pub fn client_crypto(
    ca: &CertificateDer<'static>,
    own: CertBundle,
) -> Result<rustls::ClientConfig> {
    client_crypto_bundle(std::slice::from_ref(ca), own)
}

/// [`client_crypto`] trusting every CA of a bundle.
pub fn client_crypto_bundle(
    cas: &[CertificateDer<'static>],
    own: CertBundle,
) -> Result<rustls::ClientConfig> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(cas)?)
        .with_client_auth_cert(own.chain, own.key)?;
    harden_client(&mut config);
    Ok(config)
}

/// Bandwidth assumed for a link whose topology entry states none (`bandwidth_mbps`
/// of a `[[links]]` entry): 1 Gbit/s.
pub const LINK_BANDWIDTH_DEFAULT_MBPS: f64 = 1_000.0;

/// The largest stream window a link gets whatever its bandwidth-delay product.
pub const STREAM_RECEIVE_WINDOW_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// The largest connection window a link gets: the most one peer connection may
/// hold unread, so it bounds memory per peer.
pub const CONNECTION_RECEIVE_WINDOW_MAX_BYTES: u64 = 128 * 1024 * 1024;

/// Flow-control windows of a connection: what the peer may send ahead of our
/// reading, on one stream and on them all (and what we keep buffered to send).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    pub stream_bytes: u64,
    pub connection_bytes: u64,
}

impl Windows {
    /// Every connection's unless its link asks for more: clients are in their
    /// replica's region, where these are far above the bandwidth-delay product.
    pub const DEFAULT: Windows = Windows {
        stream_bytes: STREAM_RECEIVE_WINDOW_BYTES as u64,
        connection_bytes: CONNECTION_RECEIVE_WINDOW_BYTES as u64,
    };

    /// A replication link of `rtt_ms` round trip carrying `bandwidth_mbps`: one
    /// stream may keep the link full for a round trip (its bandwidth-delay
    /// product), the connection twice that (the replication stream and the
    /// snapshot stream at once). Never below [`Windows::DEFAULT`], never above the
    /// caps. A 2 MiB stream window lets one stream carry 56 Mbit/s across a 300 ms
    /// round trip; the product of 1 Gbit/s and 300 ms is 37.5 MB.
    pub fn for_link(rtt_ms: f64, bandwidth_mbps: f64) -> Windows {
        let bdp = (bandwidth_mbps.max(0.0) * 1e6 / 8.0 * rtt_ms.max(0.0) / 1e3) as u64;
        Windows {
            stream_bytes: bdp.clamp(Self::DEFAULT.stream_bytes, STREAM_RECEIVE_WINDOW_MAX_BYTES),
            connection_bytes: bdp.saturating_mul(2).clamp(
                Self::DEFAULT.connection_bytes,
                CONNECTION_RECEIVE_WINDOW_MAX_BYTES,
            ),
        }
    }
}

/// QUIC transport parameters shared by both sides (see the constants above).
pub fn transport_config() -> TransportConfig {
    transport_config_with(Windows::DEFAULT)
}

/// [`transport_config`] with the flow-control windows of a link.
pub fn transport_config_with(windows: Windows) -> TransportConfig {
    let clamp32 = |b: u64| VarInt::from_u32(u32::try_from(b).unwrap_or(u32::MAX));
    let mut transport = TransportConfig::default();
    transport
        .keep_alive_interval(Some(KEEP_ALIVE_INTERVAL))
        .max_idle_timeout(Some(IdleTimeout::from(VarInt::from_u32(IDLE_TIMEOUT_MS))))
        .max_concurrent_bidi_streams(VarInt::from_u32(BIDI_STREAMS_MAX))
        .max_concurrent_uni_streams(VarInt::from_u32(UNI_STREAMS_MAX))
        .stream_receive_window(clamp32(windows.stream_bytes))
        .receive_window(clamp32(windows.connection_bytes))
        .send_window(windows.connection_bytes.max(SEND_WINDOW_BYTES));
    let mut mtu_discovery = quinn::MtuDiscoveryConfig::default();
    mtu_discovery.upper_bound(MTU_UPPER_BOUND);
    transport.mtu_discovery_config(Some(mtu_discovery));
    let mut acks = quinn::AckFrequencyConfig::default();
    acks.ack_eliciting_threshold(VarInt::from_u32(ACK_ELICITING_THRESHOLD))
        .max_ack_delay(Some(ACK_DELAY_MAX));
    transport
        .ack_frequency_config(Some(acks))
        .congestion_controller_factory(Arc::new(crate::congestion::TenPacketsFactory));
    transport
}

/// quinn server configuration from [`server_crypto`] and [`transport_config`].
pub fn server_config(ca: &CertificateDer<'static>, own: CertBundle) -> Result<quinn::ServerConfig> {
    quic_server(server_crypto(ca, own)?)
}

/// quinn client configuration from [`client_crypto`] and [`transport_config`].
pub fn client_config(ca: &CertificateDer<'static>, own: CertBundle) -> Result<quinn::ClientConfig> {
    quic_client(client_crypto(ca, own)?)
}

/// A quinn server configuration around `crypto`, with [`transport_config`].
pub fn quic_server(crypto: rustls::ServerConfig) -> Result<quinn::ServerConfig> {
    let crypto = QuicServerConfig::try_from(crypto)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config
        .transport_config(Arc::new(transport_config()))
        // Connection attempts not yet decided on (`admission` decides each as it
        // arrives, so few wait): fewer, and less buffered, than quinn's defaults.
        .max_incoming(INCOMING_MAX)
        .incoming_buffer_size(INCOMING_BUFFER_BYTES)
        .incoming_buffer_size_total(INCOMING_BUFFER_TOTAL_BYTES);
    Ok(config)
}

/// Connection attempts a server holds undecided at most (quinn's default: 65,536).
pub const INCOMING_MAX: usize = 4_096;
/// Bytes buffered for one undecided attempt beyond its first packet (10 MiB).
pub const INCOMING_BUFFER_BYTES: u64 = 64 * 1024;
/// ... and for all of them (100 MiB).
pub const INCOMING_BUFFER_TOTAL_BYTES: u64 = 8 * 1024 * 1024;

/// A quinn client configuration around `crypto`, with [`transport_config`].
pub fn quic_client(crypto: rustls::ClientConfig) -> Result<quinn::ClientConfig> {
    let crypto = QuicClientConfig::try_from(crypto)?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport_config()));
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs;
    use crate::error::Error;

    /// A link's windows are its bandwidth-delay product, between the defaults and
    /// the caps.
    #[test]
    fn link_windows_follow_the_bandwidth_delay_product() {
        // Inside a region: far below the defaults.
        assert_eq!(Windows::for_link(1.0, 10_000.0), Windows::DEFAULT);
        // Across the Pacific at 1 Gbit/s: 37.5 MB a round trip.
        let w = Windows::for_link(300.0, LINK_BANDWIDTH_DEFAULT_MBPS);
        assert_eq!(w.stream_bytes, 37_500_000);
        assert_eq!(w.connection_bytes, 75_000_000);
        // A 10 Gbit/s link at 300 ms: capped.
        let w = Windows::for_link(300.0, 10_000.0);
        assert_eq!(
            (w.stream_bytes, w.connection_bytes),
            (
                STREAM_RECEIVE_WINDOW_MAX_BYTES,
                CONNECTION_RECEIVE_WINDOW_MAX_BYTES
            )
        );
        // Nonsense in, defaults out.
        assert_eq!(Windows::for_link(f64::NAN, -5.0), Windows::DEFAULT);
    }

    #[test]
    fn configs_build_from_issued_certificates() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })?;
        certs::init_ca(dir.path())?;
        certs::issue_replica(dir.path(), "r1", "eu")?;
        certs::issue_client(dir.path(), "c1", "serving")?;
        let ca = certs::load_ca(dir.path())?;
        let server = server_crypto(&ca, certs::load_replica(dir.path(), "r1")?)?;
        assert_eq!(server.max_early_data_size, 0);
        assert_eq!(server.alpn_protocols, vec![ALPN_PANGEA_V1.to_vec()]);
        let client = client_crypto(&ca, certs::load_client(dir.path(), "c1")?)?;
        assert!(!client.enable_early_data);
        server_config(&ca, certs::load_replica(dir.path(), "r1")?)?;
        client_config(&ca, certs::load_client(dir.path(), "c1")?)?;
        Ok(())
    }

    #[test]
    fn server_names() {
        assert_eq!(server_name("us-east1-a"), "us-east1-a");
        assert_eq!(server_name("r_1"), "localhost");
    }
}
