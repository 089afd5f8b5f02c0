//! Day-2 operations on a certificate directory (layout in [`crate::certs`]):
//! re-issuing leaves, revoking them, and rotating the cluster CA itself.
//!
//! Nothing here talks to a running process: these functions only rewrite files,
//! each by an atomic rename. Replicas and clients pick the new files up on their
//! own ([`crate::reload`]: at once on SIGHUP, else within their poll interval).
//!
//! # Revocation
//!
//! `dir/crl.pem` holds one X.509 CRL per CA that has revoked a leaf, signed by that
//! CA (rcgen). [`revoke`] adds the leaf's serial to its CA's CRL (creating it if
//! needed) and bumps the CRL number; revoking twice is a no-op. Verifiers match a
//! CRL to a certificate by issuer name, which is why every CA of a bundle has its
//! own name (`Pangea cluster CA`, then `... gen 2`, `... gen 3`, ...).
//!
//! # CA rotation with a dual-CA bundle
//!
//! `dir/ca.pem` is a *bundle*: every CA certificate in it is trusted. Rotating the
//! CA takes three commands; between them the operator copies the changed files to
//! every host and waits one reload interval:
//!
//! 1. [`rotate_ca_start`]: a new CA (key in `ca-next.key`) is appended to the
//!    bundle. Once distributed, every process trusts leaves of both CAs; every
//!    leaf still comes from the old one.
//! 2. [`rotate_ca_promote`]: the new CA becomes the issuing CA (`ca.key`); the old
//!    key is kept as `ca-prev.key` so its leaves can still be revoked. Then every
//!    leaf is re-issued ([`reissue`]) and distributed.
//! 3. [`rotate_ca_finish`]: the old CA leaves the bundle (and its CRL goes);
//!    `ca-prev.key` is deleted. Refused while a leaf of this directory still comes
//!    from the old CA. Once distributed, old-CA leaves fail new handshakes and
//!    connections they authenticated are closed on the next reload.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{CertificateRevocationListParams, KeyIdMethod, RevokedCertParams, SerialNumber};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::ParsedExtension;

use crate::certs::{
    CA_COMMON_NAME, CaWithKey, ca_cert_path, ca_key_path, ca_next_key_path, ca_prev_key_path,
    client_cert_path, crl_path, generate_ca, issue_client, issue_loader, issue_operator,
    issue_replica, load_ca_bundle, load_ca_with_key, load_certs, loader_cert_path,
    operator_cert_path, pem_error, read_to_string, rename, replica_cert_path, since_epoch,
    validate_name, write_new, write_temp,
};
use crate::error::{Error, Result};
use crate::identity::PeerIdentity;

/// The `nextUpdate` a CRL written here announces: one year after it is signed.
/// Pangea's verifiers do not enforce it (a CRL nobody re-signed must not cut a
/// cluster off); it only informs other tools. Every revocation re-signs the CRL.
pub const CRL_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Which kind of leaf a certificate file holds: one per identity kind
/// ([`PeerIdentity`]), each in its own subdirectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeafKind {
    /// `dir/replicas/<id>.pem`.
    Replica,
    /// `dir/clients/<name>.pem`.
    Client,
    /// `dir/operators/<name>.pem`.
    Operator,
    /// `dir/loaders/<name>.pem`.
    Loader,
}

impl LeafKind {
    /// Every kind, in the order listings and [`find_leaf`] use.
    pub const ALL: [LeafKind; 4] = [Self::Replica, Self::Client, Self::Operator, Self::Loader];

    /// `replica`, `client`, `operator` or `loader` (as [`PeerIdentity::kind`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replica => "replica",
            Self::Client => "client",
            Self::Operator => "operator",
            Self::Loader => "loader",
        }
    }

    /// The subdirectory of the certificate directory holding leaves of this kind.
    pub fn dir_name(self) -> &'static str {
        match self {
            Self::Replica => "replicas",
            Self::Client => "clients",
            Self::Operator => "operators",
            Self::Loader => "loaders",
        }
    }

    /// The certificate file of leaf `name` of this kind (the key is the same path
    /// with `.key`).
    pub fn cert_path(self, dir: &Path, name: &str) -> PathBuf {
        match self {
            Self::Replica => replica_cert_path(dir, name),
            Self::Client => client_cert_path(dir, name),
            Self::Operator => operator_cert_path(dir, name),
            Self::Loader => loader_cert_path(dir, name),
        }
    }

    /// The kind of leaf that holds `identity`.
    pub fn of(identity: &PeerIdentity) -> Self {
        match identity {
            PeerIdentity::Replica { .. } => Self::Replica,
            PeerIdentity::Client { .. } => Self::Client,
            PeerIdentity::Operator { .. } => Self::Operator,
            PeerIdentity::Loader { .. } => Self::Loader,
        }
    }
}

