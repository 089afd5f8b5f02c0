//! Why a handshake failed, in words an operator can act on.
//!
//! A TLS failure ends a QUIC connection with a CRYPTO_ERROR whose code is 0x100
//! plus the TLS alert (RFC 9001, §4.8). Without reading it, a client sees only "the
//! connection was lost" — worse, with TLS 1.3 a client without a certificate
//! finishes its side of the handshake before the replica checks it, so its first
//! read fails short ("0 bytes read on a total of 4 expected bytes"). [`Refusal`]
//! names the alert; a replica counts refusals by [`Refusal::reason`], and the
//! client library reports them with the side that refused.

use quinn::ConnectionError;

/// A handshake refused by TLS, by its alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client presented no certificate (`certificate_required`, 116).
    NoCertificate,
    /// The certificate chains to no trusted CA (`unknown_ca`, 48), or names a
    /// trusted CA whose signature it does not carry (`decrypt_error`, 51: rustls's
    /// `BadSignature`) — which is what another cluster's certificate gives, since
    /// every cluster's CA has the same name.
    UnknownCa,
    /// The certificate is expired or not yet valid (`certificate_expired`, 45).
    Expired,
    /// The certificate is revoked (`certificate_revoked`, 44).
    Revoked,
    /// The certificate is unusable otherwise: wrong name, wrong key usage
    /// (`bad_certificate` 42, `unsupported_certificate` 43, `certificate_unknown`
    /// 46).
    BadCertificate,
    /// The peers share no application protocol: the ALPN offered was not
    /// `pangea/1`, or none was (`no_application_protocol`, 120).
    WrongAlpn,
    /// Another TLS alert.
    Other(u8),
}

/// Which side refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// The other end sent the alert.
    Peer,
    /// This end did (our verification of the peer's certificate failed).
    Us,
}

impl Refusal {
    /// The refusal a TLS alert stands for.
    pub fn from_alert(alert: u8) -> Refusal {
        match alert {
            116 => Refusal::NoCertificate,
            48 | 51 => Refusal::UnknownCa,
            45 => Refusal::Expired,
            44 => Refusal::Revoked,
            42 | 43 | 46 => Refusal::BadCertificate,
            120 => Refusal::WrongAlpn,
            a => Refusal::Other(a),
        }
    }

    /// The refusal a connection ended with, and who refused; `None` if it ended
    /// otherwise.
    pub fn of(e: &ConnectionError) -> Option<(Refusal, By)> {
        let (code, by) = match e {
            ConnectionError::ConnectionClosed(c) => (u64::from(c.error_code), By::Peer),
            ConnectionError::TransportError(t) => (u64::from(t.code), By::Us),
            _ => return None,
        };
        let alert = code.checked_sub(0x100).filter(|a| *a <= 0xff)?;
        Some((Refusal::from_alert(alert as u8), by))
    }

    /// A short stable name (a metric label).
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NoCertificate => "no_certificate",
            Refusal::UnknownCa => "unknown_ca",
            Refusal::Expired => "expired",
            Refusal::Revoked => "revoked",
            Refusal::BadCertificate => "bad_certificate",
            Refusal::WrongAlpn => "wrong_alpn",
            Refusal::Other(_) => "other",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::NoCertificate => "no client certificate was presented",
            Refusal::UnknownCa => "the certificate is not issued by a CA the other side trusts",
            Refusal::Expired => "the certificate is expired or not yet valid",
            Refusal::Revoked => "the certificate is revoked",
            Refusal::BadCertificate => "the certificate is not acceptable",
            Refusal::WrongAlpn => "the application protocol (ALPN) is not pangea/1",
            Refusal::Other(_) => "the handshake failed",
        })?;
        match self {
            Refusal::Other(a) => write!(f, " (TLS alert {a})"),
            _ => Ok(()),
        }
    }
}

/// A client's account of a connection to `peer` that ended with `e`: the
/// refusal, who refused and what to do, when the handshake was refused; else `e`
/// as it is.
pub fn describe(peer: &str, e: &ConnectionError) -> String {
    match Refusal::of(e) {
        Some((r, By::Peer)) => format!("{peer} refused the TLS handshake: {r}; {}", r.remedy()),
        Some((r, By::Us)) => format!("{peer}'s certificate was refused here: {r} ({e})"),
        None => format!("{peer}: {e}"),
    }
}

impl Refusal {
    /// What a client that was refused does about it.
    fn remedy(self) -> &'static str {
        match self {
            Refusal::NoCertificate => {
                "present a client certificate of this cluster (certs/clients/<name>.pem and .key)"
            }
            Refusal::UnknownCa => {
                "use a certificate issued by this cluster's CA (`pangea certs issue`), not another cluster's"
            }
            Refusal::Expired => "re-issue it (`pangea certs reissue`), or check this host's clock",
            Refusal::Revoked => "this identity is revoked; use another certificate",
            Refusal::BadCertificate => {
                "check that it is a client certificate with its pangea:// identity"
            }
            Refusal::WrongAlpn => "offer the ALPN pangea/1 (docs/protocol.md, section 1)",
            Refusal::Other(_) => "see the replica's log",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::TransportErrorCode;

    fn closed_by_peer(alert: u8) -> ConnectionError {
        ConnectionError::ConnectionClosed(quinn::ConnectionClose {
            error_code: TransportErrorCode::crypto(alert),
            frame_type: None,
            reason: Default::default(),
        })
    }

    #[test]
    fn alerts_are_named_and_who_refused_is_kept() {
        for (alert, want, reason) in [
            (116, Refusal::NoCertificate, "no_certificate"),
            (48, Refusal::UnknownCa, "unknown_ca"),
            (51, Refusal::UnknownCa, "unknown_ca"),
            (45, Refusal::Expired, "expired"),
            (44, Refusal::Revoked, "revoked"),
            (42, Refusal::BadCertificate, "bad_certificate"),
            (120, Refusal::WrongAlpn, "wrong_alpn"),
            (80, Refusal::Other(80), "other"),
        ] {
            let e = closed_by_peer(alert);
            assert_eq!(Refusal::of(&e), Some((want, By::Peer)));
            assert_eq!(want.reason(), reason);
            assert!(describe("replica r", &e).starts_with("replica r refused the TLS handshake"));
        }
        let local = ConnectionError::TransportError(quinn_proto::TransportError {
            code: TransportErrorCode::crypto(48),
            frame: None,
            reason: "invalid peer certificate: UnknownIssuer".into(),
        });
        assert_eq!(Refusal::of(&local), Some((Refusal::UnknownCa, By::Us)));
        assert!(describe("replica r", &local).contains("UnknownIssuer"));
        // Not a TLS failure.
        let protocol_violation = ConnectionError::ConnectionClosed(quinn::ConnectionClose {
            error_code: TransportErrorCode::PROTOCOL_VIOLATION,
            frame_type: None,
            reason: Default::default(),
        });
        assert_eq!(Refusal::of(&protocol_violation), None);
        assert_eq!(Refusal::of(&ConnectionError::TimedOut), None);
        assert_eq!(
            describe("replica r", &ConnectionError::TimedOut),
            "replica r: timed out"
        );
    }
}
