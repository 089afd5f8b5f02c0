//! How user keys appear in logs, traces and error messages: never as bytes. A row key
//! (or scan prefix) is shown as its length and a 64-bit xxh3 hash, the same in the
//! client's spans, the replica's spans and its log lines, so one key's requests can
//! be followed across processes, and an operator who knows a key can compute its hash
//! (`xxh3_64(key)`, seed 0; test vector below) to find them. Values never appear at all.
//!
//! A hash is a pseudonym, not encryption: whoever holds a trace can test guesses of
//! a short, guessable key against it. That is why keys are hashed and values left out,
//! and why traces stay inside the operator's own collector.

use std::fmt;

/// The hash a key is shown as: xxh3-64, seed 0, of the key bytes.
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// A key for a log line or an error message: `key#<16 hex digits>/<length>B`.
#[derive(Clone, Copy)]
pub struct RedactedKey<'a>(pub &'a [u8]);

impl fmt::Display for RedactedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key#{:016x}/{}B", key_hash(self.0), self.0.len())
    }
}

impl fmt::Debug for RedactedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// [`key_hash`] as trace attributes show it (`key.hash`): 16 lowercase hex digits.
#[derive(Clone, Copy)]
pub struct KeyHash(pub u64);

impl KeyHash {
    pub fn of(key: &[u8]) -> Self {
        KeyHash(key_hash(key))
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_vectors() {
        // xxh3-64 of the empty input is a published constant.
        assert_eq!(key_hash(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(KeyHash::of(b"").to_string(), "2d06800538d394c2");
        let shown = RedactedKey(b"user:42").to_string();
        assert!(
            shown.starts_with("key#") && shown.ends_with("/7B"),
            "{shown}"
        );
        assert!(!shown.contains("user"), "{shown}");
        assert_eq!(shown.len(), "key#".len() + 16 + "/7B".len());
    }
}
