//! The one error type of `pangea-core`.

use crate::hlc::ClockError;
use crate::limits::Limited;
use pangea_topology::schema::NameError;

/// Everything that can go wrong in `pangea-core`. Each variant names what was wrong
/// and, where it applies, the size and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Input broke a size limit of [`crate::Limits`].
    #[error("{what} is {size}{}, limit {limit}", what.unit())]
    TooLarge {
        what: Limited,
        size: usize,
        limit: usize,
    },
    #[error("row key is empty")]
    EmptyRowKey,
    #[error("row mutation for table {table:?} has no mutations")]
    EmptyMutation { table: String },
    #[error("unknown table {table:?}")]
    UnknownTable { table: String },
    #[error("table {table:?} has no column family {family:?}")]
    UnknownFamily { table: String, family: String },
    /// A mutation that does not fit its family's kind (cells or counter).
    #[error("family {family:?} of table {table:?} {why}")]
    FamilyKind {
        table: String,
        family: String,
        why: &'static str,
    },
    /// A write's event time the replica does not take.
    #[error("event time {event_time_ms} of a write to table {table:?} refused: {why}")]
    EventTime {
        table: String,
        event_time_ms: u64,
        why: String,
    },
    #[error(transparent)]
    InvalidName(#[from] NameError),
    #[error("time range [{start}, {end}) is empty")]
    EmptyTimeRange { start: u64, end: u64 },
    /// A message was structurally incomplete (a required field or `oneof` missing).
    #[error("malformed {message}: {detail}")]
    Malformed {
        message: &'static str,
        detail: String,
    },
    /// Bytes that should hold a protobuf message do not.
    #[error("cannot decode {message}: {detail}")]
    Decode {
        message: &'static str,
        detail: String,
    },
    /// The row's placement policy does not allow this replica (or it stores no rows).
    #[error("placement policy {scope:?} does not allow replica {replica:?} to hold this row")]
    PolicyForbids { scope: String, replica: String },
    /// The replica's store is new and it is still relearning from its peers how
    /// far its own stream went ([`crate::replica::Replica::relearn_own_streams`]).
    #[error(
        "replica {replica:?} is relearning its own stream of scope {scope:?} from its \
         peers (its store is new): another replica takes the write"
    )]
    OwnStreamUnknown { scope: String, replica: String },
    #[error(transparent)]
    Clock(#[from] ClockError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// What a storage engine reports. `pangea-store` maps its engine's errors here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The engine failed (I/O, poisoned after a failed fsync…) while `doing`
    /// something; nothing was applied. The engine's own error is the source.
    #[error("storage engine failed while {doing}")]
    Io {
        doing: &'static str,
        #[source]
        source: EngineError,
    },
    /// The store is closed after a failure and not reopened yet (a full disk most
    /// often): writes are refused, `state` says why and since when.
    #[error("replica {replica}: {state}")]
    Closed { replica: String, state: String },
    /// Stored bytes do not decode: the store is damaged. Names the entry.
    #[error("corrupt {what} at key {key}: {detail}")]
    Corrupt {
        what: &'static str,
        key: String,
        detail: String,
    },
}

/// A storage engine's error, kept whole (its own source chain included) and
/// shareable, so that [`Error`] stays `Clone`. Two are equal only if they are the
/// same failure.
#[derive(Clone)]
pub struct EngineError(std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>);

impl EngineError {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        EngineError(std::sync::Arc::new(e))
    }
}

impl std::fmt::Debug for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for EngineError {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for EngineError {}

/// An error and its sources, each after a `: ` — for messages that leave the
/// process (a client's error reply, a health detail) or one log field.
#[derive(Debug)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

impl Error {
    pub(crate) fn decode(message: &'static str, err: impl std::fmt::Display) -> Self {
        Error::Decode {
            message,
            detail: err.to_string(),
        }
    }

    pub(crate) fn malformed(message: &'static str, detail: impl Into<String>) -> Self {
        Error::Malformed {
            message,
            detail: detail.into(),
        }
    }
}
