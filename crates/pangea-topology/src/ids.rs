//! Identifiers shared by every crate: replicas, regions and replication scopes.

use std::fmt;
use std::sync::Arc;

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name {
            /// The first 8 bytes, big-endian, zero-padded: orders most pairs of ids
            /// without following `name` (see `Ord`).
            prefix: u64,
            name: Arc<str>,
        }

        /// The `str`'s hash, as `Borrow<str>` requires (and as derived before).
        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.name.hash(state);
            }
        }

        // Ids are compared constantly (map keys in the replication core and the
        // simulator), mostly while searching maps: the same `Arc` is equal without
        // reading it, and the prefix held next to the pointer decides most other
        // pairs without reading the name (a cache miss and a `memcmp` call each).
        // The order is exactly `str`'s (bytewise), so `Borrow<str>` lookups and
        // `Hash` stay consistent.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.name, &other.name)
                    || (self.prefix == other.prefix
                        && self.name.len() == other.name.len()
                        && (self.name.len() <= 8 || *self.name == *other.name))
            }
        }

        impl Eq for $name {}

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                if Arc::ptr_eq(&self.name, &other.name) {
                    return std::cmp::Ordering::Equal;
                }
                // Zero padding keeps the order: a shorter name that is a prefix of a
                // longer one compares below it or ties (a NUL byte), and ties fall
                // through. Names of 8 bytes or fewer with equal prefixes differ, if
                // at all, in trailing NULs, so their lengths decide.
                self.prefix.cmp(&other.prefix).then_with(|| {
                    if self.name.len() <= 8 && other.name.len() <= 8 {
                        self.name.len().cmp(&other.name.len())
                    } else {
                        self.name.as_bytes().cmp(other.name.as_bytes())
                    }
                })
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl $name {
            pub fn new(name: impl Into<Arc<str>>) -> Self {
                let name: Arc<str> = name.into();
                let mut prefix = [0u8; 8];
                let n = name.len().min(8);
                prefix[..n].copy_from_slice(&name.as_bytes()[..n]);
                Self {
                    prefix: u64::from_be_bytes(prefix),
                    name,
                }
            }

            pub fn as_str(&self) -> &str {
                &self.name
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.name)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.name, f)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self::new(s)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.name)
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.name
            }
        }
    };
}

name_type!(
    /// A replica's id from the topology file, e.g. `eu-west-1a`. Origins of writes are
    /// replicas, and ties between equal timestamps are broken by comparing these.
    ReplicaId
);

name_type!(
    /// A region's name from the topology file, e.g. `eu-west-1`.
    RegionId
);

name_type!(
    /// A replication scope: a placement policy's rows (`global`, or the policy's
    /// name), or, in a deployment of several shard groups, one group of them
    /// (`global/17`: policy, [`ScopeId::GROUP_SEPARATOR`], group). Each scope has its
    /// own per-origin sequence streams and watermarks; its tree is its policy's.
    /// A policy is named by the same type (its name is its scope in a deployment
    /// of one group).
    ScopeId
);

impl ScopeId {
    /// Between a scope's policy and its group. Policy names cannot hold it
    /// (`schema::validate_name`), so a scope's name splits one way only.
    pub const GROUP_SEPARATOR: char = '/';

    /// The scope of rows without a restricting placement policy, in a deployment
    /// of one shard group.
    pub fn global() -> Self {
        Self::new(crate::placement::GLOBAL_POLICY)
    }

    /// The scope of group `group` of `policy` in a deployment of `groups` shard
    /// groups: the policy's own name when there is one group (so a deployment of
    /// one group names its scopes as it always has), else `policy/group`.
    pub fn of_group(policy: &ScopeId, groups: u32, group: GroupId) -> ScopeId {
        if groups <= 1 {
            policy.clone()
        } else {
            ScopeId::new(format!("{policy}{}{}", Self::GROUP_SEPARATOR, group.0))
        }
    }

    /// The placement policy whose rows the scope replicates.
    pub fn policy(&self) -> &str {
        self.as_str()
            .split_once(Self::GROUP_SEPARATOR)
            .map_or(self.as_str(), |(p, _)| p)
    }

    /// The shard group the scope replicates; `None` for a policy's whole rows (a
    /// deployment of one group) or a malformed group.
    pub fn group(&self) -> Option<GroupId> {
        let (_, g) = self.as_str().split_once(Self::GROUP_SEPARATOR)?;
        if g.len() > 1 && g.starts_with('0') {
            return None;
        }
        g.parse().ok().map(GroupId)
    }
}

use crate::shard::GroupId;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The hand-written order and equality are exactly `str`'s.
        #[test]
        fn id_order_is_str_order(a in "[a-z0-9\\x00\u{e9}-]{0,12}", b in "[a-z0-9\\x00\u{e9}-]{0,12}", same_prefix in any::<bool>()) {
            // Often share a prefix (so ties of the first 8 bytes run), with NUL bytes
            // (which zero padding could confuse) and multi-byte characters.
            let b = if same_prefix { format!("{}{}", a.get(..a.len().min(9)).unwrap_or(""), b) } else { b };
            let (x, y) = (ReplicaId::from(a.as_str()), ReplicaId::from(b.as_str()));
            prop_assert_eq!(x.cmp(&y), a.as_str().cmp(b.as_str()));
            prop_assert_eq!(x == y, a == b);
            prop_assert_eq!(x.cmp(&x.clone()), std::cmp::Ordering::Equal);
        }
    }
}
