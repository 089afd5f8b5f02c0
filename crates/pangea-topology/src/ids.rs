//! Identifiers shared by every crate: replicas, regions and replication scopes.

use std::fmt;
use std::sync::Arc;

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

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
