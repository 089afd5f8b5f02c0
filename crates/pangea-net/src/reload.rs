//! Certificates that change under a running process: [`LiveTls`].
//!
//! A replica runs for years; its certificate, the trust bundle and the revocation
//! list change under it (a leaf re-issued, a key revoked, the CA rotated). A
//! [`LiveTls`] reads the four files of one identity — trust bundle `ca.pem`, CRL
//! `crl.pem` (optional), own certificate and key — and builds quinn configurations
//! whose certificate resolver and verifiers consult the *current* state on every
//! handshake. [`LiveTls::reload`] swaps that state (one `Arc` behind a lock); the
//! configurations, and so the endpoint, stay the same. So:
//!
//! - a replaced certificate is presented on the next handshake (server and client
//!   side alike);
//! - a changed bundle or CRL decides the next handshake (clients are verified by
//!   rustls's `WebPkiClientVerifier` with the CRLs, servers by `WebPkiServerVerifier`
//!   with them);
//! - connections that are already up were verified against the old state, so every
//!   reload re-verifies the peer certificate of each connection registered with
//!   [`LiveTls::track`] exactly as a new handshake would, and closes those that fail
//!   with application error [`CLOSE_CERTIFICATE_REVOKED`] or
//!   [`CLOSE_CERTIFICATE_UNTRUSTED`] (a warning is logged per connection, and
//!   the [`ReloadReport`] lists them for metrics);
//! - the same sweep checks the certificate *this* side presented on each tracked
//!   connection, and closes the connection if that certificate is now revoked. A
//!   replica tracks the connections it accepts, and every connection has a replica
//!   on its accepting side, so a connection authenticated by a revoked certificate
//!   is closed whichever side presented it, even when the dialling side (a peer's
//!   replication link, the client library) does not track its connections. Only
//!   revocation counts here: an own certificate that fails for another reason (its
//!   CA not yet in the local bundle during a CA rotation) is merely warned about at
//!   load, never a reason for a process to cut all its connections.
//!
//! Change detection ([`LiveTls::reload_if_changed`], run by [`spawn_poller`])
//! compares a fingerprint of the files' *contents*, not their modification times:
//! copies that keep mtimes (`cp -p`, `rsync -t`) and Kubernetes Secret volumes
//! (which swap a symlink) are caught too, and the files are a few KiB.
//!
//! The own certificate must hold the identity the process runs as
//! ([`TlsFiles::identity`], an [`ExpectedIdentity`]): a replica exactly
//! `pangea://replica/<its id>?region=<its region>`, a client, operator or loader
//! the kind and name of its [`Credential`]. [`LiveTls::load`] and every reload
//! check it, so a process refuses to start with another identity's certificate,
//! and a running one refuses to switch to one (a file copied to the wrong place):
//! the error names the file, what it holds and what was expected.
//!
//! A reload that fails (a file missing, a key that does not match its certificate
//! because a re-issue is between its two renames, a malformed CRL, a certificate of
//! another identity) changes nothing:
//! the process keeps its current state, logs why, and tries again on the next
//! poll. A malformed CRL therefore never *lifts* revocations.
//!
//! CRLs are authoritative for the CA that signed them; a certificate whose CA has
//! no CRL is accepted (there is nothing to revoke it by). A CRL's `nextUpdate` is
//! not enforced: a CRL is valid until replaced.

use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use rustls::client::ResolvesClientCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::certs::{ca_cert_path, crl_path, replica_cert_path, validate_name};
use crate::error::{Error, Result};
use crate::identity::{Credential, PeerIdentity};
use crate::rotation::CertInfo;
use crate::tls;

/// How often [`spawn_poller`] looks for changed files unless configured otherwise:
/// 30 s. With the sweep that follows each reload, a revoked certificate's
/// connections close within this interval plus a handshake-free re-verification
/// (milliseconds), well inside the 60 s the operations runbook promises.
pub const RELOAD_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);

/// Shortest poll interval accepted (shorter ones are raised to it): reading four
/// small files more often than ten times a second buys nothing.
pub const RELOAD_INTERVAL_MIN: Duration = Duration::from_millis(100);

