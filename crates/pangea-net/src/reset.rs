//! Stateless-reset keys that survive a restart.
//!
//! When a replica process dies, its clients' and peers' QUIC connections to it do
//! not know: they keep sending into the void until their idle timeout (10 s) and
//! every request on them waits out its own deadline first. QUIC's answer is the
//! stateless reset (RFC 9000 §10.3): an endpoint that receives a packet for a
//! connection it does not know replies with a token only the connection's original
//! endpoint could compute, and the sender closes the connection at once. The token
//! is an HMAC of the connection id under the endpoint's reset key, so the restarted
//! process can compute it only if it has the same key as before — quinn's default
//! is a fresh random key per endpoint, which is why a restarted replica stayed
//! silent. Each replica therefore keeps its key in its data directory
//! ([`ResetKey::load_or_create`]), and after a restart stale connections are reset
//! on their first packet instead of timing out.
//!
//! The key is a secret (whoever knows it can forge resets for our connections): it
//! is created with mode 0600 and never leaves the replica.

use std::path::Path;
use std::sync::Arc;

use ring::hmac;
use ring::rand::{SecureRandom as _, SystemRandom};

use crate::certs::{rename, write_temp};
use crate::error::{Error, Result};

/// Bytes of key material in a reset-key file.
pub const RESET_KEY_BYTES: usize = 32;

/// An HMAC-SHA256 key for stateless-reset tokens.
#[derive(Clone)]
pub struct ResetKey {
    material: [u8; RESET_KEY_BYTES],
}

impl std::fmt::Debug for ResetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResetKey(..)")
    }
}

impl ResetKey {
    /// A fresh random key (not persisted).
    pub fn random() -> Result<ResetKey> {
        let mut material = [0u8; RESET_KEY_BYTES];
        SystemRandom::new()
            .fill(&mut material)
            .map_err(|_| Error::Tls(rustls::Error::FailedToGetRandomBytes))?;
        Ok(ResetKey { material })
    }

    /// Reads the key at `path`, or creates it there (atomically, mode 0600) if there
    /// is none yet. A file of the wrong size is an error naming the file: it is not
    /// silently replaced, since that would stop resets for connections made before.
    pub fn load_or_create(path: &Path) -> Result<ResetKey> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let material = <[u8; RESET_KEY_BYTES]>::try_from(bytes.as_slice()).map_err(|_| {
                    Error::KeyFile {
                        path: path.to_owned(),
                        reason: format!(
                            "a stateless-reset key must be {RESET_KEY_BYTES} bytes, this file has {}",
                            bytes.len()
                        ),
                    }
                })?;
                Ok(ResetKey { material })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = ResetKey::random()?;
                let tmp = write_temp(path, &key.material, true)?;
                rename(&tmp, path)?;
                Ok(key)
            }
            Err(source) => Err(Error::File {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// quinn's endpoint configuration with this reset key, and connection ids
    /// checked under a key derived from it.
    ///
    /// Both must outlive the process: quinn drops a short-header packet whose
    /// connection id fails its generator's check (the default generator draws its
    /// key at random) before it would consider a reset, so a restarted endpoint
    /// with only the old reset key would still stay silent.
    pub(crate) fn endpoint_config(&self) -> quinn::EndpointConfig {
        let reset = hmac::Key::new(hmac::HMAC_SHA256, &self.material);
        let tag = hmac::sign(&reset, b"pangea connection-id key");
        let mut cid_key = [0u8; 8];
        cid_key.copy_from_slice(&tag.as_ref()[..8]);
        let cid_key = u64::from_le_bytes(cid_key);
        let mut config = quinn::EndpointConfig::new(Arc::new(reset));
        config.cid_generator(move || {
            Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
                as Box<dyn quinn::ConnectionIdGenerator>
        });
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_key_is_read_back_unchanged() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })?;
        let path = dir.path().join("quic-reset.key");
        let first = ResetKey::load_or_create(&path)?;
        let again = ResetKey::load_or_create(&path)?;
        assert_eq!(first.material, again.material);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).map(|m| m.permissions().mode());
            assert_eq!(mode.ok().map(|m| m & 0o777), Some(0o600));
        }
        Ok(())
    }

    #[test]
    fn a_truncated_key_file_is_refused_by_name() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|source| Error::File {
            path: "tempdir".into(),
            source,
        })?;
        let path = dir.path().join("quic-reset.key");
        std::fs::write(&path, [7u8; 5]).map_err(|source| Error::File {
            path: path.clone(),
            source,
        })?;
        let err = ResetKey::load_or_create(&path).err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(err.contains("quic-reset.key"), "{err}");
        assert!(err.contains("this file has 5"), "{err}");
        Ok(())
    }
}
