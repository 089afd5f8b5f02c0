//! Consistency tokens: the opaque bytes a client sends back with a watermark read.
//!
//! `Token::decode` must refuse any input with an error, never panic; a token it
//! accepts re-encodes within the size limit and parses back to itself, and the read
//! decision on it (`read::decide`) is total.

use pangea_core::read::{Consistency, decide};
use pangea_core::storage::Watermark;
use pangea_core::token::TOKEN_BYTES_MAX;
use pangea_core::{ScopeWatermarks, Timestamp, Token};

pub fn token(data: &[u8]) {
    let Ok(t) = Token::decode(data) else {
        return;
    };
    let encoded = t.encode();
    assert!(
        encoded.len() <= TOKEN_BYTES_MAX,
        "a token we accept re-encodes to {} bytes",
        encoded.len()
    );
    assert_eq!(Token::decode(&encoded).as_ref(), Ok(&t), "token round trip");
    // A replica just short of the token, and one that has it.
    let mut wm = ScopeWatermarks::new(t.scope.clone());
    wm.insert(
        t.origin.clone(),
        Watermark {
            sequence: t.sequence - 1,
            timestamp: Timestamp::from_u64(t.timestamp.as_u64().saturating_sub(1)),
        },
    );
    assert!(!wm.covers(&t));
    let _ = decide(
        &Consistency::Watermark(t.clone()),
        &wm,
        t.timestamp.wall_ms(),
    );
    wm.insert(
        t.origin.clone(),
        Watermark {
            sequence: t.sequence,
            timestamp: t.timestamp,
        },
    );
    assert!(wm.covers(&t));
}