/// QUIC application error code of a connection closed because the peer's
/// certificate is now listed in a CRL. (Codes 1-3 are the node's own.)
pub const CLOSE_CERTIFICATE_REVOKED: u32 = 4;

/// QUIC application error code of a connection closed because the peer's
/// certificate no longer verifies for another reason: its CA left the trust
/// bundle, or it expired.
pub const CLOSE_CERTIFICATE_UNTRUSTED: u32 = 5;

/// The files of one identity, and the identity its certificate must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The trust bundle (one or more CA certificates).
    pub bundle: PathBuf,
    /// The CRLs; a missing file means no revocations.
    pub crl: PathBuf,
    /// Own certificate chain, leaf first.
    pub cert: PathBuf,
    /// Own private key.
    pub key: PathBuf,
    /// Who the process is: the leaf of `cert` must hold this identity, at load and
    /// at every reload.
    pub identity: ExpectedIdentity,
}

impl TlsFiles {
    /// The files of replica `replica_id` of `region` in certificate directory
    /// `dir`; the certificate must be exactly
    /// `pangea://replica/<replica_id>?region=<region>`.
    pub fn replica(dir: &Path, replica_id: &str, region: &str) -> Result<Self> {
        validate_name("replica id", replica_id)?;
        validate_name("region", region)?;
        Ok(Self::leaf(
            dir,
            replica_cert_path(dir, replica_id),
            ExpectedIdentity::Replica {
                id: replica_id.to_owned(),
                region: region.to_owned(),
            },
        ))
    }

    /// The files of `credential` in certificate directory `dir` (`clients/`,
    /// `operators/` or `loaders/<name>.pem`); the certificate must be a client,
    /// operator or loader certificate of that kind and name.
    pub fn for_credential(dir: &Path, credential: &Credential) -> Result<Self> {
        credential.validate()?;
        Ok(Self::leaf(
            dir,
            credential.cert_path(dir),
            ExpectedIdentity::Credential(credential.clone()),
        ))
    }

    /// The files of client `name`: [`Self::for_credential`] with
    /// [`Credential::Client`].
    pub fn client(dir: &Path, name: &str) -> Result<Self> {
        Self::for_credential(dir, &Credential::Client(name.to_owned()))
    }

    fn leaf(dir: &Path, cert: PathBuf, identity: ExpectedIdentity) -> Self {
        Self {
            bundle: ca_cert_path(dir),
            crl: crl_path(dir),
            key: cert.with_extension("key"),
            cert,
            identity,
        }
    }
}

/// The identity a process's own certificate must hold (see the module
/// documentation). There is deliberately no "any": a process always knows who it
/// is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectedIdentity {
    /// Exactly this replica in this region.
    Replica {
        /// The replica id the process runs as.
        id: String,
        /// Its region in the topology.
        region: String,
    },
    /// A client, operator or loader certificate of the credential's kind and name
    /// (with any app profile: what it may act for is in the certificate).
    Credential(Credential),
}

impl ExpectedIdentity {
    /// Reads the identity of `leaf` (the certificate read from `path`) and checks
    /// that it is the expected one; returns it.
    pub fn check(&self, path: &Path, leaf: &CertificateDer<'_>) -> Result<PeerIdentity> {
        let found = PeerIdentity::from_certificate(leaf).map_err(|e| Error::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let held = match (self, &found) {
            (Self::Replica { id, region }, PeerIdentity::Replica { id: i, region: r }) => {
                id == i && region == r
            }
            (Self::Replica { .. }, _) => false,
            (Self::Credential(_), PeerIdentity::Replica { id, region }) => {
                return Err(Error::ReplicaCertificateAsCredential {
                    path: path.to_owned(),
                    replica: id.clone(),
                    region: region.clone(),
                });
            }
            (Self::Credential(credential), found) => credential.is_held_by(found),
        };
        if !held {
            return Err(Error::WrongIdentity {
                path: path.to_owned(),
                found: found.to_string(),
                expected: self.to_string(),
            });
        }
        Ok(found)
    }
}

impl std::fmt::Display for ExpectedIdentity {
    /// `replica <id> (region <region>)`, or the credential (`operator alice`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Replica { id, region } => write!(f, "replica {id} (region {region})"),
            Self::Credential(c) => write!(f, "{c}"),
        }
    }
}

