//! The crate's one error type.

/// What can go wrong building a network or changing it at runtime. Sending never
/// fails: a message that cannot go is a [`crate::net::SendOutcome::Dropped`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NetError {
    #[error("unknown replica {0:?}")]
    UnknownReplica(String),
    #[error("unknown region {0:?}")]
    UnknownRegion(String),
    #[error("region {0:?} is on both sides of the partition")]
    RegionOnBothSides(String),
    /// The topology gives no round trip between two replicas (a validated topology
    /// always does; this guards against one edited after validation).
    #[error("the topology has no route between replicas {from:?} and {to:?}")]
    NoRoute { from: String, to: String },
    /// The network keeps dense per-pair tables (see [`crate::net::REPLICAS_MAX`]).
    #[error("the topology has {count} replicas, more than the simulator's limit of {max}")]
    TooManyReplicas { count: usize, max: usize },
    #[error("invalid {field}: {value} (expected {expected})")]
    InvalidValue {
        field: &'static str,
        value: f64,
        expected: &'static str,
    },
}
