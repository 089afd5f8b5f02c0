//! A small map keyed by replica id, in id order, that finds an id it holds by the
//! address of its bytes.
//!
//! A replica looks its streams up by origin once or more per entry and heartbeat.
//! The ids it is handed are mostly clones of the ones it keys by (one `Arc` per
//! name in a simulated run, and the deployment's own ids in a node wherever a
//! frame's names were resolved against it), so one probe of a small table of
//! addresses finds the entry without comparing ids; any other id takes a binary
//! search, which compares exactly as a `BTreeMap` would. The entries are a vector
//! sorted by id, so iteration goes in id order, as the `BTreeMap` it replaced did.
//! Inserting is O(n) (the vector shifts and the table is rebuilt): maps hold tens
//! of ids and gain one when a stream is first seen.

use crate::ReplicaId;
use std::collections::BTreeSet;

/// Empty slot of [`IdMap::by_addr`].
const EMPTY: u16 = u16::MAX;

#[derive(Debug, Clone)]
pub(crate) struct IdMap<V> {
    /// Sorted by id, no two equal.
    entries: Vec<(ReplicaId, V)>,
    /// Open addressing by the address of an id's bytes (linear probing): the
    /// position in `entries` of the id stored there. At most a quarter full.
    by_addr: Vec<u16>,
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap {
            entries: Vec::new(),
            by_addr: Vec::new(),
        }
    }
}

/// The address an id is found by.
fn addr(id: &ReplicaId) -> usize {
    id.as_str().as_ptr() as usize
}

impl<V> IdMap<V> {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry's position in id order (else where it would go), by address first.
    pub(crate) fn position(&self, id: &ReplicaId) -> Result<usize, usize> {
        let a = addr(id);
        let mask = self.by_addr.len().wrapping_sub(1);
        if !self.by_addr.is_empty() {
            let mut slot = slot_of(a, mask);
            loop {
                let i = self.by_addr[slot];
                if i == EMPTY {
                    break;
                }
                if addr(&self.entries[i as usize].0) == a {
                    // The same bytes (the map's clone keeps them alive): the same id.
                    debug_assert!(self.entries[i as usize].0 == *id);
                    return Ok(i as usize);
                }
                slot = (slot + 1) & mask;
            }
        }
        self.entries.binary_search_by(|(k, _)| k.cmp(id))
    }

    pub(crate) fn get(&self, id: &ReplicaId) -> Option<&V> {
        self.position(id).ok().map(|i| &self.entries[i].1)
    }

    pub(crate) fn get_mut(&mut self, id: &ReplicaId) -> Option<&mut V> {
        self.position(id).ok().map(|i| &mut self.entries[i].1)
    }

    /// Sets `id`'s value (the id is copied only if absent).
    pub(crate) fn insert(&mut self, id: &ReplicaId, value: V) {
        match self.position(id) {
            Ok(i) => self.entries[i].1 = value,
            Err(i) => {
                self.entries.insert(i, (id.clone(), value));
                self.reindex();
            }
        }
    }

    /// `id`'s value, a default one inserted if absent (the id is copied only then).
    pub(crate) fn get_or_default(&mut self, id: &ReplicaId) -> &mut V
    where
        V: Default,
    {
        let i = match self.position(id) {
            Ok(i) => i,
            Err(i) => {
                self.entries.insert(i, (id.clone(), V::default()));
                self.reindex();
                i
            }
        };
        &mut self.entries[i].1
    }

    /// In id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ReplicaId, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The entry at position `i` in id order, the value mutable.
    pub(crate) fn at_mut(&mut self, i: usize) -> (&ReplicaId, &mut V) {
        let (id, v) = &mut self.entries[i];
        (id, v)
    }

    /// Keeps the entries `keep` says to.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&ReplicaId) -> bool) {
        self.entries.retain(|(id, _)| keep(id));
        self.reindex();
    }

    /// In id order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// Rebuilds the address table after the entries moved.
    fn reindex(&mut self) {
        let n = self.entries.len();
        if n >= EMPTY as usize {
            self.by_addr = Vec::new(); // binary search only
            return;
        }
        let slots = (n * 4).next_power_of_two().max(16);
        self.by_addr.clear();
        self.by_addr.resize(slots, EMPTY);
        let mask = slots - 1;
        for (i, (id, _)) in self.entries.iter().enumerate() {
            let mut slot = slot_of(addr(id), mask);
            while self.by_addr[slot] != EMPTY {
                slot = (slot + 1) & mask;
            }
            self.by_addr[slot] = i as u16;
        }
    }
}

