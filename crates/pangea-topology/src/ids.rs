//! Identifiers shared by every crate: replicas, regions and replication scopes.

use std::fmt;
use std::sync::Arc;

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name(Arc<str>);

        /// The `str`'s hash, as `Borrow<str>` requires (and as derived before).
        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state);
            }
        }

        // Ids are compared constantly (map keys in the replication core and the
        // simulator): the same `Arc` is equal without reading it, and most ids differ
        // in their first 8 bytes, compared as one integer. The order is exactly
        // `str`'s (bytewise), so `Borrow<str>` lookups and `Hash` stay consistent.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
            }
        }

        impl Eq for $name {}

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                if Arc::ptr_eq(&self.0, &other.0) {
                    return std::cmp::Ordering::Equal;
                }
                let (a, b) = (self.0.as_bytes(), other.0.as_bytes());
                if let (Some(x), Some(y)) = (a.first_chunk::<8>(), b.first_chunk::<8>()) {
                    let by_prefix = u64::from_be_bytes(*x).cmp(&u64::from_be_bytes(*y));
                    if by_prefix.is_ne() {
                        return by_prefix;
                    }
                }
                a.cmp(b)
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl $name {
            pub fn new(name: impl Into<Arc<str>>) -> Self {
                Self(name.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.into())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
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
    /// A replication scope: `global`, or the name of a placement policy. Each scope has
    /// its own tree and its own per-origin sequence streams.
    ScopeId
);

impl ScopeId {
    /// The scope of rows without a restricting placement policy.
    pub fn global() -> Self {
        Self::new("global")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The hand-written order and equality are exactly `str`'s.
        #[test]
        fn id_order_is_str_order(a in "[a-z0-9-]{0,12}", b in "[a-z0-9-]{0,12}", same_prefix in any::<bool>()) {
            // Often share a prefix, so the fallback after equal first 8 bytes runs.
            let b = if same_prefix { format!("{}{}", a.get(..a.len().min(9)).unwrap_or(""), b) } else { b };
            let (x, y) = (ReplicaId::from(a.as_str()), ReplicaId::from(b.as_str()));
            prop_assert_eq!(x.cmp(&y), a.as_str().cmp(b.as_str()));
            prop_assert_eq!(x == y, a == b);
            prop_assert_eq!(x.cmp(&x.clone()), std::cmp::Ordering::Equal);
        }
    }
}
