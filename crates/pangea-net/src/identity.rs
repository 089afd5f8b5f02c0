//! Who is on the other end of a connection, read from its certificate.
//!
//! The TLS handshake proved the peer holds a key certified by the cluster CA; this
//! module turns that certificate into a [`PeerIdentity`] by parsing the one
//! `pangea://` URI in its subject alternative names (the format is written by
//! [`crate::certs`]). Nothing else in the certificate (common name, DNS names) is
//! identity: the DNS names exist only for TLS server-name checks.
//!
//! The parser is strict — exactly one identity URI, exactly the forms we issue,
//! names that pass [`crate::certs::validate_name`] — because a lenient parser is
//! where two components start disagreeing about who a peer is.

use std::fmt;

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

use crate::certs::{IDENTITY_SCHEME, validate_name};
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
}

impl PeerIdentity {
    /// Parses an identity URI of one of the two forms above.
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
            .ok_or_else(|| malformed("expected pangea://<kind>/<name>?<key>=<value>"))?;
        let (name, query) = rest
            .split_once('?')
            .ok_or_else(|| malformed("missing ?<key>=<value>"))?;
        let (key, value) = query
            .split_once('=')
            .ok_or_else(|| malformed("query is not <key>=<value>"))?;
        let expected_key = match kind {
            "replica" => "region",
            "client" => "app_profile",
            _ => return Err(malformed("kind is neither replica nor client")),
        };
        if key != expected_key {
            return Err(malformed(&format!(
                "a {kind} identity takes ?{expected_key}=, not ?{key}="
            )));
        }
        // validate_name rejects '/', '?', '=' and '&', so a valid name and value
        // cannot hide extra path segments or query parameters.
        let check = |what, s: &str| validate_name(what, s).map_err(|e| malformed(&e.to_string()));
        Ok(match kind {
            "replica" => {
                check("replica id", name)?;
                check("region", value)?;
                Self::Replica {
                    id: name.to_owned(),
                    region: value.to_owned(),
                }
            }
            _ => {
                check("client name", name)?;
                check("app profile", value)?;
                Self::Client {
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

    /// The replica id, if the peer is a replica.
    pub fn replica_id(&self) -> Option<&str> {
        match self {
            Self::Replica { id, .. } => Some(id),
            Self::Client { .. } => None,
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
        }
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
        certs::init_ca(dir.path())?;
        certs::issue_replica(dir.path(), "eu-west1-b", "eu-west1")?;
        certs::issue_replica(dir.path(), "r_7", "asia")?;
        certs::issue_client(dir.path(), "frontend-1", "serving")?;

        let replica = certs::load_replica(dir.path(), "eu-west1-b")?;
        assert_eq!(
            PeerIdentity::from_certificate(&replica.chain[0])?,
            PeerIdentity::Replica {
                id: "eu-west1-b".into(),
                region: "eu-west1".into()
            }
        );
        let odd = certs::load_replica(dir.path(), "r_7")?;
        assert_eq!(
            PeerIdentity::from_certificate(&odd.chain[0])?.replica_id(),
            Some("r_7")
        );
        let client = certs::load_client(dir.path(), "frontend-1")?;
        assert_eq!(
            PeerIdentity::from_certificate(&client.chain[0])?,
            PeerIdentity::Client {
                name: "frontend-1".into(),
                app_profile: "serving".into()
            }
        );
        Ok(())
    }

    #[test]
    fn uri_round_trip() -> Result<()> {
        for id in [
            PeerIdentity::Replica {
                id: "a".into(),
                region: "b".into(),
            },
            PeerIdentity::Client {
                name: "c.d".into(),
                app_profile: "e_f".into(),
            },
        ] {
            assert_eq!(PeerIdentity::from_uri(&id.to_uri())?, id);
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
            "pangea://client/a?app_profile=b c",
        ] {
            let err = PeerIdentity::from_uri(bad).err();
            assert!(
                matches!(err, Some(Error::MalformedIdentity { .. })),
                "{bad:?} gave {err:?}"
            );
        }
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
