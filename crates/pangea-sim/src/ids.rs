//! Dense indices for names (replicas, regions, scopes).
//!
//! The hot path maps names the core hands back (`ReplicaId`, `ScopeId`, both
//! `Arc<str>` inside) to dense indices many times per event; a `BTreeMap` of strings
//! costs a handful of string comparisons per lookup, this costs one xxh3 of a short
//! string. The hash map is only ever looked up, never iterated, so its order cannot
//! reach any output (STYLE: determinism where order shows).
//!
//! Cheaper still: the ids the core hands back are nearly always clones of the ones
//! the deployment holds. Those are pinned ([`Interner::pin`]): the interner keeps a
//! clone, so their bytes stay where they are, and finds them by the address of their
//! bytes, without hashing or comparing a string. Any other string still takes the
//! hash path, so the answer is the same either way.

use pangea_topology::{RegionId, ReplicaId, ScopeId};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

/// A name whose bytes are shared and stay put while a clone lives.
pub(crate) trait SharedName: std::fmt::Debug + Send + Sync + 'static {
    fn name(&self) -> &str;
}

impl SharedName for ReplicaId {
    fn name(&self) -> &str {
        self.as_str()
    }
}

impl SharedName for ScopeId {
    fn name(&self) -> &str {
        self.as_str()
    }
}

impl SharedName for RegionId {
    fn name(&self) -> &str {
        self.as_str()
    }
}

/// Hashes an address: one multiplication (Fibonacci hashing), whose high bits are
/// folded onto the low ones. `hashbrown` picks the bucket from the low bits, and
/// those of a product depend only on the low bits of the address, which alignment
/// keeps zero: unfolded, pinned names crowd into a few buckets.
#[derive(Debug, Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Names in a fixed order (their index) and the way back.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    names: Vec<Box<str>>,
    index: HashMap<Box<str>, u32, Xxh3DefaultBuilder>,
    /// Address of a pinned name's bytes → (its length, its index).
    by_addr: HashMap<usize, (usize, u32), BuildHasherDefault<AddrHasher>>,
    /// Clones of the pinned names, which keep their bytes where `by_addr` says.
    pinned: Vec<Box<dyn SharedName>>,
}

impl Interner {
    /// Interns `names` in the order given (callers pass sorted ids, so indices follow
    /// id order as the network's do).
    pub(crate) fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Interner {
        let mut i = Interner::default();
        for n in names {
            i.intern(n);
        }
        i
    }

    /// The index of `name`, adding it at the end if new.
    pub(crate) fn intern(&mut self, name: &str) -> usize {
        if let Some(&i) = self.index.get(name) {
            return i as usize;
        }
        let i = self.names.len();
        self.names.push(name.into());
        // Fewer than 2^32 names: the simulator has tens of each.
        self.index.insert(name.into(), i as u32);
        i
    }

    /// Lets lookups of `id`'s clones skip hashing (see the module documentation).
    /// Ids not interned are ignored.
    pub(crate) fn pin<N: SharedName + Clone>(&mut self, id: &N) {
        let name = id.name();
        let addr = name.as_ptr() as usize;
        if self.by_addr.contains_key(&addr) {
            return;
        }
        if let Some(&i) = self.index.get(name) {
            self.by_addr.insert(addr, (name.len(), i));
            self.pinned.push(Box::new(id.clone()));
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<usize> {
        if let Some(&(len, i)) = self.by_addr.get(&(name.as_ptr() as usize))
            && len == name.len()
        {
            return Some(i as usize);
        }
        self.index.get(name).map(|&i| i as usize)
    }

    pub(crate) fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interns_in_order_and_finds_back() {
        let mut i = Interner::new(["b", "a"]);
        assert_eq!(i.get("b"), Some(0));
        assert_eq!(i.get("a"), Some(1));
        assert_eq!(i.intern("c"), 2);
        assert_eq!(i.intern("a"), 1);
        assert_eq!(i.name(2), "c");
        assert_eq!(i.len(), 3);
        assert_eq!(i.get("zz"), None);
    }

    #[test]
    fn pinned_ids_are_found_by_address_and_others_by_name() {
        let mut i = Interner::new(["eu-west-1a", "eu-west-1b"]);
        let a = ReplicaId::from("eu-west-1a");
        i.pin(&a);
        i.pin(&ReplicaId::from("mars-1a")); // not interned: ignored
        assert_eq!(i.get(a.clone().as_str()), Some(0));
        // A prefix of a pinned name shares its address, not its length.
        assert_eq!(i.get(&a.as_str()[..3]), None);
        assert_eq!(i.get(ReplicaId::from("eu-west-1b").as_str()), Some(1));
        assert_eq!(i.get(ReplicaId::from("eu-west-1a").as_str()), Some(0));
        assert_eq!(i.get("mars-1a"), None);
    }
}
