//! Who is on the other end of a connection, read from its certificate; and who a
//! process itself claims to be.
//!
//! The TLS handshake proved the peer holds a key certified by the cluster CA; this
//! module turns that certificate into a [`PeerIdentity`] by parsing the one
//! `pangea://` URI in its subject alternative names (the certificates are written
//! by [`crate::certs`]). Nothing else in the certificate (common name, DNS names) is
//! identity: the DNS names exist only for TLS server-name checks.
//!
//! # Identity URIs
//!
//! There are four kinds of identity, each with exactly one URI form:
//!
//! ```text
//! pangea://replica/<replica_id>?region=<region>      a replica of the topology
//! pangea://client/<name>?app_profile=<profile>       a data client (ad-serving frontend)
//! pangea://operator/<name>                           a person or tool administering the cluster
//! pangea://loader/<name>?app_profile=<profile>       a batch pipeline writing for an app profile
//! ```
//!
//! Every `<...>` passes [`crate::certs::validate_name`] (1..=128 bytes of ASCII
//! letters, digits, `_`, `-`, `.`), so no part can hide a `/`, `?`, `=` or `&`.
//! The query, where a kind has one, is exactly one `key=value` with the key shown;
//! an operator has none, and anything after its name is malformed. What each kind
//! may do is decided by the node, not here.
//!
//! The parser is strict — exactly one identity URI, exactly the forms above —
//! because a lenient parser is where two components start disagreeing about who a
//! peer is.
//!
//! # Credentials
//!
//! A [`Credential`] is the certificate a client-side process (a frontend, a tool, a
//! batch loader) presents: its kind and name, which locate its files in the
//! certificate directory. When such a process loads its certificate it checks that
//! the certificate holds that identity ([`crate::reload::ExpectedIdentity`]), so a
//! file copied to the wrong place is refused at start instead of acting as someone
//! else.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

use crate::certs::{
    IDENTITY_SCHEME, client_cert_path, loader_cert_path, operator_cert_path, validate_name,
};
use crate::error::{Error, Result};

/// The authenticated identity of a peer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerIdentity {
    /// Another replica (`pangea://replica/<id>?region=<region>`).
    Replica {
        /// The replica's id, as in the topology file.
        id: String,
        /// The region it belongs to: checked against the topology by the caller.
        region: String,
    },
    /// An ad-serving frontend (`pangea://client/<name>?app_profile=<profile>`).
    Client {
        /// The client's name.
        name: String,
        /// The app profile it may act for: requests naming another are refused.
        app_profile: String,
    },
    /// A person or tool administering the cluster (`pangea://operator/<name>`).
    /// Bound to no app profile: what an operator may do is decided per action.
    Operator {
        /// The operator's name (recorded in audit logs).
        name: String,
    },
    /// A batch pipeline (`pangea://loader/<name>?app_profile=<profile>`).
    Loader {
        /// The loader's name.
        name: String,
        /// The app profile it loads data for.
        app_profile: String,
    },
}

