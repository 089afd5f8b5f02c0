//! The cluster CA and leaf certificates, as PEM files (rcgen).
//!
//! Layout of a certificate directory:
//!
//! ```text
//! dir/ca.pem                                the trust bundle: every CA certificate
//!                                           currently trusted (one, or two during a
//!                                           CA rotation), concatenated PEM
//! dir/ca.key                                key of the *issuing* CA: the certificate
//!                                           of the bundle with the same public key
//! dir/ca-next.key  dir/ca-prev.key          during a CA rotation only: the staged
//!                                           new CA, then the retired old one (see
//!                                           [`crate::rotation`])
//! dir/crl.pem                               revoked leaves: one CRL per CA that has
//!                                           revoked anything ([`crate::rotation::revoke`])
//! dir/replicas/<replica_id>.pem  .key       one per replica (issue_replica)
//! dir/clients/<name>.pem  .key              one per frontend (issue_client)
//! dir/operators/<name>.pem  .key            one per operator (issue_operator)
//! dir/loaders/<name>.pem  .key              one per batch pipeline (issue_loader)
//! ```
//!
//! Identity lives in the subject alternative names (SAN), as a URI that
//! [`crate::identity`] parses back (the forms are listed there):
//!
//! - replica: `pangea://replica/<replica_id>?region=<region>`, plus DNS `localhost`,
//!   IPs `127.0.0.1` and `::1`, and DNS `<replica_id>` when the id is a valid DNS name (see
//!   [`replica_dns_name`]); extended key usage server *and* client auth, because
//!   replicas both accept and dial connections;
//! - client: `pangea://client/<name>?app_profile=<profile>`; client auth only, so a
//!   stolen frontend certificate cannot impersonate a replica to another client;
//! - operator: `pangea://operator/<name>`; client auth only;
//! - loader: `pangea://loader/<name>?app_profile=<profile>`; client auth only.
//!
//! The names of one kind share a directory, so a name is unique per kind; a client
//! and an operator may share a name (they are different files and identities).
//!
//! Keys are ECDSA P-256 (fast handshakes, small certificates). Key files are written
//! with mode 0600 on Unix. Leaves may be re-issued (the files are replaced, key and
//! certificate each by an atomic rename, so a reloading replica never reads half a
//! file); the CA is never overwritten.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer};

use crate::error::{Error, Result};
use crate::identity::{Credential, PeerIdentity};

/// How long a leaf certificate is valid from issue: one year. Long enough that a
/// cluster does not break over a holiday, short enough that a leaked key expires.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long the cluster CA is valid: ten years. Renewing a CA means re-issuing
/// every leaf, so it lives much longer than they do.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Certificates start being valid this long before they are issued, so that a host
/// whose clock is slightly behind the issuer's accepts a fresh certificate.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(3600);

/// Longest accepted replica id, region, client, operator or loader name, or app
/// profile.
pub const NAME_BYTES_MAX: usize = 128;

/// The URI scheme of Pangea identities in certificates.
pub const IDENTITY_SCHEME: &str = "pangea://";

