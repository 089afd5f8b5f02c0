//! Dense indices for names (replicas, regions, scopes).
//!
//! The hot path maps names the core hands back (`ReplicaId`, `ScopeId`, both
//! `Arc<str>` inside) to dense indices many times per event; a `BTreeMap` of strings
//! costs a handful of string comparisons per lookup, this costs one xxh3 of a short
//! string. The hash map is only ever looked up, never iterated, so its order cannot
//! reach any output (STYLE: determinism where order shows).

use std::collections::HashMap;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

/// Names in a fixed order (their index) and the way back.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interner {
    names: Vec<Box<str>>,
    index: HashMap<Box<str>, u32, Xxh3DefaultBuilder>,
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

    pub(crate) fn get(&self, name: &str) -> Option<usize> {
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
}