impl PeerIdentity {
    /// Parses an identity URI of one of the four forms in the module
    /// documentation; anything else is [`Error::MalformedIdentity`].
    pub fn from_uri(uri: &str) -> Result<Self> {
        let malformed = |reason: &str| Error::MalformedIdentity {
            uri: uri.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = uri
            .strip_prefix(IDENTITY_SCHEME)
            .ok_or_else(|| malformed("does not start with pangea://"))?;
        let (kind, rest) = rest
            .split_once('/')
            .ok_or_else(|| malformed("expected pangea://<kind>/<name>"))?;
        // validate_name rejects '/', '?', '=' and '&', so a valid name and value
        // cannot hide extra path segments or query parameters.
        let check = |what, s: &str| validate_name(what, s).map_err(|e| malformed(&e.to_string()));
        let expected_key = match kind {
            "replica" => "region",
            "client" | "loader" => "app_profile",
            "operator" => {
                if rest.contains('?') {
                    return Err(malformed("an operator identity takes no ?query"));
                }
                check("operator name", rest)?;
                return Ok(Self::Operator {
                    name: rest.to_owned(),
                });
            }
            _ => {
                return Err(malformed("kind is not replica, client, operator or loader"));
            }
        };
        let (name, query) = rest
            .split_once('?')
            .ok_or_else(|| malformed(&format!("a {kind} identity needs ?{expected_key}=")))?;
        let (key, value) = query
            .split_once('=')
            .ok_or_else(|| malformed("query is not <key>=<value>"))?;
        if key != expected_key {
            return Err(malformed(&format!(
                "a {kind} identity takes ?{expected_key}=, not ?{key}="
            )));
        }
        Ok(match kind {
            "replica" => {
                check("replica id", name)?;
                check("region", value)?;
                Self::Replica {
                    id: name.to_owned(),
                    region: value.to_owned(),
                }
            }
            "client" => {
                check("client name", name)?;
                check("app profile", value)?;
                Self::Client {
                    name: name.to_owned(),
                    app_profile: value.to_owned(),
                }
            }
            _ => {
                check("loader name", name)?;
                check("app profile", value)?;
                Self::Loader {
                    name: name.to_owned(),
                    app_profile: value.to_owned(),
                }
            }
        })
    }

    /// The URI form written into certificates (inverse of [`Self::from_uri`]).
    pub fn to_uri(&self) -> String {
        match self {
            Self::Replica { id, region } => {
                format!("{IDENTITY_SCHEME}replica/{id}?region={region}")
            }
            Self::Client { name, app_profile } => {
                format!("{IDENTITY_SCHEME}client/{name}?app_profile={app_profile}")
            }
            Self::Operator { name } => format!("{IDENTITY_SCHEME}operator/{name}"),
            Self::Loader { name, app_profile } => {
                format!("{IDENTITY_SCHEME}loader/{name}?app_profile={app_profile}")
            }
        }
    }

    /// Reads the identity from a DER certificate (a peer's leaf).
    pub fn from_certificate(cert: &CertificateDer<'_>) -> Result<Self> {
        let (_rest, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
            .map_err(|e| Error::CertificateParse(e.to_string()))?;
        let san = parsed
            .subject_alternative_name()
            .map_err(|e| Error::CertificateParse(e.to_string()))?
            .ok_or(Error::MissingIdentity)?;
        let uris: Vec<&str> = san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::URI(uri) if uri.starts_with(IDENTITY_SCHEME) => Some(*uri),
                _ => None,
            })
            .collect();
        match uris.as_slice() {
            [] => Err(Error::MissingIdentity),
            [uri] => Self::from_uri(uri),
            many => Err(Error::AmbiguousIdentity { count: many.len() }),
        }
    }

    /// `replica`, `client`, `operator` or `loader`: the path segment after
    /// `pangea://` (for logs and metrics labels).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Replica { .. } => "replica",
            Self::Client { .. } => "client",
            Self::Operator { .. } => "operator",
            Self::Loader { .. } => "loader",
        }
    }

    /// The replica id or the client, operator or loader name.
    pub fn name(&self) -> &str {
        match self {
            Self::Replica { id: name, .. }
            | Self::Client { name, .. }
            | Self::Operator { name }
            | Self::Loader { name, .. } => name,
        }
    }

    /// The app profile a client or loader acts for (`None` for replicas and
    /// operators).
    pub fn app_profile(&self) -> Option<&str> {
        match self {
            Self::Client { app_profile, .. } | Self::Loader { app_profile, .. } => {
                Some(app_profile)
            }
            Self::Replica { .. } | Self::Operator { .. } => None,
        }
    }

    /// The replica id, if the peer is a replica.
    pub fn replica_id(&self) -> Option<&str> {
        match self {
            Self::Replica { id, .. } => Some(id),
            Self::Client { .. } | Self::Operator { .. } | Self::Loader { .. } => None,
        }
    }
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Replica { id, region } => write!(f, "replica {id} (region {region})"),
            Self::Client { name, app_profile } => {
                write!(f, "client {name} (app profile {app_profile})")
            }
            Self::Operator { name } => write!(f, "operator {name}"),
            Self::Loader { name, app_profile } => {
                write!(f, "loader {name} (app profile {app_profile})")
            }
        }
    }
}

/// The certificate a client-side process presents: a data client, an operator's
/// tool or a batch loader. The kind and name locate its files (`clients/`,
/// `operators/`, `loaders/` of the certificate directory, see [`crate::certs`]);
/// loading them through [`crate::reload::TlsFiles::for_credential`] checks that the
/// certificate holds that identity. Replicas are not credentials: they load their
/// files with [`crate::reload::TlsFiles::replica`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Credential {
    /// `clients/<name>.pem`: a `pangea://client/<name>?app_profile=…` certificate.
    Client(String),
    /// `operators/<name>.pem`: a `pangea://operator/<name>` certificate.
    Operator(String),
    /// `loaders/<name>.pem`: a `pangea://loader/<name>?app_profile=…` certificate.
    Loader(String),
}

