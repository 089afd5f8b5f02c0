//! The crate's one error type.
//!
//! Every variant says what went wrong in terms an operator can act on: file errors
//! name the path, limit errors name the size and the limit, identity errors name
//! the offending certificate field.

use std::path::PathBuf;

/// Errors of `pangea-net`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing a certificate or key file failed.
    #[error("{path}: {source}")]
    File {
        /// The file (or directory) involved.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// `init_ca` found an existing CA: overwriting it would orphan every
    /// certificate it signed, so we refuse.
    #[error(
        "{path} already exists: refusing to overwrite the cluster CA (delete it first to start a new cluster)"
    )]
    CaExists {
        /// The existing file.
        path: PathBuf,
    },

    /// A replica id, region, client, operator or loader name, or app profile is
    /// not acceptable.
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// Which kind of name ("replica id", "region", ...).
        what: &'static str,
        /// The rejected name (escaped by `Debug`, so control bytes stay visible).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A PEM file did not hold what we expected (no certificate, no key, bad PEM).
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },

    /// A key file (such as the stateless-reset key) exists but is not usable.
    #[error("{path}: {reason}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },

    /// rcgen failed to generate or sign a certificate.
    #[error("certificate generation failed: {0}")]
    CertGen(#[from] rcgen::Error),

    /// The system clock is outside the range a certificate can express.
    #[error("system clock is unusable for certificate validity: {0}")]
    Clock(String),

    /// Building a rustls configuration failed (bad key, unsupported protocol, ...).
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),

    /// Building a certificate verifier failed (e.g. empty or bad CA).
    #[error("certificate verifier: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),

    /// The rustls configuration cannot carry QUIC (missing the QUIC initial suite).
    #[error("QUIC TLS configuration: {0}")]
    QuicTls(#[from] quinn::crypto::rustls::NoInitialCipherSuite),

    /// The peer presented no certificate (cannot happen under mutual TLS once the
    /// handshake completed; reported rather than assumed).
    #[error("peer presented no certificate")]
    NoPeerCertificate,

    /// The peer's certificate could not be parsed as X.509.
    #[error("peer certificate is not valid X.509: {0}")]
    CertificateParse(String),

    /// The certificate carries no `pangea://` URI in its subject alternative names.
    #[error("certificate has no pangea:// identity URI in its subject alternative names")]
    MissingIdentity,

    /// The certificate carries more than one `pangea://` URI: which one is meant?
    #[error("certificate has {count} pangea:// identity URIs; exactly one is required")]
    AmbiguousIdentity {
        /// How many were found.
        count: usize,
    },

    /// The `pangea://` URI is not of a form we issue.
    #[error("malformed identity URI {uri:?}: {reason}")]
    MalformedIdentity {
        /// The URI as found in the certificate.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A frame announced a length above the reader's limit. Checked before any
    /// buffer for the body is allocated.
    #[error("frame of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes")]
    FrameTooLarge {
        /// The announced (or, when encoding, actual) body length.
        size_bytes: u64,
        /// The limit in force.
        limit_bytes: usize,
    },

    /// Reading the announced frame would take more memory for incomplete frames
    /// than the budget allows (per connection or per process); nothing was
    /// allocated for it.
    #[error(
        "a frame of {size_bytes} bytes does not fit the {scope} budget for incomplete frames: \
         {held_bytes} of {budget_bytes} bytes held; retry when fewer requests are in flight"
    )]
    OverBudget {
        size_bytes: usize,
        /// `connection` or `replica`.
        scope: &'static str,
        held_bytes: usize,
        budget_bytes: usize,
    },

    /// A frame's body did not arrive within the time allowed for it.
    #[error("frame of {expected_bytes} bytes not received within {after_ms} ms")]
    FrameTimeout {
        expected_bytes: usize,
        after_ms: u64,
    },

    /// The stream ended in the middle of a frame.
    #[error("truncated frame: stream ended after {received_bytes} of {expected_bytes} bytes")]
    FrameTruncated {
        /// Bytes the frame (header or body) should have had.
        expected_bytes: usize,
        /// Bytes actually received before the end of the stream.
        received_bytes: usize,
    },

    /// More bytes came on a stream than the one frame it was to carry (an
    /// answer, then nothing until the next request).
    #[error(
        "{extra_bytes} bytes past the end of a {frame_bytes}-byte frame that was to be the stream's last"
    )]
    FrameTrailing {
        /// The frame, prefix included.
        frame_bytes: usize,
        /// Bytes received after it.
        extra_bytes: usize,
    },

    /// A frame's body is not a valid protobuf message of the expected type.
    #[error("frame body does not decode: {0}")]
    FrameDecode(#[from] pangea_proto::prost::DecodeError),

    /// prost could not encode a message (its buffer could not grow).
    #[error("frame encoding: {0}")]
    FrameEncode(#[from] pangea_proto::prost::EncodeError),

    /// Writing to a QUIC stream failed (connection lost, stream stopped by peer).
    #[error("stream write: {0}")]
    StreamWrite(#[from] quinn::WriteError),

    /// Reading from a QUIC stream failed (connection lost, stream reset by peer).
    #[error("stream read: {0}")]
    StreamRead(#[from] quinn::ReadError),

    /// Creating, configuring or binding the UDP socket failed.
    #[error("UDP socket {addr}: {source}")]
    Socket {
        /// The address we tried to bind.
        addr: std::net::SocketAddr,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// No `<name>.pem` of the kinds looked for in the certificate directory.
    #[error(
        "no certificate named {name:?} in {dir} (looked in replicas/, clients/, operators/ \
         and loaders/)"
    )]
    NoSuchLeaf {
        /// The replica id, or client, operator or loader name asked for.
        name: String,
        /// The certificate directory.
        dir: PathBuf,
    },

    /// Leaves of several kinds are called `name`: the caller must say which.
    #[error(
        "several certificates are named {name:?} ({}): say which kind (--kind {})",
        kinds.join(", "),
        kinds.join("|")
    )]
    AmbiguousLeaf {
        /// The name.
        name: String,
        /// The kinds that have a leaf of that name (`replica`, `client`, ...).
        kinds: Vec<&'static str>,
    },

    /// A process's own certificate holds another identity than the one the
    /// process runs as (a file copied to the wrong place, or the wrong name
    /// configured). Checked when the certificate is loaded and at every reload; a
    /// reload refused for this keeps the current certificate.
    #[error("{path} holds the identity of {found}, not of {expected}")]
    WrongIdentity {
        /// The certificate file.
        path: PathBuf,
        /// The identity it holds (`client frontend-1 (app profile serving)`).
        found: String,
        /// The identity expected (`replica use1-a (region us-east-1)`,
        /// `operator alice`).
        expected: String,
    },

    /// A replica certificate was given where a client, operator or loader
    /// credential was expected: replica certificates are for replicas only.
    #[error(
        "{path} is a replica certificate (replica {replica}, region {region}); a client, \
         operator or loader certificate is needed"
    )]
    ReplicaCertificateAsCredential {
        /// The certificate file.
        path: PathBuf,
        /// The replica id it holds.
        replica: String,
        /// The region it holds.
        region: String,
    },

    /// Revoking needs the key of the CA that signed the certificate, and this
    /// directory has none (the CA was removed, or the certificate is foreign).
    #[error(
        "cannot revoke serial {serial}: its CA {issuer:?} has no key in {dir} (ca.key, ca-prev.key or ca-next.key)"
    )]
    NoIssuingKey {
        /// The certificate's serial (hex).
        serial: String,
        /// Its issuer's common name.
        issuer: String,
        /// The certificate directory.
        dir: PathBuf,
    },

    /// A CA rotation step was asked for in the wrong state (e.g. `promote`
    /// without `start`); the message says which step comes next.
    #[error("CA rotation: {0}")]
    RotationState(String),

    /// `rotate-ca finish` would remove a CA that leaves of the directory still
    /// come from: they would be refused everywhere.
    #[error(
        "CA rotation: {ca:?} still signed {}: re-issue them first (pangea certs reissue --all)",
        leaves.join(", ")
    )]
    CaStillInUse {
        /// The common name of the CA being removed.
        ca: String,
        /// The leaves it still signed (`replica r1`, `client c1`).
        leaves: Vec<String>,
    },

    /// A connection's peer certificate no longer verifies against the current trust
    /// bundle and CRL (see [`crate::reload::LiveTls::track`]); it was closed.
    #[error("peer certificate rejected: {0}")]
    PeerCertificateRejected(String),

    /// A thread the crate needs could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// An operation that spawns tasks or registers sockets ran outside a tokio runtime.
    #[error("no tokio runtime: {0} must be called from within a tokio runtime")]
    NoRuntime(&'static str),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