/// Checks a replica id, region, client, operator or loader name, or app profile:
/// 1..=128 bytes of ASCII
/// letters, digits, `_`, `-` and `.`. These characters need no escaping in a URI
/// or a file name, so the identity URI and the file layout stay unambiguous.
/// `what` names the kind of name in the error.
pub fn validate_name(what: &'static str, name: &str) -> Result<()> {
    let invalid = |reason| Error::InvalidName {
        what,
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(invalid("longer than 128 bytes"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(invalid(
            "only ASCII letters, digits, '_', '-' and '.' are allowed",
        ));
    }
    // "." and ".." are valid by the character rule but would escape the directory.
    if name.bytes().all(|b| b == b'.') {
        return Err(invalid("must not consist only of dots"));
    }
    Ok(())
}

/// The DNS name a replica's certificate carries for its id, if the id is a valid
/// DNS name (most are: `us-east1-a`). Clients use it as the TLS server name so the
/// handshake checks they reached *that* replica; ids that are not DNS names (e.g.
/// all digits, or with `_`) fall back to `localhost`, which every replica
/// certificate carries — see [`crate::tls::server_name`].
pub fn replica_dns_name(replica_id: &str) -> Option<&str> {
    // `localhost` would be ambiguous with the name every replica carries.
    if replica_id.eq_ignore_ascii_case("localhost") || replica_id.contains('_') {
        // Underscores are legal for rustls's parser but not in a DNS SAN checked
        // by webpki; excluding them keeps issue and verify in agreement.
        return None;
    }
    DnsName::try_from(replica_id).ok().map(|_| replica_id)
}

/// A certificate chain (leaf first) and its private key, ready for rustls.
#[derive(Debug)]
pub struct CertBundle {
    /// The leaf certificate, then any intermediates (none today).
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key (PKCS#8).
    pub key: PrivateKeyDer<'static>,
}

impl Clone for CertBundle {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

/// `dir/ca.pem`.
pub fn ca_cert_path(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}

/// `dir/ca.key`.
pub fn ca_key_path(dir: &Path) -> PathBuf {
    dir.join("ca.key")
}

/// `dir/ca-next.key`: the key of a CA staged by `rotate-ca start` (its certificate
/// is already in the bundle `ca.pem`).
pub fn ca_next_key_path(dir: &Path) -> PathBuf {
    dir.join("ca-next.key")
}

/// `dir/ca-prev.key`: the key of the CA retired by `rotate-ca promote`, kept until
/// `rotate-ca finish` so that its leaves can still be revoked.
pub fn ca_prev_key_path(dir: &Path) -> PathBuf {
    dir.join("ca-prev.key")
}

/// `dir/crl.pem`: the certificate revocation lists, one per CA that revoked a leaf.
pub fn crl_path(dir: &Path) -> PathBuf {
    dir.join("crl.pem")
}

/// `dir/replicas/<replica_id>.pem` (the key is the same path with `.key`).
pub fn replica_cert_path(dir: &Path, replica_id: &str) -> PathBuf {
    dir.join("replicas").join(format!("{replica_id}.pem"))
}

/// `dir/clients/<name>.pem` (the key is the same path with `.key`).
pub fn client_cert_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("clients").join(format!("{name}.pem"))
}

/// `dir/operators/<name>.pem` (the key is the same path with `.key`).
pub fn operator_cert_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("operators").join(format!("{name}.pem"))
}

/// `dir/loaders/<name>.pem` (the key is the same path with `.key`).
pub fn loader_cert_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("loaders").join(format!("{name}.pem"))
}

/// Creates the cluster CA: writes `dir/ca.pem` and `dir/ca.key` (creating `dir`).
/// Refuses with [`Error::CaExists`] if either file exists.
pub fn init_ca(dir: &Path) -> Result<()> {
    let cert_path = ca_cert_path(dir);
    let key_path = ca_key_path(dir);
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(Error::CaExists { path: path.clone() });
        }
    }
    create_dir(dir)?;

    let (cert, key) = generate_ca(CA_COMMON_NAME)?;

    // Key first, with create_new: if two `init_ca` race, one of them fails here
    // instead of pairing one's key with the other's certificate.
    write_new(&key_path, key.serialize_pem().as_bytes(), true)?;
    write_new(&cert_path, cert.pem().as_bytes(), false)
}

/// The common name of the first cluster CA. CAs made by a rotation append
/// ` gen <n>`: every CA of a bundle must have its own name, because revocation
/// lists are matched to certificates by issuer name.
pub const CA_COMMON_NAME: &str = "Pangea cluster CA";

/// A new self-signed CA certificate named `cn`, and its key.
pub(crate) fn generate_ca(cn: &str) -> Result<(rcgen::Certificate, KeyPair)> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name_with_cn(cn);
    // pathlen 0: the CA signs leaves only, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut params, CA_VALIDITY)?;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert, key))
}