impl Credential {
    /// `client`, `operator` or `loader` (as [`PeerIdentity::kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Client(_) => "client",
            Self::Operator(_) => "operator",
            Self::Loader(_) => "loader",
        }
    }

    /// The client, operator or loader name.
    pub fn name(&self) -> &str {
        match self {
            Self::Client(name) | Self::Operator(name) | Self::Loader(name) => name,
        }
    }

    /// Checks the name as [`validate_name`] does, naming the kind in the error.
    pub fn validate(&self) -> Result<()> {
        let what = match self {
            Self::Client(_) => "client name",
            Self::Operator(_) => "operator name",
            Self::Loader(_) => "loader name",
        };
        validate_name(what, self.name())
    }

    /// The certificate file of this credential in certificate directory `dir`
    /// (the key is the same path with `.key`).
    pub fn cert_path(&self, dir: &Path) -> PathBuf {
        match self {
            Self::Client(name) => client_cert_path(dir, name),
            Self::Operator(name) => operator_cert_path(dir, name),
            Self::Loader(name) => loader_cert_path(dir, name),
        }
    }

    /// Whether `identity` is this credential's: same kind, same name (any app
    /// profile).
    pub fn is_held_by(&self, identity: &PeerIdentity) -> bool {
        match (self, identity) {
            (Self::Client(want), PeerIdentity::Client { name, .. })
            | (Self::Operator(want), PeerIdentity::Operator { name })
            | (Self::Loader(want), PeerIdentity::Loader { name, .. }) => want == name,
            _ => false,
        }
    }
}

impl fmt::Display for Credential {
    /// `client <name>`, `operator <name>` or `loader <name>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.name())
    }
}

