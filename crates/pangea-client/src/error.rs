//! The one error type of the client library. Every variant says what happened and,
//! where it applies, which replica said so.

use pangea_proto::v1 as pb;
use pangea_topology::ReplicaId;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// No acceptable answer before the call's deadline.
    #[error("deadline of {deadline:?} exceeded after {attempts} attempt(s)")]
    DeadlineExceeded { deadline: Duration, attempts: u32 },
    /// A watermark read no replica could serve: never a stale value instead.
    #[error("not covered: {detail}{}", if *deadline_passed { " (no covered replica answered before the deadline)" } else { "" })]
    NotCovered {
        replica: String,
        detail: String,
        deadline_passed: bool,
    },
    /// A bounded-staleness read every asked replica was too far behind for.
    #[error("too stale: {0}")]
    TooStale(String),
    /// The row's placement policy or the app profile forbids the replicas (fail
    /// closed: nothing is read or written elsewhere).
    #[error("policy forbids: {0}")]
    PolicyForbids(String),
    /// No replica could be reached, or the one asked refused: it did nothing
    /// (a write was not applied).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The request went out to `replica`, but its connection or stream failed
    /// before an answer came back. Another replica is asked for a read; a write
    /// ends with [`Error::Ambiguous`].
    #[error("connection to replica {replica} lost before its answer: {detail}")]
    Lost { replica: String, detail: String },
    /// A write that may or may not have been applied: `replica` was sent it and
    /// then stopped waiting for it, went silent, or was lost before answering.
    /// Sending it again elsewhere would apply it twice, so the client did not
    /// ([`crate::WriteOptions::resend_if_unknown`] says it may). Read the row to
    /// find out, or write again if applying it twice is harmless.
    #[error("write may or may not have been applied at replica {replica}: {detail}")]
    Ambiguous { replica: String, detail: String },
    /// The request broke a limit or was malformed; the message names what.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Unknown table or family.
    #[error("not found: {0}")]
    NotFound(String),
    /// A write that asked to wait for other regions ([`crate::Ack`]) is durable at
    /// its origin and replicating, but had not been applied in the regions asked
    /// by the deadline; `detail` says where it had. The write happened: use its
    /// token, do not write it again elsewhere.
    #[error("not replicated in time: {detail}")]
    NotReplicated {
        token: Option<pangea_core::Token>,
        detail: String,
    },
    /// A change stream's cursor is behind what every replica asked still keeps
    /// of one of its streams (the table's `changes.retention` passed, or the
    /// replica caught up from a snapshot): resume from a backup or from now.
    #[error("change cursor expired: {0}")]
    CursorExpired(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    pub(crate) fn from_wire(e: &pb::Error, replica: &ReplicaId) -> Error {
        use pb::error::Code;
        let msg = format!("{} (replica {replica})", e.message);
        match Code::try_from(e.code).unwrap_or(Code::Internal) {
            Code::InvalidArgument => Error::InvalidInput(msg),
            Code::NotFound => Error::NotFound(msg),
            Code::DeadlineExceeded => Error::DeadlineExceeded {
                deadline: Duration::ZERO,
                attempts: 1,
            },
            Code::NotCovered => Error::NotCovered {
                replica: replica.to_string(),
                detail: e.message.clone(),
                deadline_passed: false,
            },
            Code::TooStale => Error::TooStale(msg),
            Code::PolicyForbids => Error::PolicyForbids(msg),
            Code::Unavailable => Error::Unavailable(msg),
            Code::NotReplicated => Error::NotReplicated {
                token: pangea_core::Token::decode(&e.token).ok(),
                detail: msg,
            },
            Code::CursorExpired => Error::CursorExpired(msg),
            Code::Internal | Code::Unspecified => Error::Internal(msg),
        }
    }

    /// A short stable name of the variant (`error.kind` in trace spans; never
    /// carries the message).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
            Error::NotCovered { .. } => "not_covered",
            Error::TooStale(_) => "too_stale",
            Error::PolicyForbids(_) => "policy_forbids",
            Error::Unavailable(_) => "unavailable",
            Error::Lost { .. } => "lost",
            Error::Ambiguous { .. } => "ambiguous",
            Error::InvalidInput(_) => "invalid_input",
            Error::NotFound(_) => "not_found",
            Error::NotReplicated { .. } => "not_replicated",
            Error::CursorExpired(_) => "cursor_expired",
            Error::Internal(_) => "internal",
        }
    }

    /// Whether another replica might succeed where this one failed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_)
                | Error::Lost { .. }
                | Error::TooStale(_)
                | Error::DeadlineExceeded { .. }
                | Error::NotCovered { .. }
                // Another replica may keep more of the log.
                | Error::CursorExpired(_)
        )
    }
}

impl From<pangea_core::Error> for Error {
    fn from(e: pangea_core::Error) -> Self {
        Error::InvalidInput(e.to_string())
    }
}

impl From<pangea_net::Error> for Error {
    fn from(e: pangea_net::Error) -> Self {
        Error::Unavailable(e.to_string())
    }
}