/// Issues (or re-issues) the certificate of replica `replica_id` in `region`,
/// signed by the CA in `dir`: writes `dir/replicas/<replica_id>.pem` and `.key`.
pub fn issue_replica(dir: &Path, replica_id: &str, region: &str) -> Result<()> {
    validate_name("replica id", replica_id)?;
    validate_name("region", region)?;
    let mut sans = vec![
        identity_san(&PeerIdentity::Replica {
            id: replica_id.to_owned(),
            region: region.to_owned(),
        })?,
        SanType::DnsName("localhost".try_into()?),
        SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
        SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
    ];
    if let Some(dns) = replica_dns_name(replica_id) {
        sans.push(SanType::DnsName(dns.try_into()?));
    }
    let mut params = CertificateParams::default();
    params.distinguished_name = name_with_cn(&format!("pangea replica {replica_id}"));
    params.subject_alt_names = sans;
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    issue_leaf(dir, params, &replica_cert_path(dir, replica_id))
}

/// Issues (or re-issues) the certificate of client `name` acting for
/// `app_profile`: writes `dir/clients/<name>.pem` and `.key`.
pub fn issue_client(dir: &Path, name: &str, app_profile: &str) -> Result<()> {
    validate_name("client name", name)?;
    validate_name("app profile", app_profile)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name_with_cn(&format!("pangea client {name}"));
    params.subject_alt_names = vec![identity_san(&PeerIdentity::Client {
        name: name.to_owned(),
        app_profile: app_profile.to_owned(),
    })?];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    issue_leaf(dir, params, &client_cert_path(dir, name))
}

/// Issues (or re-issues) the certificate of operator `name` (a person or an
/// administration tool; bound to no app profile): writes `dir/operators/<name>.pem`
/// and `.key`. Client auth only.
pub fn issue_operator(dir: &Path, name: &str) -> Result<()> {
    validate_name("operator name", name)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name_with_cn(&format!("pangea operator {name}"));
    params.subject_alt_names = vec![identity_san(&PeerIdentity::Operator {
        name: name.to_owned(),
    })?];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    issue_leaf(dir, params, &operator_cert_path(dir, name))
}

/// Issues (or re-issues) the certificate of loader `name` (a batch pipeline)
/// loading for `app_profile`: writes `dir/loaders/<name>.pem` and `.key`. Client
/// auth only.
pub fn issue_loader(dir: &Path, name: &str, app_profile: &str) -> Result<()> {
    validate_name("loader name", name)?;
    validate_name("app profile", app_profile)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name_with_cn(&format!("pangea loader {name}"));
    params.subject_alt_names = vec![identity_san(&PeerIdentity::Loader {
        name: name.to_owned(),
        app_profile: app_profile.to_owned(),
    })?];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    issue_leaf(dir, params, &loader_cert_path(dir, name))
}

/// The CA certificate of `dir`, to trust as the only root. Refuses a bundle of
/// several CAs (a directory in the middle of a CA rotation): callers that must
/// work then use [`load_ca_bundle`].
pub fn load_ca(dir: &Path) -> Result<CertificateDer<'static>> {
    let path = ca_cert_path(dir);
    let mut chain = load_certs(&path)?;
    if chain.len() != 1 {
        return Err(Error::Pem {
            path,
            reason: format!(
                "expected exactly one CA certificate, found {} (a CA rotation is under way: \
                 load the bundle)",
                chain.len()
            ),
        });
    }
    // Length checked just above.
    Ok(chain.remove(0))
}

/// Every CA certificate of the trust bundle `dir/ca.pem` (at least one).
pub fn load_ca_bundle(dir: &Path) -> Result<Vec<CertificateDer<'static>>> {
    load_certs(&ca_cert_path(dir))
}

/// The certificate and key of replica `replica_id` from `dir`.
pub fn load_replica(dir: &Path, replica_id: &str) -> Result<CertBundle> {
    validate_name("replica id", replica_id)?;
    load_bundle(&replica_cert_path(dir, replica_id))
}

/// The certificate and key of client `name` from `dir`.
pub fn load_client(dir: &Path, name: &str) -> Result<CertBundle> {
    validate_name("client name", name)?;
    load_bundle(&client_cert_path(dir, name))
}

/// The certificate and key of operator `name` from `dir`.
pub fn load_operator(dir: &Path, name: &str) -> Result<CertBundle> {
    validate_name("operator name", name)?;
    load_bundle(&operator_cert_path(dir, name))
}