/// What one successful reload did.
#[derive(Debug, Clone)]
pub struct ReloadReport {
    /// Serial of the certificate presented before the reload.
    pub previous_serial: String,
    /// Serial of the certificate presented from now on.
    pub serial: String,
    /// CA certificates now trusted.
    pub cas: usize,
    /// CRLs now in force.
    pub crls: usize,
    /// Connections closed because their peer's certificate no longer verifies.
    pub closed: Vec<ClosedConnection>,
}

/// A connection [`LiveTls`] closed after a reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedConnection {
    /// Who the peer was (its identity as its certificate states it).
    pub peer: String,
    /// True if the failing certificate is the one *this* side presented (then it is
    /// revoked); false if it is the peer's.
    pub local: bool,
    /// The serial of the failing certificate.
    pub serial: String,
    /// True if that certificate is revoked; false if it stopped verifying for
    /// another reason (see `reason`).
    pub revoked: bool,
    /// Why, as sent in the close frame.
    pub reason: String,
}

/// Which side of the handshake the peer of a tracked connection was.
#[derive(Debug, Clone)]
pub enum Side {
    /// We accepted the connection: the peer presented a client certificate.
    Accepted,
    /// We dialled it under this TLS server name: the peer presented a server
    /// certificate.
    Dialled(ServerName<'static>),
}

/// The state every handshake reads: swapped whole on reload.
struct Snapshot {
    own: Arc<CertifiedKey>,
    own_serial: String,
    /// The identity `own` holds (checked against [`TlsFiles::identity`]).
    own_identity: PeerIdentity,
    clients: Arc<dyn ClientCertVerifier>,
    servers: Arc<dyn ServerCertVerifier>,
    cas: usize,
    crls: usize,
}

/// The current [`Snapshot`], shared by the resolver and verifiers of the built
/// configurations and by [`LiveTls`].
struct Current(RwLock<Arc<Snapshot>>);

impl Current {
    fn get(&self) -> Arc<Snapshot> {
        // A poisoned lock still holds a complete snapshot (writers only swap an Arc).
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set(&self, snapshot: Arc<Snapshot>) {
        match self.0.write() {
            Ok(mut g) => *g = snapshot,
            Err(p) => *p.into_inner() = snapshot,
        }
    }
}

/// A connection registered for re-verification.
struct Tracked {
    connection: quinn::Connection,
    /// The chain the peer presented, leaf first.
    chain: Vec<CertificateDer<'static>>,
    side: Side,
    /// The peer's identity, for logs.
    peer: String,
    /// The serial of the peer's leaf.
    serial: String,
    /// The chain this side presented: the current one when the connection was
    /// registered, a few milliseconds after its handshake (quinn does not report
    /// the local certificate, and a rotation within that window is harmless: the
    /// older certificate is then simply not tracked).
    own_chain: Vec<CertificateDer<'static>>,
    own_serial: String,
}

/// Certificates, trust bundle and CRL of one identity, reloadable while
/// connections use them. See the module documentation.
pub struct LiveTls {
    files: TlsFiles,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: Arc<Current>,
    /// Serializes reloads (SIGHUP and the poller may race); never held across an
    /// `.await`.
    reloading: Mutex<Fingerprints>,
    /// Connections to re-verify on reload, by registration id.
    connections: Mutex<BTreeMap<u64, Tracked>>,
    next_id: AtomicU64,
}

/// Fingerprints of the file contents last loaded, and of the last contents that
/// failed (so a broken file is reported once, not every poll).
#[derive(Default)]
struct Fingerprints {
    loaded: u64,
    failed: Option<u64>,
}

impl std::fmt::Debug for LiveTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveTls")
            .field("files", &self.files)
            .field("serial", &self.current.get().own_serial)
            .finish_non_exhaustive()
    }
}