/// The identity of the peer of an established connection, from the leaf of the
/// certificate chain it presented (verified against the cluster CA by rustls).
pub fn peer_identity(conn: &quinn::Connection) -> Result<PeerIdentity> {
    let any = conn.peer_identity().ok_or(Error::NoPeerCertificate)?;
    // quinn's rustls session reports the chain as Vec<CertificateDer>; any other
    // type would mean another crypto backend, which this crate never configures.
    let chain = any
        .downcast::<Vec<CertificateDer<'static>>>()
        .map_err(|_| Error::NoPeerCertificate)?;
    let leaf = chain.first().ok_or(Error::NoPeerCertificate)?;
    PeerIdentity::from_certificate(leaf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs;

    fn tempdir() -> Result<tempfile::TempDir> {
        tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })
    }

    #[test]
    fn identities_round_trip_through_certificates() -> Result<()> {
        let dir = tempdir()?;
        let d = dir.path();
        certs::init_ca(d)?;
        certs::issue_replica(d, "eu-west1-b", "eu-west1")?;
        certs::issue_replica(d, "r_7", "asia")?;
        certs::issue_client(d, "frontend-1", "serving")?;
        certs::issue_operator(d, "alice")?;
        certs::issue_loader(d, "nightly.import", "serving")?;

        let replica = certs::load_replica(d, "eu-west1-b")?;
        assert_eq!(
            PeerIdentity::from_certificate(&replica.chain[0])?,
            PeerIdentity::Replica {
                id: "eu-west1-b".into(),
                region: "eu-west1".into()
            }
        );
        let odd = certs::load_replica(d, "r_7")?;
        assert_eq!(
            PeerIdentity::from_certificate(&odd.chain[0])?.replica_id(),
            Some("r_7")
        );
        let client = certs::load_client(d, "frontend-1")?;
        assert_eq!(
            PeerIdentity::from_certificate(&client.chain[0])?,
            PeerIdentity::Client {
                name: "frontend-1".into(),
                app_profile: "serving".into()
            }
        );
        let operator = PeerIdentity::from_certificate(&certs::load_operator(d, "alice")?.chain[0])?;
        assert_eq!(
            operator,
            PeerIdentity::Operator {
                name: "alice".into()
            }
        );
        assert_eq!(operator.kind(), "operator");
        assert_eq!(operator.app_profile(), None);
        assert_eq!(operator.to_string(), "operator alice");
        let loader =
            PeerIdentity::from_certificate(&certs::load_loader(d, "nightly.import")?.chain[0])?;
        assert_eq!(
            loader,
            PeerIdentity::Loader {
                name: "nightly.import".into(),
                app_profile: "serving".into()
            }
        );
        assert_eq!(loader.kind(), "loader");
        assert_eq!(loader.name(), "nightly.import");
        assert_eq!(loader.app_profile(), Some("serving"));
        assert_eq!(loader.replica_id(), None);
        Ok(())
    }

    #[test]
    fn uri_round_trip() -> Result<()> {
        for (id, uri, kind) in [
            (
                PeerIdentity::Replica {
                    id: "a".into(),
                    region: "b".into(),
                },
                "pangea://replica/a?region=b",
                "replica",
            ),
            (
                PeerIdentity::Client {
                    name: "c.d".into(),
                    app_profile: "e_f".into(),
                },
                "pangea://client/c.d?app_profile=e_f",
                "client",
            ),
            (
                PeerIdentity::Operator {
                    name: "ops-1".into(),
                },
                "pangea://operator/ops-1",
                "operator",
            ),
            (
                PeerIdentity::Loader {
                    name: "etl".into(),
                    app_profile: "serving".into(),
                },
                "pangea://loader/etl?app_profile=serving",
                "loader",
            ),
        ] {
            assert_eq!(id.to_uri(), uri);
            assert_eq!(PeerIdentity::from_uri(uri)?, id);
            assert_eq!(id.kind(), kind);
        }
        Ok(())
    }

    #[test]
    fn malformed_uris_are_typed_errors() {
        for bad in [
            "http://replica/a?region=b",
            "pangea://replica",
            "pangea://replica/a",
            "pangea://replica/a?zone=b",
            "pangea://replica/a?region",
            "pangea://replica/a?region=",
            "pangea://replica/?region=b",
            "pangea://replica/a/b?region=c",
            "pangea://replica/a?region=b&x=y",
            "pangea://replica/a?region=b=c",
            "pangea://client/a?region=b",
            "pangea://admin/a?region=b",
            "pangea://admin/a",
            "pangea://client/a?app_profile=b c",
            "pangea://client/a",
            // Operators: a name and nothing else.
            "pangea://operator",
            "pangea://operator/",
            "pangea://operator/a?x=y",
            "pangea://operator/a?",
            "pangea://operator/a?app_profile=b",
            "pangea://operator/a/b",
            "pangea://operator/a b",
            "pangea://operator/..",
            // Loaders: like clients.
            "pangea://loader/a",
            "pangea://loader/a?",
            "pangea://loader/a?region=b",
            "pangea://loader/?app_profile=b",
            "pangea://loader/a?app_profile=",
            "pangea://loader/a?app_profile=b&c=d",
            "pangea://Loader/a?app_profile=b",
            "pangea://replicas/a?region=b",
            "pangea:///a?region=b",
        ] {
            let err = PeerIdentity::from_uri(bad).err();
            assert!(
                matches!(err, Some(Error::MalformedIdentity { .. })),
                "{bad:?} gave {err:?}"
            );
        }
    }

    #[test]
    fn credentials_name_their_files_and_match_only_their_identity() -> Result<()> {
        let d = Path::new("certs");
        let operator = Credential::Operator("alice".into());
        assert_eq!(operator.cert_path(d), d.join("operators/alice.pem"));
        assert_eq!(operator.to_string(), "operator alice");
        assert_eq!(
            Credential::Loader("etl".into()).cert_path(d),
            d.join("loaders/etl.pem")
        );
        assert_eq!(
            Credential::Client("fe".into()).cert_path(d),
            d.join("clients/fe.pem")
        );
        assert!(operator.is_held_by(&PeerIdentity::from_uri("pangea://operator/alice")?));
        for other in [
            "pangea://operator/bob",
            "pangea://client/alice?app_profile=p",
            "pangea://loader/alice?app_profile=p",
            "pangea://replica/alice?region=r",
        ] {
            assert!(
                !operator.is_held_by(&PeerIdentity::from_uri(other)?),
                "{other}"
            );
        }
        assert!(
            Credential::Loader("etl".into()).is_held_by(&PeerIdentity::from_uri(
                "pangea://loader/etl?app_profile=x"
            )?)
        );
        assert!(matches!(
            Credential::Operator("a/b".into()).validate(),
            Err(Error::InvalidName {
                what: "operator name",
                ..
            })
        ));
        Ok(())
    }

    #[test]
    fn certificates_without_identity_are_refused() -> Result<()> {
        // No SAN at all.
        let key = rcgen::KeyPair::generate()?;
        let bare = rcgen::CertificateParams::default().self_signed(&key)?;
        assert!(matches!(
            PeerIdentity::from_certificate(bare.der()),
            Err(Error::MissingIdentity)
        ));
        // A SAN with only a DNS name.
        let dns_only =
            rcgen::CertificateParams::new(vec!["localhost".to_string()])?.self_signed(&key)?;
        assert!(matches!(
            PeerIdentity::from_certificate(dns_only.der()),
            Err(Error::MissingIdentity)
        ));
        // Two identity URIs.
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = vec![
            rcgen::SanType::URI("pangea://replica/a?region=b".try_into()?),
            rcgen::SanType::URI("pangea://client/c?app_profile=d".try_into()?),
        ];
        let two = params.self_signed(&key)?;
        assert!(matches!(
            PeerIdentity::from_certificate(two.der()),
            Err(Error::AmbiguousIdentity { count: 2 })
        ));
        // Not a certificate.
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x01, 0x02]);
        assert!(matches!(
            PeerIdentity::from_certificate(&junk),
            Err(Error::CertificateParse(_))
        ));
        Ok(())
    }
}
