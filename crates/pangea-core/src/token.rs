//! Consistency tokens: what a write returns so that a later read can demand to see it.
//!
//! To users a token is opaque bytes. Inside: a version byte, then a `pangea.v1.TokenV1`
//! protobuf naming (scope, origin, sequence, timestamp). A replica covers the token
//! when its watermark for (scope, origin) has reached `sequence`: a sequence
//! comparison, so clock skew cannot make a stale replica look fresh (I3).

use crate::Error;
use crate::hlc::Timestamp;
use crate::ids::{ReplicaId, ScopeId};
use crate::limits::{Limited, Limits};
use bytes::{BufMut, Bytes, BytesMut};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::schema::{validate_name, validate_scope};

/// The first byte of every token this version writes.
pub const TOKEN_FORMAT_V1: u8 = 1;
/// Longest token accepted, in bytes: two names of at most 128 bytes plus numbers.
pub const TOKEN_BYTES_MAX: usize = 512;

/// Names one write: the `sequence`-th write of `origin` in `scope`, at `timestamp`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Token {
    pub scope: ScopeId,
    pub origin: ReplicaId,
    pub sequence: u64,
    pub timestamp: Timestamp,
}

impl Token {
    pub fn encode(&self) -> Bytes {
        let body = pb::TokenV1 {
            scope: self.scope.to_string(),
            origin: self.origin.to_string(),
            sequence: self.sequence,
            timestamp: self.timestamp.as_u64(),
        };
        let mut buf = BytesMut::with_capacity(1 + body.encoded_len());
        buf.put_u8(TOKEN_FORMAT_V1);
        body.encode(&mut buf).expect("BytesMut grows as needed");
        buf.freeze()
    }

    /// Parses a token a client sent back. Never panics on any input.
    pub fn decode(bytes: &[u8]) -> Result<Token, Error> {
        Limits::check(Limited::Token, bytes.len(), TOKEN_BYTES_MAX)?;
        let (&format, body) = bytes
            .split_first()
            .ok_or_else(|| Error::malformed("token", "empty"))?;
        if format != TOKEN_FORMAT_V1 {
            return Err(Error::malformed(
                "token",
                format!("unknown format version {format}"),
            ));
        }
        let t = pb::TokenV1::decode(body).map_err(|e| Error::decode("token", e))?;
        validate_scope(&t.scope)?;
        validate_name("replica", &t.origin)?;
        if t.sequence == 0 {
            return Err(Error::malformed("token", "sequence 0 names no write"));
        }
        Ok(Token {
            scope: t.scope.as_str().into(),
            origin: t.origin.as_str().into(),
            sequence: t.sequence,
            timestamp: Timestamp::from_u64(t.timestamp),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let t = Token {
            scope: ScopeId::global(),
            origin: "eu-west-1a".into(),
            sequence: 42,
            timestamp: Timestamp::new(1_700_000_000_000, 3),
        };
        assert_eq!(Token::decode(&t.encode()).unwrap(), t);
        // A token names its shard group through its scope.
        let grouped = Token {
            scope: "eu-resident/17".into(),
            ..t.clone()
        };
        let back = Token::decode(&grouped.encode()).unwrap();
        assert_eq!(back, grouped);
        assert_eq!(back.scope.policy(), "eu-resident");
        assert_eq!(back.scope.group().map(|g| g.0), Some(17));
        let bad = Token {
            scope: "eu-resident/017".into(),
            ..t
        };
        let e = Token::decode(&bad.encode()).unwrap_err().to_string();
        assert!(e.contains("eu-resident/017"), "{e}");
    }

    #[test]
    fn refuses_bad_tokens_with_reasons() {
        assert!(matches!(Token::decode(&[]), Err(Error::Malformed { .. })));
        assert!(matches!(
            Token::decode(&[9, 1, 2]),
            Err(Error::Malformed { .. })
        ));
        assert!(matches!(
            Token::decode(&[1, 0xff, 0xff]),
            Err(Error::Decode { .. })
        ));
        assert_eq!(
            Token::decode(&[1; 600]),
            Err(Error::TooLarge {
                what: Limited::Token,
                size: 600,
                limit: TOKEN_BYTES_MAX
            })
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = Token::decode(&bytes);
        }
    }
}