/// The raw bytes of the four files, read once per reload so that what is
/// fingerprinted is exactly what is parsed.
struct FileBytes {
    bundle: Vec<u8>,
    crl: Option<Vec<u8>>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl FileBytes {
    fn read(files: &TlsFiles) -> Result<Self> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| Error::File {
                path: path.to_owned(),
                source,
            })
        };
        let crl = match std::fs::read(&files.crl) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(Error::File {
                    path: files.crl.clone(),
                    source,
                });
            }
        };
        Ok(Self {
            bundle: read(&files.bundle)?,
            crl,
            cert: read(&files.cert)?,
            key: read(&files.key)?,
        })
    }

    /// A change detector, not a security boundary: SipHash with fixed keys.
    fn fingerprint(&self) -> u64 {
        // `DefaultHasher::new()` has fixed keys: equal contents, equal fingerprints.
        let mut h = std::hash::DefaultHasher::new();
        self.bundle.hash(&mut h);
        self.crl.hash(&mut h);
        self.cert.hash(&mut h);
        self.key.hash(&mut h);
        h.finish()
    }
}

impl LiveTls {
    /// Loads the files; fails if any required one is missing or unusable, or if
    /// the certificate does not hold [`TlsFiles::identity`] (then
    /// [`Error::WrongIdentity`] or [`Error::ReplicaCertificateAsCredential`]).
    pub fn load(files: TlsFiles) -> Result<Arc<Self>> {
        let provider = tls::provider();
        let bytes = FileBytes::read(&files)?;
        let snapshot = build(&files, &provider, &bytes)?;
        Ok(Arc::new(Self {
            current: Arc::new(Current(RwLock::new(Arc::new(snapshot)))),
            reloading: Mutex::new(Fingerprints {
                loaded: bytes.fingerprint(),
                failed: None,
            }),
            files,
            provider,
            connections: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
        }))
    }

    /// The files this state is read from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The serial (hex) of the certificate currently presented.
    pub fn serial(&self) -> String {
        self.current.get().own_serial.clone()
    }

    /// The identity of the certificate currently presented (always the one
    /// [`TlsFiles::identity`] expects; for a client or loader it carries the app
    /// profile).
    pub fn identity(&self) -> PeerIdentity {
        self.current.get().own_identity.clone()
    }