/// The certificate and key of loader `name` from `dir`.
pub fn load_loader(dir: &Path, name: &str) -> Result<CertBundle> {
    validate_name("loader name", name)?;
    load_bundle(&loader_cert_path(dir, name))
}

/// The certificate and key of `credential` from `dir` (no identity check: for
/// one that is checked, and reloaded, use [`crate::reload::LiveTls`]).
pub fn load_credential(dir: &Path, credential: &Credential) -> Result<CertBundle> {
    credential.validate()?;
    load_bundle(&credential.cert_path(dir))
}

fn load_bundle(cert_path: &Path) -> Result<CertBundle> {
    let chain = load_certs(cert_path)?;
    let key_path = cert_path.with_extension("key");
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| pem_error(&key_path, e))?;
    Ok(CertBundle { chain, key })
}

pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if chain.is_empty() {
        return Err(Error::Pem {
            path: path.to_owned(),
            reason: "no CERTIFICATE section found".into(),
        });
    }
    Ok(chain)
}

/// Maps a pki-types PEM error to ours, keeping the I/O error (file missing, ...)
/// as such so that the message reads "path: No such file or directory".
pub(crate) fn pem_error(path: &Path, e: rustls::pki_types::pem::Error) -> Error {
    match e {
        rustls::pki_types::pem::Error::Io(source) => Error::File {
            path: path.to_owned(),
            source,
        },
        other => Error::Pem {
            path: path.to_owned(),
            reason: other.to_string(),
        },
    }
}

/// Signs `params` with the issuing CA of `dir` (the certificate of the bundle that
/// matches `ca.key`) and writes `cert_path` and its `.key`.
fn issue_leaf(dir: &Path, mut params: CertificateParams, cert_path: &Path) -> Result<()> {
    let ca = load_ca_with_key(dir, &ca_key_path(dir))?;
    let issuer = ca.issuer()?;

    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, LEAF_VALIDITY)?;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    if let Some(parent) = cert_path.parent() {
        create_dir(parent)?;
    }
    // Both files are fully written under temporary names before either is renamed
    // into place, so a failed write leaves the previous pair intact. A replica that
    // reloads between the two renames sees a key that does not match the
    // certificate, refuses that pair and keeps its current one until the next try.
    let key_path = cert_path.with_extension("key");
    let key_tmp = write_temp(&key_path, key.serialize_pem().as_bytes(), true)?;
    let cert_tmp = write_temp(cert_path, cert.pem().as_bytes(), false)?;
    rename(&key_tmp, &key_path)?;
    rename(&cert_tmp, cert_path)
}

/// A CA of the bundle together with its private key.
pub(crate) struct CaWithKey {
    /// The CA certificate, as it appears in the bundle.
    pub(crate) cert: CertificateDer<'static>,
    /// Its key.
    pub(crate) key: KeyPair,
    /// Where the key was read from (for error messages).
    pub(crate) key_path: PathBuf,
}

impl CaWithKey {
    /// An rcgen issuer built from the certificate itself (not from parameters), so
    /// the issuer name and key identifier are byte-identical to what peers trust.
    pub(crate) fn issuer(&self) -> Result<Issuer<'static, &KeyPair>> {
        Issuer::from_ca_cert_der(&self.cert, &self.key).map_err(|e| Error::Pem {
            path: self.key_path.clone(),
            reason: format!("the matching CA certificate is not usable as an issuer: {e}"),
        })
    }
}

/// The CA of `dir`'s bundle whose public key is the one in `key_path`.
pub(crate) fn load_ca_with_key(dir: &Path, key_path: &Path) -> Result<CaWithKey> {
    // The bundle first: without it there is no CA at all, the clearer error.
    let bundle = load_ca_bundle(dir)?;
    let key_pem = read_to_string(key_path)?;
    let key = KeyPair::from_pem(&key_pem).map_err(|e| Error::Pem {
        path: key_path.to_owned(),
        reason: format!("not a usable CA key: {e}"),
    })?;
    let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
    for cert in bundle {
        let (_, parsed) =
            x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| Error::Pem {
                path: ca_cert_path(dir),
                reason: format!("not a valid X.509 certificate: {e}"),
            })?;
        if parsed.tbs_certificate.subject_pki.raw == spki.as_slice() {
            return Ok(CaWithKey {
                cert,
                key,
                key_path: key_path.to_owned(),
            });
        }
    }
    Err(Error::Pem {
        path: key_path.to_owned(),
        reason: format!(
            "matches no CA certificate of the trust bundle {}",
            ca_cert_path(dir).display()
        ),
    })
}