/// The first slot probed for `addr` (Fibonacci hashing; allocations are aligned,
/// so the low bits say little).
fn slot_of(addr: usize, mask: usize) -> usize {
    ((addr as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & mask
}

/// A set of replica ids (a scope's members, its origins), in id order: an
/// [`IdMap`] without values, so that `contains`, asked for every entry and
/// heartbeat received, finds the ids it holds by address.
#[derive(Debug, Clone, Default)]
pub(crate) struct Roster(IdMap<()>);

impl Roster {
    pub(crate) fn contains(&self, id: &ReplicaId) -> bool {
        self.0.get(id).is_some()
    }

    /// `id`'s position in id order, if it is here.
    pub(crate) fn position(&self, id: &ReplicaId) -> Option<usize> {
        self.0.position(id).ok()
    }

    /// In id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &ReplicaId> {
        self.0.entries.iter().map(|(id, ())| id)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.entries.is_empty()
    }
}

impl From<BTreeSet<ReplicaId>> for Roster {
    fn from(set: BTreeSet<ReplicaId>) -> Roster {
        let mut index = IdMap {
            entries: set.into_iter().map(|id| (id, ())).collect(),
            by_addr: Vec::new(),
        };
        index.reindex();
        Roster(index)
    }
}

impl<'a> IntoIterator for &'a Roster {
    type Item = &'a ReplicaId;
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (ReplicaId, ())>,
        fn(&'a (ReplicaId, ())) -> &'a ReplicaId,
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.entries.iter().map(|(id, ())| id)
    }
}

impl<'a, V> IntoIterator for &'a IdMap<V> {
    type Item = (&'a ReplicaId, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (ReplicaId, V)>,
        fn(&'a (ReplicaId, V)) -> (&'a ReplicaId, &'a V),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Any mix of inserts and lookups, by the map's own ids or by fresh copies
        /// of the names, answers as a `BTreeMap` does, and iterates in its order.
        #[test]
        fn answers_as_a_btree_map(
            ops in prop::collection::vec((0u8..4, 0u16..300, any::<bool>(), 0u32..1000), 0..400),
        ) {
            // One `Arc` per name, as a run's ids are; `fresh` makes a new one.
            let names: Vec<ReplicaId> =
                (0..300u16).map(|n| ReplicaId::new(format!("r{n:03}"))).collect();
            let mut map = IdMap::default();
            let mut oracle: BTreeMap<ReplicaId, u32> = BTreeMap::new();
            for (op, n, fresh, v) in ops {
                let id = if fresh {
                    ReplicaId::new(names[n as usize].as_str())
                } else {
                    names[n as usize].clone()
                };
                match op {
                    0 => {
                        map.insert(&id, v);
                        oracle.insert(id, v);
                    }
                    1 => {
                        *map.get_or_default(&id) += v;
                        *oracle.entry(id).or_default() += v;
                    }
                    2 => {
                        prop_assert_eq!(map.get(&id), oracle.get(&id));
                    }
                    _ => {
                        if let (Some(a), Some(b)) = (map.get_mut(&id), oracle.get_mut(&id)) {
                            *a += 1;
                            *b += 1;
                        }
                    }
                }
                prop_assert_eq!(map.entries.len(), oracle.len());
            }
            let got: Vec<_> = map.iter().collect();
            let want: Vec<_> = oracle.iter().collect();
            prop_assert_eq!(got, want);
            prop_assert!(map.values().eq(oracle.values()));
            // The same ids as a roster: `contains` as the set's, by either copy.
            let set: BTreeSet<ReplicaId> = oracle.keys().cloned().collect();
            let roster = Roster::from(set.clone());
            prop_assert!(roster.iter().eq(&set));
            prop_assert_eq!(roster.len(), set.len());
            for (n, name) in names.iter().enumerate().step_by(7) {
                let copy = ReplicaId::new(name.as_str());
                prop_assert_eq!(roster.contains(name), set.contains(name), "{}", n);
                prop_assert_eq!(roster.contains(&copy), set.contains(name));
                prop_assert_eq!(roster.position(&copy), set.iter().position(|m| m == name));
            }
        }
    }

    #[test]
    fn finds_its_own_ids_by_address_and_others_by_name() {
        let ids: Vec<ReplicaId> = (0..40).map(|n| ReplicaId::new(format!("id{n}"))).collect();
        let mut map = IdMap::default();
        for (n, id) in ids.iter().enumerate().rev() {
            *map.get_or_default(id) = n;
        }
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(map.get(id), Some(&n));
            assert_eq!(map.get(&ReplicaId::new(id.as_str())), Some(&n));
        }
        assert_eq!(map.get(&ReplicaId::new("absent")), None);
        // A quarter full at most: every own id is in the table.
        assert!(map.by_addr.len() >= 4 * ids.len());
        let hits = ids
            .iter()
            .filter(|id| {
                map.by_addr
                    .iter()
                    .any(|&i| i != EMPTY && addr(&map.entries[i as usize].0) == addr(id))
            })
            .count();
        assert_eq!(hits, ids.len());
    }
}