    /// A rustls server configuration presenting the current certificate and
    /// verifying client certificates against the current bundle and CRLs.
    pub fn server_crypto(&self) -> Result<rustls::ServerConfig> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(Arc::new(LiveClientVerifier(self.current.clone())))
            .with_cert_resolver(Arc::new(LiveCert(self.current.clone())));
        tls::harden_server(&mut config);
        Ok(config)
    }

    /// A rustls client configuration presenting the current certificate and
    /// verifying servers against the current bundle and CRLs.
    pub fn client_crypto(&self) -> Result<rustls::ClientConfig> {
        let mut config = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(LiveServerVerifier(self.current.clone())))
            .with_client_cert_resolver(Arc::new(LiveCert(self.current.clone())));
        tls::harden_client(&mut config);
        Ok(config)
    }

    /// [`Self::server_crypto`] as a quinn configuration with our transport limits.
    pub fn server_config(&self) -> Result<quinn::ServerConfig> {
        tls::quic_server(self.server_crypto()?)
    }

    /// [`Self::client_crypto`] as a quinn configuration with our transport limits.
    pub fn client_config(&self) -> Result<quinn::ClientConfig> {
        tls::quic_client(self.client_crypto()?)
    }

    /// Re-reads the files and swaps them in even if unchanged (SIGHUP), then
    /// re-verifies tracked connections. On error nothing changed.
    pub fn reload(&self) -> Result<ReloadReport> {
        let mut prints = lock(&self.reloading);
        let bytes = FileBytes::read(&self.files)?;
        self.apply(&mut prints, &bytes)
    }

    /// Like [`Self::reload`], but only if a file's contents changed since the last
    /// load (and are not the contents that already failed): `Ok(None)` otherwise.
    pub fn reload_if_changed(&self) -> Result<Option<ReloadReport>> {
        let mut prints = lock(&self.reloading);
        let bytes = FileBytes::read(&self.files)?;
        let print = bytes.fingerprint();
        if print == prints.loaded || prints.failed == Some(print) {
            return Ok(None);
        }
        self.apply(&mut prints, &bytes).map(Some)
    }

    /// Builds a snapshot from `bytes`, swaps it in and sweeps the connections.
    fn apply(&self, prints: &mut Fingerprints, bytes: &FileBytes) -> Result<ReloadReport> {
        let print = bytes.fingerprint();
        let snapshot = match build(&self.files, &self.provider, bytes) {
            Ok(s) => s,
            Err(e) => {
                prints.failed = Some(print);
                return Err(e);
            }
        };
        let previous_serial = self.current.get().own_serial.clone();
        let (serial, cas, crls) = (snapshot.own_serial.clone(), snapshot.cas, snapshot.crls);
        self.current.set(Arc::new(snapshot));
        prints.loaded = print;
        prints.failed = None;
        Ok(ReloadReport {
            previous_serial,
            serial,
            cas,
            crls,
            closed: self.sweep(),
        })
    }

    /// Registers an established connection for re-verification on every reload,
    /// until the returned guard is dropped (hold it as long as the connection is
    /// served). The peer certificate is also checked against the current state at
    /// once, closing the window between a handshake and a reload that raced it; if
    /// it fails, the connection is closed and an error returned.
    pub fn track(
        self: &Arc<Self>,
        connection: &quinn::Connection,
        side: Side,
    ) -> Result<TrackedConnection> {
        let any = connection.peer_identity().ok_or(Error::NoPeerCertificate)?;
        let chain = any
            .downcast::<Vec<CertificateDer<'static>>>()
            .map_err(|_| Error::NoPeerCertificate)?;
        let leaf = chain.first().ok_or(Error::NoPeerCertificate)?;
        let peer = PeerIdentity::from_certificate(leaf).map_or_else(
            |_| "a peer without a pangea identity".into(),
            |i| i.to_string(),
        );
        let serial = CertInfo::of(leaf).map_or_else(|_| "?".into(), |i| i.serial);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let own = self.current.get();
        // Published first, checked second: a reload swaps its snapshot before it
        // sweeps, so either its sweep sees this entry or the check below sees the
        // new snapshot.
        lock(&self.connections).insert(
            id,
            Tracked {
                connection: connection.clone(),
                chain: *chain,
                side,
                peer,
                serial,
                own_chain: own.own.cert.clone(),
                own_serial: own.own_serial.clone(),
            },
        );
        let guard = TrackedConnection {
            tls: self.clone(),
            id,
        };
        let snapshot = self.current.get();
        let refused = lock(&self.connections)
            .get(&id)
            .and_then(|t| verify(&snapshot, t).err().map(|r| close(t, &r)));
        match refused {
            // Dropping the guard unregisters the connection.
            Some(closed) => Err(Error::PeerCertificateRejected(closed.reason)),
            None => Ok(guard),
        }
    }

    /// Connections currently tracked.
    pub fn tracked(&self) -> usize {
        lock(&self.connections).len()
    }

    /// Re-verifies every tracked connection against the current state and closes
    /// those that fail. Called by every reload.
    fn sweep(&self) -> Vec<ClosedConnection> {
        let snapshot = self.current.get();
        let mut map = lock(&self.connections);
        let mut closed = Vec::new();
        map.retain(|_, t| {
            if t.connection.close_reason().is_some() {
                return true; // Its guard removes it.
            }
            match verify(&snapshot, t) {
                Ok(()) => true,
                Err(r) => {
                    closed.push(close(t, &r));
                    false
                }
            }
        });
        closed
    }
}

/// Keeps a connection registered with [`LiveTls::track`]; dropping it unregisters.
pub struct TrackedConnection {
    tls: Arc<LiveTls>,
    id: u64,
}

impl std::fmt::Debug for TrackedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedConnection")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for TrackedConnection {
    fn drop(&mut self) {
        lock(&self.tls.connections).remove(&self.id);
    }
}