pub(crate) fn name_with_cn(cn: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "Pangea");
    name.push(DnType::CommonName, cn);
    name
}

/// The SAN carrying `identity`'s URI (the one writer of identity URIs is
/// [`PeerIdentity::to_uri`], so issuing and parsing cannot drift apart).
fn identity_san(identity: &PeerIdentity) -> Result<SanType> {
    Ok(SanType::URI(identity.to_uri().as_str().try_into()?))
}

/// Sets `not_before` to now minus [`CLOCK_SKEW_ALLOWANCE`], `not_after` to now plus
/// `validity`.
pub(crate) fn set_validity(params: &mut CertificateParams, validity: Duration) -> Result<()> {
    // rcgen takes `time::OffsetDateTime`; we reach it from the Unix epoch with std
    // durations so that this crate needs no direct `time` dependency.
    let now = rcgen::date_time_ymd(1970, 1, 1) + since_epoch()?;
    params.not_before = now - CLOCK_SKEW_ALLOWANCE;
    params.not_after = now + validity;
    Ok(())
}

/// The wall clock as a duration since the Unix epoch (add it to
/// `rcgen::date_time_ymd(1970, 1, 1)` for rcgen's dates), refusing clocks that
/// certificate dates cannot represent.
pub(crate) fn since_epoch() -> Result<Duration> {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| Error::Clock(format!("before 1970: {e}")))?;
    // Adding std durations to an OffsetDateTime panics past year 9999; a clock
    // beyond year 9000 is refused here so the additions callers make cannot
    // overflow (they add at most [`CA_VALIDITY`]).
    const CLOCK_SECS_MAX: u64 = 221_000_000_000;
    if since_epoch.as_secs() > CLOCK_SECS_MAX {
        return Err(Error::Clock(format!(
            "{} s after 1970 is beyond year 9000",
            since_epoch.as_secs()
        )));
    }
    Ok(since_epoch)
}

pub(crate) fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|source| Error::File {
        path: dir.to_owned(),
        source,
    })
}

pub(crate) fn read_to_string(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| Error::File {
        path: path.to_owned(),
        source,
    })
}

/// Writes a file that must not exist yet.
pub(crate) fn write_new(path: &Path, contents: &[u8], secret: bool) -> Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    write_with(path, contents, secret, &options).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            Error::CaExists {
                path: path.to_owned(),
            }
        } else {
            Error::File {
                path: path.to_owned(),
                source,
            }
        }
    })
}

/// Writes `<path>.tmp` (to be renamed over `path`, so that a reader, such as a
/// replica reloading its certificate, never sees half a file).
pub(crate) fn write_temp(path: &Path, contents: &[u8], secret: bool) -> Result<PathBuf> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    write_with(&tmp, contents, secret, &options).map_err(|source| Error::File {
        path: tmp.clone(),
        source,
    })?;
    Ok(tmp)
}

pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).map_err(|source| Error::File {
        path: to.to_owned(),
        source,
    })
}