/// What an operator needs to tell certificates apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The serial number, lowercase hex without leading zeros (as `openssl x509
    /// -serial` prints it, lowercased).
    pub serial: String,
    /// The subject's common name.
    pub subject: String,
    /// The issuer's common name (which CA signed it).
    pub issuer: String,
    /// Start of validity, Unix seconds.
    pub not_before_unix: i64,
    /// End of validity, Unix seconds.
    pub not_after_unix: i64,
}

impl CertInfo {
    /// Reads the fields of a DER certificate.
    pub fn of(cert: &CertificateDer<'_>) -> Result<Self> {
        let parsed = parse_cert(cert)?;
        Ok(Self {
            serial: serial_hex(parsed.raw_serial()),
            subject: common_name(parsed.subject()),
            issuer: common_name(parsed.issuer()),
            not_before_unix: parsed.validity().not_before.timestamp(),
            not_after_unix: parsed.validity().not_after.timestamp(),
        })
    }
}

/// `YYYY-MM-DD` (UTC) of a Unix time, by the days-to-civil algorithm of Howard
/// Hinnant (no calendar crate needed for a listing).
pub fn utc_date(unix: i64) -> String {
    let z = unix.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// A serial number's bytes as lowercase hex without leading zero bytes.
pub fn serial_hex(raw: &[u8]) -> String {
    let start = raw.iter().position(|b| *b != 0).unwrap_or(raw.len());
    let trimmed = &raw[start..];
    if trimmed.is_empty() {
        return "00".into();
    }
    trimmed.iter().map(|b| format!("{b:02x}")).collect()
}

/// The certificate file of leaf `name`: `replicas/`, `clients/`, `operators/` or
/// `loaders/<name>.pem`. With `kind` `None`, whichever exists (an error if several
/// do).
pub fn find_leaf(dir: &Path, name: &str, kind: Option<LeafKind>) -> Result<(LeafKind, PathBuf)> {
    validate_name("certificate name", name)?;
    let mut found: Vec<(LeafKind, PathBuf)> = LeafKind::ALL
        .into_iter()
        .filter(|k| kind.is_none_or(|want| want == *k))
        .map(|k| (k, k.cert_path(dir, name)))
        .filter(|(_, p)| p.exists())
        .collect();
    match found.len() {
        0 => Err(Error::NoSuchLeaf {
            name: name.to_owned(),
            dir: dir.to_owned(),
        }),
        1 => Ok(found.remove(0)),
        _ => Err(Error::AmbiguousLeaf {
            name: name.to_owned(),
            kinds: found.iter().map(|(k, _)| k.as_str()).collect(),
        }),
    }
}

/// A leaf before and after [`reissue`].
#[derive(Debug, Clone)]
pub struct Reissued {
    /// Replica, client, operator or loader.
    pub kind: LeafKind,
    /// Its name (replica id, or client, operator or loader name).
    pub name: String,
    /// The certificate the file held.
    pub old: CertInfo,
    /// The certificate it holds now.
    pub new: CertInfo,
    /// Whether the old certificate was revoked too (`revoke_old`).
    pub old_revoked: bool,
}

/// Re-issues leaf `name` with the identity its current certificate carries
/// (region or app profile, if any), a new key, and the current issuing CA. The
/// certificate must hold the identity its file stands for (kind and name). With
/// `revoke_old`, the certificate it replaces is revoked in the same step (for a
/// compromised key: processes pick up both files on the same reload).
pub fn reissue(
    dir: &Path,
    name: &str,
    kind: Option<LeafKind>,
    revoke_old: bool,
) -> Result<Reissued> {
    let (kind, path) = find_leaf(dir, name, kind)?;
    let old_cert = first_cert(&path)?;
    let old = CertInfo::of(&old_cert)?;
    let identity = PeerIdentity::from_certificate(&old_cert)?;
    if LeafKind::of(&identity) != kind || identity.name() != name {
        return Err(Error::Pem {
            path,
            reason: format!(
                "holds the certificate of {identity}, not of {} {name}",
                kind.as_str()
            ),
        });
    }
    match &identity {
        PeerIdentity::Replica { id, region } => issue_replica(dir, id, region)?,
        PeerIdentity::Client { name, app_profile } => issue_client(dir, name, app_profile)?,
        PeerIdentity::Operator { name } => issue_operator(dir, name)?,
        PeerIdentity::Loader { name, app_profile } => issue_loader(dir, name, app_profile)?,
    }
    let new = CertInfo::of(&first_cert(&path)?)?;
    let old_revoked = if revoke_old {
        revoke_certificate(dir, &old_cert)?;
        true
    } else {
        false
    };
    Ok(Reissued {
        kind,
        name: name.to_owned(),
        old,
        new,
        old_revoked,
    })
}

/// What [`reissue_all`] did.
#[derive(Debug, Clone, Default)]
pub struct ReissuedAll {
    /// The leaves re-issued.
    pub reissued: Vec<Reissued>,
    /// Leaves left alone because their certificate is revoked: re-issuing them
    /// would re-admit an identity the operator banned (re-issue one by name to
    /// re-admit it deliberately).
    pub skipped_revoked: Vec<(LeafKind, String)>,
}

/// Re-issues every leaf of `dir` (all four kinds) whose certificate is not revoked,
/// as in step 2 of a CA rotation.
pub fn reissue_all(dir: &Path) -> Result<ReissuedAll> {
    let crls = read_crls(dir)?;
    let mut done = ReissuedAll::default();
    for (kind, name, path) in leaf_files(dir)? {
        let cert = first_cert(&path)?;
        if is_revoked(&crls, &parse_cert(&cert)?) {
            done.skipped_revoked.push((kind, name));
            continue;
        }
        done.reissued.push(reissue(dir, &name, Some(kind), false)?);
    }
    Ok(done)
}

/// The outcome of [`revoke`].
#[derive(Debug, Clone)]
pub struct Revoked {
    /// The revoked certificate.
    pub cert: CertInfo,
    /// False if it was already revoked (nothing changed).
    pub newly: bool,
    /// Certificates the CRL of its CA now lists.
    pub entries: usize,
    /// The CRL file.
    pub crl: PathBuf,
}

/// Revokes the certificate leaf `name` currently holds (see [`find_leaf`]): its
/// serial goes into the CRL of the CA that signed it, in `dir/crl.pem`.
///
/// To replace a compromised certificate without a window where the leaf has none,
/// use [`reissue`] with `revoke_old` instead.
pub fn revoke(dir: &Path, name: &str, kind: Option<LeafKind>) -> Result<Revoked> {
    let (_, path) = find_leaf(dir, name, kind)?;
    let cert = first_cert(&path)?;
    revoke_certificate(dir, &cert)
}

/// Adds `cert` to the CRL of its CA (which must have its key in `dir`).
pub fn revoke_certificate(dir: &Path, cert: &CertificateDer<'_>) -> Result<Revoked> {
    let info = CertInfo::of(cert)?;
    let parsed = parse_cert(cert)?;
    let ca = signing_ca(dir, &parsed)?.ok_or_else(|| Error::NoIssuingKey {
        serial: info.serial.clone(),
        issuer: info.issuer.clone(),
        dir: dir.to_owned(),
    })?;
    let ca_parsed = parse_cert(&ca.cert)?;
    let ca_name = ca_parsed.subject().as_raw().to_vec();
    let serial = strip_zeros(parsed.raw_serial()).to_vec();

    let mut crls = read_crls(dir)?;
    let mine = crls.iter().position(|c| c.issuer == ca_name);
    let (mut entries, number) = match mine {
        Some(i) => (crls[i].entries.clone(), crls[i].number.clone()),
        None => (Vec::new(), Vec::new()),
    };
    let path = crl_path(dir);
    if entries.iter().any(|(s, _)| *s == serial) {
        return Ok(Revoked {
            cert: info,
            newly: false,
            entries: entries.len(),
            crl: path,
        });
    }
    let now = since_epoch()?;
    entries.push((serial, now.as_secs()));
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let params = CertificateRevocationListParams {
        this_update: epoch + now,
        next_update: epoch + now + CRL_VALIDITY,
        crl_number: SerialNumber::from_slice(&increment(&number)),
        issuing_distribution_point: None,
        revoked_certs: entries
            .iter()
            .map(|(s, at)| RevokedCertParams {
                serial_number: SerialNumber::from_slice(s),
                revocation_time: epoch + Duration::from_secs(*at),
                reason_code: None,
                invalidity_date: None,
            })
            .collect(),
        // The CRL's authority key identifier must name the CA's key as its
        // certificate does.
        key_identifier_method: match key_ids(&ca_parsed).1 {
            Some(ski) => KeyIdMethod::PreSpecified(ski),
            None => KeyIdMethod::Sha256,
        },
    };
    let crl = params.signed_by(&ca.issuer()?)?;
    let text = crl.pem()?;
    let block = CrlBlock {
        text,
        issuer: ca_name,
        entries: Vec::new(),
        number: Vec::new(),
    };
    match mine {
        Some(i) => crls[i] = block,
        None => crls.push(block),
    }
    write_crls(dir, &crls)?;
    Ok(Revoked {
        cert: info,
        newly: true,
        entries: entries.len(),
        crl: path,
    })
}

/// Step 1 of a CA rotation: creates the next CA (`ca-next.key`) and adds its
/// certificate to the bundle `ca.pem`. Returns the new CA.
pub fn rotate_ca_start(dir: &Path) -> Result<CertInfo> {
    // The issuing CA must be sound before we add a second one.
    load_ca_with_key(dir, &ca_key_path(dir))?;
    if ca_next_key_path(dir).exists() {
        return Err(Error::RotationState(format!(
            "a new CA is already staged ({}): run `pangea certs rotate-ca promote`",
            ca_next_key_path(dir).display()
        )));
    }
    if ca_prev_key_path(dir).exists() {
        return Err(Error::RotationState(format!(
            "the previous rotation is not finished ({} exists): re-issue the leaves, then \
             run `pangea certs rotate-ca finish`",
            ca_prev_key_path(dir).display()
        )));
    }
    let bundle = load_ca_bundle(dir)?;
    let mut generation = 1;
    for cert in &bundle {
        generation = generation.max(ca_generation(&common_name(parse_cert(cert)?.subject())));
    }
    let (cert, key) = generate_ca(&format!("{CA_COMMON_NAME} gen {}", generation + 1))?;
    // The key first, with create_new: two racing starts cannot both succeed.
    write_new(&ca_next_key_path(dir), key.serialize_pem().as_bytes(), true)?;
    let mut text = read_to_string(&ca_cert_path(dir))?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&cert.pem());
    replace_file(&ca_cert_path(dir), text.as_bytes())?;
    CertInfo::of(cert.der())
}

