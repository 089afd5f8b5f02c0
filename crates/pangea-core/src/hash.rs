//! A fast hasher for maps whose keys this process chose itself: indexes it
//! assigned, addresses, timestamps.
//!
//! Multiply-rotate hashing, eight bytes at a step (as `FxHash` does), with the high
//! half folded onto the low one, where the table takes its bucket from. Its key is
//! fixed, so keys can be found offline that collide: std's SipHash, with a random
//! key, resists that and stays for every map a key of which a peer, a client or a
//! file could have chosen — names included, even those relayed.
//! SipHash was about 9 % of the simulator's instructions in the link encoder's
//! maps.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` hashed with [`WordHasher`]: only for keys no peer, client or file chose.
pub type WordMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

/// See the module's documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct WordHasher(u64);

impl WordHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            // The last byte, which the 1–7 left never reach, holds their number:
            // "a" and "a\0" are different words.
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            word[7] = rest.len() as u8;
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher as _, BuildHasherDefault};

    /// Names that differ only past the first eight bytes, or in length, hash apart;
    /// integer pairs that differ in one place do too.
    #[test]
    fn keys_that_differ_hash_apart() {
        let h = BuildHasherDefault::<WordHasher>::default();
        let names = ["use1-a", "use1-b", "us-east-1a", "us-east-1b", "use1-a\0"];
        let hashes: std::collections::BTreeSet<u64> = names.iter().map(|n| h.hash_one(n)).collect();
        assert_eq!(hashes.len(), names.len());
        let pairs: std::collections::BTreeSet<u64> = (0..64u32)
            .flat_map(|a| (0..64u32).map(move |b| (a, b)))
            .map(|p| h.hash_one(p))
            .collect();
        assert_eq!(pairs.len(), 64 * 64);
    }
}
