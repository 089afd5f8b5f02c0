//! Pangea's transport: QUIC (quinn) with mutual TLS (rustls, *ring*), the frame
//! codec, cluster certificates, connection admission, and WAN emulation for local
//! clusters.
//!
//! Every connection between Pangea processes — replica to replica, frontend to
//! replica, operator tool or batch loader to replica — is QUIC with mutual TLS 1.3
//! against one cluster CA. A peer's identity (which replica in which region, which
//! client or loader acting for which app profile, which operator) is a URI in its
//! certificate, read back after the handshake; nothing the peer *says* in a frame
//! is trusted for identity. A process loading its own certificate checks that it
//! holds the identity the process runs as.
//!
//! This crate holds mechanisms only: it does not decide what to send or to whom
//! (that is `pangea-core`), nor run a server loop (that is `pangea-node`).
//!
//! # Modules
//!
//! - [`certs`]: create the cluster CA and issue replica, client, operator and loader
//!   certificates as PEM files (rcgen); load them for rustls.
//! - [`rotation`]: day-2 file operations: re-issue leaves, revoke them (CRL), and
//!   rotate the CA through a dual-CA trust bundle.
//! - [`reload`]: [`LiveTls`]: certificate, trust bundle and CRL that a running
//!   process reloads (poll or SIGHUP) without restarting, each time checking that
//!   the certificate is still the process's own identity; connections whose peer
//!   certificate stops verifying are closed.
//! - [`identity`]: [`PeerIdentity`] from a certificate or a live connection (the
//!   four identity URIs are documented there), and [`Credential`], the certificate a
//!   client, operator tool or loader presents.
//! - [`tls`]: rustls server/client configurations (client certificates required,
//!   TLS 1.3, ALPN `pangea/1`, no 0-RTT) and quinn configurations with our
//!   transport limits.
//! - [`endpoint`]: [`bind_endpoint`]: a quinn endpoint on a socket with large
//!   buffers, optionally behind the WAN emulator.
//! - [`admission`]: which incoming connection attempts a replica takes on: a
//!   stateless Retry under load, caps on handshakes and connections in total and
//!   per source address.
//! - [`frame`]: 4-byte length-prefixed protobuf frames over QUIC streams, with a
//!   size limit checked before allocation and a byte budget per connection and
//!   process ([`FrameBudget`]); pure encode/decode for fuzzing.
//! - [`wan`]: per-destination delay, jitter, loss and partitions in the socket
//!   layer (no root, no netem), changeable at runtime through [`WanControl`].
//! - [`reset`]: [`ResetKey`], a stateless-reset key kept across restarts so a
//!   restarted replica resets its old connections instead of leaving them to time out.
//! - [`backoff`]: seeded exponential backoff with full jitter for reconnects.
//! - [`error`]: the crate's [`Error`].
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(dir: &std::path::Path) -> pangea_net::Result<()> {
//! use pangea_net::{certs, tls, bind_endpoint};
//! certs::init_ca(dir)?;
//! certs::issue_replica(dir, "us-east1-a", "us-east1")?;
//! let ca = certs::load_ca(dir)?;
//! let server = tls::server_config(&ca, certs::load_replica(dir, "us-east1-a")?)?;
//! let client = tls::client_config(&ca, certs::load_replica(dir, "us-east1-a")?)?;
//! let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
//! let endpoint = bind_endpoint(addr, Some(server), client, None, None)?;
//! # drop(endpoint); Ok(()) }
//! ```

pub mod admission;
pub mod backoff;
pub mod certs;
pub mod congestion;
pub mod endpoint;
pub mod error;
pub mod frame;
pub mod gso;
pub mod handshake;
pub mod identity;
pub mod reload;
pub mod reset;
pub mod rotation;
pub mod socket;
pub mod tls;
pub mod wan;

pub use backoff::Backoff;
pub use certs::CertBundle;
pub use endpoint::{bind_endpoint, bind_udp_socket, endpoint_on_socket};
pub use error::{Error, Result};
pub use frame::{
    BudgetPermit, FRAME_BYTES_MAX, FrameBudget, decode_frame, encode_frame, read_answer,
    read_frame, read_frame_within, write_frame, write_frame_pair,
};
pub use identity::{Credential, PeerIdentity, peer_identity};
pub use reload::{ExpectedIdentity, LiveTls, TlsFiles};
pub use reset::ResetKey;
pub use wan::{LinkRule, WanControl, WanEmulator, WanSocket, WanStats};