/// Polls `tls` every `interval` (at least [`RELOAD_INTERVAL_MIN`]) and reloads it
/// when its files changed, calling `on_reload` after each successful reload
/// (logging is done here). The task ends when the last `Arc<LiveTls>` is dropped.
pub fn spawn_poller<F>(
    tls: &Arc<LiveTls>,
    interval: Duration,
    mut on_reload: F,
) -> Result<tokio::task::JoinHandle<()>>
where
    F: FnMut(&ReloadReport) + Send + 'static,
{
    let handle =
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime("spawn_poller"))?;
    let interval = interval.max(RELOAD_INTERVAL_MIN);
    let weak: Weak<LiveTls> = Arc::downgrade(tls);
    Ok(handle.spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // The first tick is immediate; the files were just loaded.
        loop {
            ticker.tick().await;
            let Some(tls) = weak.upgrade() else { break };
            match tls.reload_if_changed() {
                Ok(Some(report)) => {
                    log_report(&tls.files, &report);
                    on_reload(&report);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    cert = %tls.files.cert.display(),
                    error = %e,
                    "certificate files changed but cannot be loaded; keeping the current ones"
                ),
            }
        }
    }))
}

/// Logs a reload at info level (the closed connections were logged one by one).
pub fn log_report(files: &TlsFiles, report: &ReloadReport) {
    tracing::info!(
        cert = %files.cert.display(),
        serial = %report.serial,
        previous_serial = %report.previous_serial,
        cas = report.cas,
        crls = report.crls,
        closed_connections = report.closed.len(),
        "certificates reloaded"
    );
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Builds a snapshot from the bytes of the files (nothing is swapped here).
fn build(
    files: &TlsFiles,
    provider: &Arc<rustls::crypto::CryptoProvider>,
    bytes: &FileBytes,
) -> Result<Snapshot> {
    let pem_err = |path: &Path| {
        let path = path.to_owned();
        move |e| crate::certs::pem_error(&path, e)
    };
    let cas = CertificateDer::pem_slice_iter(&bytes.bundle)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(pem_err(&files.bundle))?;
    if cas.is_empty() {
        return Err(Error::Pem {
            path: files.bundle.clone(),
            reason: "no CERTIFICATE section found".into(),
        });
    }
    let crls = match &bytes.crl {
        Some(b) => CertificateRevocationListDer::pem_slice_iter(b)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(pem_err(&files.crl))?,
        None => Vec::new(),
    };
    let roots = tls::roots(&cas)?;
    let crl_error = |e: rustls::server::VerifierBuilderError| Error::Pem {
        path: files.crl.clone(),
        reason: format!("unusable revocation list: {e}"),
    };
    // End-entity only: our CAs sign leaves directly. Unknown status allowed: a CA
    // that never revoked anything has no CRL.
    let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .with_crls(crls.clone())
    .only_check_end_entity_revocation()
    .allow_unknown_revocation_status()
    .build()
    .map_err(crl_error)?;
    let servers =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .with_crls(crls.clone())
            .only_check_end_entity_revocation()
            .allow_unknown_revocation_status()
            .build()
            .map_err(crl_error)?;
    let chain = CertificateDer::pem_slice_iter(&bytes.cert)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(pem_err(&files.cert))?;
    let Some(leaf) = chain.first() else {
        return Err(Error::Pem {
            path: files.cert.clone(),
            reason: "no CERTIFICATE section found".into(),
        });
    };
    // Before anything else about the leaf: a certificate of another identity is
    // refused whatever its state.
    let own_identity = files.identity.check(&files.cert, leaf)?;
    let own_serial = CertInfo::of(leaf)?.serial;
    // Our own certificate should pass our own checks; if not (issued by a CA not yet
    // in this bundle, or revoked), peers will refuse it: say so, but present it.
    if let Err(e) = clients.verify_client_cert(leaf, &chain[1..], UnixTime::now()) {
        tracing::warn!(
            cert = %files.cert.display(),
            serial = %own_serial,
            error = %e,
            "own certificate does not verify against the local trust bundle and CRL; peers will refuse it"
        );
    }
    let key = PrivateKeyDer::from_pem_slice(&bytes.key).map_err(pem_err(&files.key))?;
    let own = CertifiedKey::from_der(chain, key, provider).map_err(|e| Error::Pem {
        path: files.key.clone(),
        reason: format!(
            "does not go with {} ({e}); if a certificate is being re-issued, the next reload \
             picks up the finished pair",
            files.cert.display()
        ),
    })?;
    Ok(Snapshot {
        own: Arc::new(own),
        own_serial,
        own_identity,
        clients,
        servers,
        cas: cas.len(),
        crls: crls.len(),
    })
}

/// Why a tracked connection fails re-verification.
struct Rejection {
    /// The failing certificate is this side's own (revoked), not the peer's.
    local: bool,
    error: rustls::Error,
}

/// Verifies a tracked connection's peer chain as its handshake did, then checks
/// that this side's own certificate is not revoked.
fn verify(snapshot: &Snapshot, t: &Tracked) -> std::result::Result<(), Rejection> {
    let now = UnixTime::now();
    let peer = |error| Rejection {
        local: false,
        error,
    };
    let Some((leaf, intermediates)) = t.chain.split_first() else {
        return Err(peer(rustls::Error::NoCertificatesPresented));
    };
    match &t.side {
        Side::Accepted => snapshot
            .clients
            .verify_client_cert(leaf, intermediates, now)
            .map(|_| ())
            .map_err(peer)?,
        Side::Dialled(name) => snapshot
            .servers
            .verify_server_cert(leaf, intermediates, name, &[], now)
            .map(|_| ())
            .map_err(peer)?,
    }
    // Our own certificate is checked as a client certificate (chain and CRL):
    // replica certificates carry both usages, client certificates only this one.
    if let Some((leaf, intermediates)) = t.own_chain.split_first()
        && let Err(error) = snapshot
            .clients
            .verify_client_cert(leaf, intermediates, now)
        && is_revoked(&error)
    {
        return Err(Rejection { local: true, error });
    }
    Ok(())
}

fn is_revoked(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(CertificateError::Revoked)
    )
}