fn write_with(
    path: &Path,
    contents: &[u8],
    secret: bool,
    options: &fs::OpenOptions,
) -> std::io::Result<()> {
    let mut options = options.clone();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for ok in ["a", "us-east1-a", "r_1.x", &"x".repeat(128)] {
            assert!(validate_name("replica id", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "a/b",
            "é",
            "..",
            ".",
            "a?b",
            "a=b",
            &"x".repeat(129),
        ] {
            let err = validate_name("replica id", bad).err();
            assert!(
                matches!(
                    err,
                    Some(Error::InvalidName {
                        what: "replica id",
                        ..
                    })
                ),
                "{bad:?} gave {err:?}"
            );
        }
    }

    #[test]
    fn dns_names_for_replica_ids() {
        assert_eq!(replica_dns_name("us-east1-a"), Some("us-east1-a"));
        assert_eq!(replica_dns_name("r1.eu"), Some("r1.eu"));
        assert_eq!(replica_dns_name("r_1"), None);
        assert_eq!(replica_dns_name("-r"), None);
        assert_eq!(replica_dns_name("localhost"), None);
    }

    #[test]
    fn init_ca_refuses_to_overwrite() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })?;
        init_ca(dir.path())?;
        let before = fs::read(ca_key_path(dir.path())).ok();
        let err = init_ca(dir.path()).err();
        assert!(matches!(err, Some(Error::CaExists { .. })), "{err:?}");
        assert_eq!(fs::read(ca_key_path(dir.path())).ok(), before);
        Ok(())
    }

    #[test]
    fn issue_and_load_round_trip() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })?;
        init_ca(dir.path())?;
        issue_replica(dir.path(), "us-east1-a", "us-east1")?;
        issue_client(dir.path(), "frontend-1", "serving")?;
        issue_operator(dir.path(), "alice")?;
        issue_loader(dir.path(), "nightly", "serving")?;
        let _ca = load_ca(dir.path())?;
        let replica = load_replica(dir.path(), "us-east1-a")?;
        assert_eq!(replica.chain.len(), 1);
        let client = load_client(dir.path(), "frontend-1")?;
        assert_eq!(client.chain.len(), 1);
        assert!(operator_cert_path(dir.path(), "alice").exists());
        assert!(loader_cert_path(dir.path(), "nightly").exists());
        assert_eq!(load_operator(dir.path(), "alice")?.chain.len(), 1);
        assert_eq!(load_loader(dir.path(), "nightly")?.chain.len(), 1);
        assert_eq!(
            load_credential(dir.path(), &Credential::Loader("nightly".into()))?.chain,
            load_loader(dir.path(), "nightly")?.chain
        );
        // Operators and loaders authenticate as clients only: their certificates
        // cannot serve as a replica's.
        for leaf in [
            load_operator(dir.path(), "alice")?,
            load_loader(dir.path(), "nightly")?,
        ] {
            let (_, parsed) = x509_parser::parse_x509_certificate(leaf.chain[0].as_ref())
                .map_err(|e| Error::CertificateParse(e.to_string()))?;
            let eku = parsed
                .extended_key_usage()
                .map_err(|e| Error::CertificateParse(e.to_string()))?
                .map(|e| e.value.clone());
            let eku = eku.ok_or(Error::MissingIdentity)?;
            assert!(eku.client_auth && !eku.server_auth, "{eku:?}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let key = dir.path().join("replicas/us-east1-a.key");
            let mode = fs::metadata(&key)
                .map_err(|source| Error::File { path: key, source })?
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        Ok(())
    }

    #[test]
    fn issue_without_ca_names_the_file() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })?;
        assert!(matches!(
            issue_operator(dir.path(), "a b"),
            Err(Error::InvalidName {
                what: "operator name",
                ..
            })
        ));
        assert!(matches!(
            issue_loader(dir.path(), "l", ""),
            Err(Error::InvalidName {
                what: "app profile",
                ..
            })
        ));
        let err = issue_replica(dir.path(), "r1", "eu").err();
        match err {
            Some(Error::File { path, .. }) => assert_eq!(path, ca_cert_path(dir.path())),
            other => panic!("expected a file error, got {other:?}"),
        }
        let err = load_client(dir.path(), "nobody").err();
        match err {
            Some(Error::File { path, .. }) => {
                assert_eq!(path, client_cert_path(dir.path(), "nobody"));
            }
            other => panic!("expected a file error, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn bad_pem_is_an_error_naming_the_file() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })?;
        let path = ca_cert_path(dir.path());
        fs::write(&path, "not a certificate").map_err(|source| Error::File {
            path: path.clone(),
            source,
        })?;
        match load_ca(dir.path()) {
            Err(Error::Pem { path: p, .. }) => assert_eq!(p, path),
            other => panic!("expected a PEM error, got {other:?}"),
        }
        Ok(())
    }
}