/// Step 2 of a CA rotation: the staged CA becomes the issuing CA (`ca.key`); the
/// old issuing key is kept as `ca-prev.key`. Returns the new issuing CA. Leaves
/// issued from now on come from it: re-issue every leaf next.
pub fn rotate_ca_promote(dir: &Path) -> Result<CertInfo> {
    let (current, next, prev) = (
        ca_key_path(dir),
        ca_next_key_path(dir),
        ca_prev_key_path(dir),
    );
    if !next.exists() {
        return Err(Error::RotationState(if prev.exists() {
            "already promoted: re-issue every leaf (`pangea certs reissue --all`), then run \
             `pangea certs rotate-ca finish`"
                .into()
        } else {
            "no CA is staged: run `pangea certs rotate-ca start` first".into()
        }));
    }
    // Checks that the staged CA is still in the bundle (ca.pem was not replaced).
    let staged = load_ca_with_key(dir, &next)?;
    match (current.exists(), prev.exists()) {
        (true, false) => rename(&current, &prev)?,
        // An earlier promote stopped between its two renames: finish it.
        (false, true) => {}
        (true, true) => {
            return Err(Error::RotationState(format!(
                "{} exists: finish the previous rotation first",
                prev.display()
            )));
        }
        (false, false) => {
            return Err(Error::File {
                path: current,
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
    }
    rename(&next, &current)?;
    CertInfo::of(&staged.cert)
}

/// Step 3 of a CA rotation: removes the retired CA (`ca-prev.key`) from the bundle
/// and its CRL from `crl.pem`, then deletes its key. Refused with
/// [`Error::CaStillInUse`] while a leaf of `dir` still comes from it, unless
/// `force`. Returns the removed CA.
pub fn rotate_ca_finish(dir: &Path, force: bool) -> Result<CertInfo> {
    let prev = ca_prev_key_path(dir);
    if !prev.exists() {
        return Err(Error::RotationState(
            "no retired CA to remove: run `pangea certs rotate-ca start`, then `promote`".into(),
        ));
    }
    let old = load_ca_with_key(dir, &prev)?;
    let old_parsed = parse_cert(&old.cert)?;
    // Leaves that still need the old CA; revoked ones do not (they are refused
    // everywhere already).
    let crls = read_crls(dir)?;
    let mut still = Vec::new();
    for (kind, name, path) in leaf_files(dir)? {
        let cert = first_cert(&path)?;
        let parsed = parse_cert(&cert)?;
        if issued_by(&parsed, &old_parsed) && !is_revoked(&crls, &parsed) {
            still.push(format!("{} {name}", kind.as_str()));
        }
    }
    if !still.is_empty() && !force {
        return Err(Error::CaStillInUse {
            ca: common_name(old_parsed.subject()),
            leaves: still,
        });
    }
    let bundle_path = ca_cert_path(dir);
    let text = read_to_string(&bundle_path)?;
    let mut kept = String::new();
    for block in pem_blocks(&text, "CERTIFICATE") {
        let der = CertificateDer::from_pem_slice(block.as_bytes())
            .map_err(|e| pem_error(&bundle_path, e))?;
        if der != old.cert {
            kept.push_str(block);
        }
    }
    if kept.is_empty() {
        return Err(Error::RotationState(
            "removing the retired CA would leave the bundle empty".into(),
        ));
    }
    replace_file(&bundle_path, kept.as_bytes())?;
    let old_name = old_parsed.subject().as_raw();
    let crls: Vec<CrlBlock> = read_crls(dir)?
        .into_iter()
        .filter(|c| c.issuer != old_name)
        .collect();
    write_crls(dir, &crls)?;
    fs::remove_file(&prev).map_err(|source| Error::File { path: prev, source })?;
    CertInfo::of(&old.cert)
}

/// One CA of the bundle and its role in the directory.
#[derive(Debug, Clone)]
pub struct CaStatus {
    /// The CA certificate.
    pub info: CertInfo,
    /// `issuing` (`ca.key`), `staged` (`ca-next.key`), `retired` (`ca-prev.key`),
    /// or `trusted` (no key here).
    pub role: &'static str,
}

/// One leaf of the directory.
#[derive(Debug, Clone)]
pub struct LeafStatus {
    /// Replica, client, operator or loader.
    pub kind: LeafKind,
    /// Replica id, or client, operator or loader name.
    pub name: String,
    /// Its certificate.
    pub info: CertInfo,
    /// Listed in its CA's CRL.
    pub revoked: bool,
    /// Its CA is in the bundle.
    pub trusted: bool,
}

/// The CAs of the bundle and every leaf, for `pangea certs list`.
pub fn status(dir: &Path) -> Result<(Vec<CaStatus>, Vec<LeafStatus>)> {
    let bundle = load_ca_bundle(dir)?;
    let mut roles: Vec<(Vec<u8>, &'static str)> = Vec::new();
    for (path, role) in [
        (ca_key_path(dir), "issuing"),
        (ca_next_key_path(dir), "staged"),
        (ca_prev_key_path(dir), "retired"),
    ] {
        if path.exists() {
            roles.push((load_ca_with_key(dir, &path)?.cert.to_vec(), role));
        }
    }
    let mut cas = Vec::new();
    let mut parsed_cas = Vec::new();
    for cert in &bundle {
        let role = roles
            .iter()
            .find(|(der, _)| der.as_slice() == cert.as_ref())
            .map_or("trusted", |(_, r)| r);
        cas.push(CaStatus {
            info: CertInfo::of(cert)?,
            role,
        });
        parsed_cas.push(parse_cert(cert)?);
    }
    let crls = read_crls(dir)?;
    let mut leaves = Vec::new();
    for (kind, name, path) in leaf_files(dir)? {
        let cert = first_cert(&path)?;
        let parsed = parse_cert(&cert)?;
        let revoked = is_revoked(&crls, &parsed);
        let trusted = parsed_cas.iter().any(|ca| issued_by(&parsed, ca));
        leaves.push(LeafStatus {
            kind,
            name,
            info: CertInfo::of(&cert)?,
            revoked,
            trusted,
        });
    }
    Ok((cas, leaves))
}

// ---- helpers ---------------------------------------------------------------------

fn parse_cert<'a>(cert: &'a CertificateDer<'_>) -> Result<X509Certificate<'a>> {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .map(|(_, c)| c)
        .map_err(|e| Error::CertificateParse(e.to_string()))
}

fn first_cert(path: &Path) -> Result<CertificateDer<'static>> {
    load_certs(path)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Pem {
            path: path.to_owned(),
            reason: "no CERTIFICATE section found".into(),
        })
}

fn common_name(name: &x509_parser::x509::X509Name<'_>) -> String {
    name.iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// `Pangea cluster CA` is generation 1, `Pangea cluster CA gen 7` generation 7;
/// other names count as 1.
fn ca_generation(cn: &str) -> u32 {
    cn.strip_prefix(CA_COMMON_NAME)
        .and_then(|rest| rest.strip_prefix(" gen "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

fn strip_zeros(raw: &[u8]) -> &[u8] {
    let start = raw.iter().position(|b| *b != 0).unwrap_or(raw.len());
    &raw[start..]
}

/// (authority key id, subject key id) of a certificate, where present.
fn key_ids(cert: &X509Certificate<'_>) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let (mut aki, mut ski) = (None, None);
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(a) => {
                aki = a.key_identifier.as_ref().map(|k| k.0.to_vec());
            }
            ParsedExtension::SubjectKeyIdentifier(k) => ski = Some(k.0.to_vec()),
            _ => {}
        }
    }
    (aki, ski)
}

/// Whether `leaf` names `ca` as its issuer: same name and, when both carry key
/// identifiers, the same key (two clusters' first CAs share a name).
fn issued_by(leaf: &X509Certificate<'_>, ca: &X509Certificate<'_>) -> bool {
    if leaf.issuer().as_raw() != ca.subject().as_raw() {
        return false;
    }
    match (key_ids(leaf).0, key_ids(ca).1) {
        (Some(aki), Some(ski)) => aki == ski,
        _ => true,
    }
}

/// Whether the CRL of `cert`'s issuer lists it.
fn is_revoked(crls: &[CrlBlock], cert: &X509Certificate<'_>) -> bool {
    let serial = strip_zeros(cert.raw_serial());
    crls.iter()
        .any(|c| c.issuer == cert.issuer().as_raw() && c.entries.iter().any(|(s, _)| s == serial))
}

/// The CA of `dir` (issuing, staged or retired: those with a key) that signed `leaf`.
fn signing_ca(dir: &Path, leaf: &X509Certificate<'_>) -> Result<Option<CaWithKey>> {
    for path in [
        ca_key_path(dir),
        ca_prev_key_path(dir),
        ca_next_key_path(dir),
    ] {
        if !path.exists() {
            continue;
        }
        let ca = load_ca_with_key(dir, &path)?;
        if issued_by(leaf, &parse_cert(&ca.cert)?) {
            return Ok(Some(ca));
        }
    }
    Ok(None)
}

/// Every leaf certificate file: (kind, name, path), sorted.
fn leaf_files(dir: &Path) -> Result<Vec<(LeafKind, String, PathBuf)>> {
    let mut out = Vec::new();
    for kind in LeafKind::ALL {
        let path = dir.join(kind.dir_name());
        let entries = match fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(Error::File { path, source }),
        };
        for entry in entries {
            let entry = entry.map_err(|source| Error::File {
                path: path.clone(),
                source,
            })?;
            let file = entry.path();
            // `<name>.pem` only: not keys, not `.pem.tmp` leftovers of a failed write.
            if file.extension().is_some_and(|e| e == "pem")
                && let Some(name) = file.file_stem().and_then(|s| s.to_str())
                && validate_name("certificate name", name).is_ok()
            {
                out.push((kind, name.to_owned(), file.clone()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The PEM blocks labelled `label` in `text`, each with its END line and a newline.
fn pem_blocks<'a>(text: &'a str, label: &str) -> Vec<&'a str> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(b) = rest.find(&begin) {
        let Some(e) = rest[b..].find(&end) else { break };
        let mut stop = b + e + end.len();
        if rest[stop..].starts_with("\r\n") {
            stop += 2;
        } else if rest[stop..].starts_with('\n') {
            stop += 1;
        }
        out.push(&rest[b..stop]);
        rest = &rest[stop..];
    }
    out
}

/// One CRL of `crl.pem`: its PEM text, issuer name (raw DER), revoked serials
/// (without leading zeros) with their revocation time, and CRL number.
struct CrlBlock {
    text: String,
    issuer: Vec<u8>,
    entries: Vec<(Vec<u8>, u64)>,
    number: Vec<u8>,
}

fn read_crls(dir: &Path) -> Result<Vec<CrlBlock>> {
    let path = crl_path(dir);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(Error::File { path, source }),
    };
    let mut out = Vec::new();
    for block in pem_blocks(&text, "X509 CRL") {
        let der = CertificateRevocationListDer::from_pem_slice(block.as_bytes())
            .map_err(|e| pem_error(&path, e))?;
        let (_, crl) = x509_parser::parse_x509_crl(der.as_ref()).map_err(|e| Error::Pem {
            path: path.clone(),
            reason: format!("not a valid CRL: {e}"),
        })?;
        let mut ending = block.to_owned();
        if !ending.ends_with('\n') {
            ending.push('\n');
        }
        out.push(CrlBlock {
            text: ending,
            issuer: crl.issuer().as_raw().to_vec(),
            entries: crl
                .iter_revoked_certificates()
                .map(|r| {
                    (
                        strip_zeros(&r.user_certificate.to_bytes_be()).to_vec(),
                        u64::try_from(r.revocation_date.timestamp()).unwrap_or(0),
                    )
                })
                .collect(),
            number: crl
                .crl_number()
                .map(|n| n.to_bytes_be())
                .unwrap_or_default(),
        });
    }
    Ok(out)
}

/// Writes the CRLs (or removes `crl.pem` when there are none).
fn write_crls(dir: &Path, crls: &[CrlBlock]) -> Result<()> {
    let path = crl_path(dir);
    if crls.is_empty() {
        return match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::File { path, source }),
        };
    }
    let text: String = crls.iter().map(|c| c.text.as_str()).collect();
    replace_file(&path, text.as_bytes())
}

/// Replaces a public file atomically (temporary file, then rename).
fn replace_file(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = write_temp(path, contents, false)?;
    rename(&tmp, path)
}

/// A big-endian unsigned number plus one (an empty slice is zero).
fn increment(number: &[u8]) -> Vec<u8> {
    let mut out = number.to_vec();
    for byte in out.iter_mut().rev() {
        if *byte == 0xff {
            *byte = 0;
        } else {
            *byte += 1;
            return out;
        }
    }
    out.insert(0, 1);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc_date(0), "1970-01-01");
        assert_eq!(super::utc_date(951_782_400), "2000-02-29");
        assert_eq!(super::utc_date(1_767_225_599), "2025-12-31");
    }

    use super::*;
    use crate::certs::{self, load_ca};

    fn tempdir() -> Result<tempfile::TempDir> {
        tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })
    }

    #[test]
    fn serials_and_numbers() {
        assert_eq!(serial_hex(&[0, 0x7f, 0x01]), "7f01");
        assert_eq!(serial_hex(&[0, 0]), "00");
        assert_eq!(increment(&[]), vec![1]);
        assert_eq!(increment(&[0x01, 0xff]), vec![0x02, 0x00]);
        assert_eq!(increment(&[0xff]), vec![0x01, 0x00]);
        assert_eq!(ca_generation("Pangea cluster CA"), 1);
        assert_eq!(ca_generation("Pangea cluster CA gen 12"), 12);
    }

    #[test]
    fn revoking_is_recorded_once_per_ca() -> Result<()> {
        let dir = tempdir()?;
        let d = dir.path();
        certs::init_ca(d)?;
        certs::issue_client(d, "c1", "frontend")?;
        certs::issue_client(d, "c2", "frontend")?;
        let first = revoke(d, "c1", None)?;
        assert!(first.newly);
        assert_eq!(first.entries, 1);
        let again = revoke(d, "c1", None)?;
        assert!(!again.newly);
        let second = revoke(d, "c2", Some(LeafKind::Client))?;
        assert_eq!(second.entries, 2);
        let crls = read_crls(d)?;
        assert_eq!(crls.len(), 1, "one CRL for the one CA");
        assert_eq!(crls[0].number, vec![2]);
        let (_, leaves) = status(d)?;
        assert!(leaves.iter().all(|l| l.revoked && l.trusted));
        Ok(())
    }

    #[test]
    fn operator_and_loader_leaves_are_found_reissued_and_revoked() -> Result<()> {
        let dir = tempdir()?;
        let d = dir.path();
        certs::init_ca(d)?;
        certs::issue_operator(d, "alice")?;
        certs::issue_loader(d, "etl", "serving")?;
        // A client may share an operator's name: they are different leaves.
        certs::issue_client(d, "alice", "frontend")?;

        assert_eq!(
            find_leaf(d, "etl", None)?,
            (LeafKind::Loader, certs::loader_cert_path(d, "etl"))
        );
        match find_leaf(d, "alice", None) {
            Err(e @ Error::AmbiguousLeaf { .. }) => assert_eq!(
                e.to_string(),
                "several certificates are named \"alice\" (client, operator): say which kind \
                 (--kind client|operator)"
            ),
            other => panic!("expected AmbiguousLeaf, got {other:?}"),
        }
        assert!(matches!(
            find_leaf(d, "etl", Some(LeafKind::Operator)),
            Err(Error::NoSuchLeaf { .. })
        ));

        // Re-issue keeps the identity, loader app profile included.
        let loader = reissue(d, "etl", None, false)?;
        assert_eq!(loader.kind, LeafKind::Loader);
        assert_ne!(loader.old.serial, loader.new.serial);
        assert_eq!(
            PeerIdentity::from_certificate(&certs::load_loader(d, "etl")?.chain[0])?,
            PeerIdentity::Loader {
                name: "etl".into(),
                app_profile: "serving".into()
            }
        );
        let operator = reissue(d, "alice", Some(LeafKind::Operator), true)?;
        assert_eq!(operator.kind, LeafKind::Operator);
        assert!(operator.old_revoked);
        assert_eq!(
            PeerIdentity::from_certificate(&certs::load_operator(d, "alice")?.chain[0])?,
            PeerIdentity::Operator {
                name: "alice".into()
            }
        );

        // A file holding another kind's certificate is not re-issued as that kind.
        fs::copy(
            certs::client_cert_path(d, "alice"),
            certs::loader_cert_path(d, "alice"),
        )
        .map_err(|source| Error::File {
            path: certs::loader_cert_path(d, "alice"),
            source,
        })?;
        let err = reissue(d, "alice", Some(LeafKind::Loader), false).err();
        assert!(
            matches!(&err, Some(Error::Pem { reason, .. }) if reason.contains("not of loader alice")),
            "{err:?}"
        );
        fs::remove_file(certs::loader_cert_path(d, "alice")).map_err(|source| Error::File {
            path: certs::loader_cert_path(d, "alice"),
            source,
        })?;

        // Revoked by kind; listed; skipped by re-issue --all.
        assert!(revoke(d, "etl", Some(LeafKind::Loader))?.newly);
        let (_, leaves) = status(d)?;
        let listed: Vec<(LeafKind, &str, bool)> = leaves
            .iter()
            .map(|l| (l.kind, l.name.as_str(), l.revoked))
            .collect();
        assert_eq!(
            listed,
            vec![
                (LeafKind::Client, "alice", false),
                (LeafKind::Operator, "alice", false),
                (LeafKind::Loader, "etl", true),
            ]
        );
        let all = reissue_all(d)?;
        assert_eq!(
            all.reissued
                .iter()
                .map(|r| (r.kind, r.name.as_str()))
                .collect::<Vec<_>>(),
            vec![(LeafKind::Client, "alice"), (LeafKind::Operator, "alice")]
        );
        assert_eq!(all.skipped_revoked, vec![(LeafKind::Loader, "etl".into())]);
        Ok(())
    }

    #[test]
    fn ca_rotation_waits_for_operator_and_loader_leaves() -> Result<()> {
        let dir = tempdir()?;
        let d = dir.path();
        certs::init_ca(d)?;
        certs::issue_operator(d, "alice")?;
        certs::issue_loader(d, "etl", "serving")?;
        rotate_ca_start(d)?;
        rotate_ca_promote(d)?;
        match rotate_ca_finish(d, false) {
            Err(Error::CaStillInUse { leaves, .. }) => {
                assert_eq!(leaves, vec!["operator alice", "loader etl"]);
            }
            other => panic!("expected CaStillInUse, got {other:?}"),
        }
        assert_eq!(reissue_all(d)?.reissued.len(), 2);
        rotate_ca_finish(d, false)?;
        let (_, leaves) = status(d)?;
        assert_eq!(leaves.len(), 2);
        assert!(leaves.iter().all(|l| l.trusted && !l.revoked));
        Ok(())
    }

    #[test]
    fn ca_rotation_steps_and_their_guards() -> Result<()> {
        let dir = tempdir()?;
        let d = dir.path();
        certs::init_ca(d)?;
        certs::issue_replica(d, "r1", "eu")?;
        assert!(matches!(rotate_ca_promote(d), Err(Error::RotationState(_))));
        assert!(matches!(
            rotate_ca_finish(d, false),
            Err(Error::RotationState(_))
        ));
        let next = rotate_ca_start(d)?;
        assert_eq!(next.subject, "Pangea cluster CA gen 2");
        assert_eq!(load_ca_bundle(d)?.len(), 2);
        assert!(load_ca(d).is_err(), "a bundle is not a single CA");
        assert!(matches!(rotate_ca_start(d), Err(Error::RotationState(_))));
        // Before promotion, leaves still come from the first CA.
        assert_eq!(
            reissue(d, "r1", None, false)?.new.issuer,
            "Pangea cluster CA"
        );
        rotate_ca_promote(d)?;
        assert!(matches!(rotate_ca_promote(d), Err(Error::RotationState(_))));
        assert!(matches!(rotate_ca_start(d), Err(Error::RotationState(_))));
        let r = reissue(d, "r1", None, false)?;
        assert_eq!(r.old.issuer, "Pangea cluster CA");
        assert_eq!(r.new.issuer, "Pangea cluster CA gen 2");
        let finished = rotate_ca_finish(d, false)?;
        assert_eq!(finished.subject, "Pangea cluster CA");
        assert_eq!(load_ca_bundle(d)?.len(), 1);
        assert!(!ca_prev_key_path(d).exists());
        let (cas, leaves) = status(d)?;
        assert_eq!(cas.len(), 1);
        assert_eq!(cas[0].role, "issuing");
        assert!(leaves.iter().all(|l| l.trusted && !l.revoked));
        // The next rotation names its CA gen 3.
        assert_eq!(rotate_ca_start(d)?.subject, "Pangea cluster CA gen 3");
        Ok(())
    }

    #[test]
    fn finish_refuses_while_old_leaves_remain() -> Result<()> {
        let dir = tempdir()?;
        let d = dir.path();
        certs::init_ca(d)?;
        certs::issue_replica(d, "r1", "eu")?;
        certs::issue_client(d, "c1", "frontend")?;
        revoke(d, "c1", None)?;
        rotate_ca_start(d)?;
        rotate_ca_promote(d)?;
        reissue(d, "c1", None, false)?;
        match rotate_ca_finish(d, false) {
            Err(Error::CaStillInUse { leaves, .. }) => assert_eq!(leaves, vec!["replica r1"]),
            other => panic!("expected CaStillInUse, got {other:?}"),
        }
        // c1 is revoked and re-issued; revoke the new one too: `--all` must leave it
        // alone, and finishing must not wait for it.
        revoke(d, "c1", None)?;
        let all = reissue_all(d)?;
        assert_eq!(all.reissued.len(), 1);
        assert_eq!(
            all.skipped_revoked,
            vec![(LeafKind::Client, "c1".to_owned())]
        );
        rotate_ca_finish(d, false)?;
        // The old CA's CRL went with it; the new CA's stays.
        assert_eq!(read_crls(d)?.len(), 1);
        Ok(())
    }
}