/// Closes a connection that failed [`verify`], logs it, and describes it.
fn close(t: &Tracked, r: &Rejection) -> ClosedConnection {
    let revoked = is_revoked(&r.error);
    let whose = if r.local {
        "local certificate"
    } else {
        "certificate"
    };
    let (code, reason) = if revoked {
        (CLOSE_CERTIFICATE_REVOKED, format!("{whose} revoked"))
    } else {
        (
            CLOSE_CERTIFICATE_UNTRUSTED,
            format!("{whose} no longer trusted: {}", r.error),
        )
    };
    let serial = if r.local { &t.own_serial } else { &t.serial };
    t.connection
        .close(quinn::VarInt::from_u32(code), reason.as_bytes());
    tracing::warn!(
        peer = %t.peer,
        %serial,
        local = r.local,
        remote = %t.connection.remote_address(),
        code,
        %reason,
        "closed a connection authenticated by a certificate that no longer verifies"
    );
    ClosedConnection {
        peer: t.peer.clone(),
        local: r.local,
        serial: serial.clone(),
        revoked,
        reason,
    }
}

/// Presents the current certificate, as a server and as a client.
struct LiveCert(Arc<Current>);

impl std::fmt::Debug for LiveCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LiveCert")
            .field(&self.0.get().own_serial)
            .finish()
    }
}

impl ResolvesServerCert for LiveCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get().own.clone())
    }
}

impl ResolvesClientCert for LiveCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get().own.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Verifies client certificates with the current verifier.
struct LiveClientVerifier(Arc<Current>);

impl std::fmt::Debug for LiveClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveClientVerifier")
    }
}

impl ClientCertVerifier for LiveClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The hints would have to outlive a snapshot swap; they are optional in
        // TLS 1.3 and our clients present their one certificate regardless.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        self.0
            .get()
            .clients
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .get()
            .clients
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .get()
            .clients
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.get().clients.supported_verify_schemes()
    }
}

/// Verifies server certificates with the current verifier.
struct LiveServerVerifier(Arc<Current>);

impl std::fmt::Debug for LiveServerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveServerVerifier")
    }
}

impl ServerCertVerifier for LiveServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.0.get().servers.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .get()
            .servers
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .get()
            .servers
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.get().servers.supported_verify_schemes()
    }
}
