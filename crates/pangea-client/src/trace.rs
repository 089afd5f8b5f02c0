//! Spans (docs/client.md#traces): one per call (`pangea.get`, `pangea.get_many`,
//! `pangea.scan`, `pangea.mutate`) with a child `pangea.attempt` per request sent —
//! the first, each hedge, each watermark fallback, failover and retry. With an
//! OpenTelemetry layer installed, each attempt's W3C `traceparent` travels in its
//! request, so the replica's `pangea.serve` span joins the trace.
//!
//! User keys appear only as `key.hash` (`pangea_core::redact`) and `key.len`; values
//! never. Without a subscriber interested in these spans nothing is hashed,
//! formatted or allocated: the macros skip their fields and attempt spans are not
//! even created when the call's span is disabled.

use crate::Error;
use pangea_core::read::{Candidate, Consistency};
use pangea_core::redact::KeyHash;
use pangea_topology::Deployment;
use tracing::Span;
use tracing::field::{Empty, display};

/// The calls that get a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Get,
    GetMany,
    Scan,
    Mutate,
    MutateRows,
    Changes,
}

/// Why a request was sent (the `kind` attribute of an attempt span).
pub(crate) use pangea_core::frontend::call::AttemptKind;

/// The consistency mode as spans and the replica's metrics name it.
pub(crate) fn mode_name(c: &Consistency) -> &'static str {
    c.mode()
}

/// The span of one call, and what its attempt spans repeat.
#[derive(Debug, Clone)]
pub(crate) struct Traced {
    pub(crate) span: Span,
    mode: &'static str,
    key_hash: u64,
    key_len: usize,
}

impl Traced {
    /// The span of a call by the application (`key`: the row key, the first of a
    /// get-many, or a scan's prefix).
    pub(crate) fn call(
        op: Op,
        table: &str,
        key: &[u8],
        keys: usize,
        consistency: &'static str,
    ) -> Traced {
        macro_rules! call_span {
            ($name:literal) => {
                tracing::info_span!(
                    $name,
                    table,
                    consistency,
                    key.hash = Empty,
                    key.len = key.len(),
                    keys,
                    attempts = Empty,
                    replica = Empty,
                    region = Empty,
                    reason = Empty,
                    outcome = Empty,
                    error.kind = Empty,
                    otel.status_code = Empty,
                )
            };
        }
        let span = match op {
            Op::Get => call_span!("pangea.get"),
            Op::GetMany => call_span!("pangea.get_many"),
            Op::Scan => call_span!("pangea.scan"),
            Op::Mutate => call_span!("pangea.mutate"),
            Op::MutateRows => call_span!("pangea.mutate_rows"),
            Op::Changes => call_span!("pangea.changes"),
        };
        Traced::new(span, consistency, key)
    }

    /// The client's own background read of location metadata (`debug`: a trace per
    /// second per client is noise unless asked for).
    pub(crate) fn refresh_location(table: &str) -> Traced {
        let span = tracing::debug_span!(
            "pangea.refresh_location",
            table,
            attempts = Empty,
            replica = Empty,
            region = Empty,
            reason = Empty,
            outcome = Empty,
            error.kind = Empty,
            otel.status_code = Empty,
        );
        Traced::new(span, "eventual", b"")
    }

    fn new(span: Span, mode: &'static str, key: &[u8]) -> Traced {
        let key_hash = if span.is_disabled() {
            0
        } else {
            let h = pangea_core::redact::key_hash(key);
            span.record("key.hash", display(KeyHash(h)));
            h
        };
        Traced {
            span,
            mode,
            key_hash,
            key_len: key.len(),
        }
    }

    /// The span of one request to `c`, a child of the call's; disabled (and not
    /// created) when the call's span is.
    pub(crate) fn attempt(&self, d: &Deployment, c: &Candidate, kind: AttemptKind) -> Span {
        if self.span.is_disabled() {
            return Span::none();
        }
        let region = d.topology.region_of(c.replica.as_str());
        tracing::info_span!(
            parent: &self.span,
            "pangea.attempt",
            otel.kind = "client",
            kind = kind.as_str(),
            replica = %c.replica,
            region = region.map(|r| r.as_str()).unwrap_or_default(),
            reason = %c.reason,
            consistency = self.mode,
            key.hash = %KeyHash(self.key_hash),
            key.len = self.key_len,
            outcome = Empty,
            error.kind = Empty,
            otel.status_code = Empty,
        )
    }

    /// Records how the call ended on its span.
    pub(crate) fn finish<T>(&self, result: &Result<crate::Response<T>, Error>) {
        let span = &self.span;
        if span.is_disabled() {
            return;
        }
        match result {
            Ok(r) => {
                span.record("outcome", "served");
                span.record("attempts", r.attempts);
                span.record("replica", display(&r.replica));
                span.record("region", r.region.as_str());
                span.record("reason", display(r.reason));
            }
            Err(e) => {
                span.record("outcome", outcome_of(e));
                span.record("error.kind", e.kind());
                span.record("otel.status_code", "ERROR");
            }
        }
    }
}

impl Traced {
    /// Closes a batch call's span: `served` when every row was applied, else the
    /// first failed row's error kind.
    pub(crate) fn finish_batch<T>(&self, results: &[Result<crate::Response<T>, Error>]) {
        let span = &self.span;
        if span.is_disabled() {
            return;
        }
        match results.iter().find_map(|r| r.as_ref().err()) {
            None => {
                span.record("outcome", "served");
            }
            Some(e) => {
                span.record("outcome", outcome_of(e));
                span.record("error.kind", e.kind());
                span.record("otel.status_code", "ERROR");
            }
        }
        let replicas: std::collections::BTreeSet<&str> = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|r| r.replica.as_str())
            .collect();
        span.record("attempts", replicas.len());
    }
}

/// The outcome attribute of a request that ended with `e`.
fn outcome_of(e: &Error) -> &'static str {
    match e {
        Error::NotCovered { .. } => "not_covered",
        _ => "error",
    }
}

/// Records how one request ended and closes its span: `served`, `not_covered` or
/// `error` (with `error.kind`).
pub(crate) fn finish_attempt<T>(span: Span, result: &Result<T, Error>) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(_) => {
            span.record("outcome", "served");
        }
        Err(e) => {
            span.record("outcome", outcome_of(e));
            span.record("error.kind", e.kind());
            if !matches!(e, Error::NotCovered { .. }) {
                span.record("otel.status_code", "ERROR");
            }
        }
    }
}

/// Closes the span of a request the call stopped waiting for (another answered
/// first, the deadline passed, or a fatal error ended the call).
pub(crate) fn cancel_attempt(span: Span) {
    if !span.is_disabled() {
        span.record("outcome", "cancelled");
    }
}

/// The W3C `traceparent` of `span` for the request it sends; empty when the span is
/// disabled or no OpenTelemetry layer gives it a context.
pub(crate) fn traceparent(span: &Span) -> String {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() {
        return String::new();
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return String::new();
    }
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_subscriber_nothing_is_built() {
        let t = Traced::call(Op::Get, "t", b"secret-key", 1, "eventual");
        assert!(t.span.is_disabled());
        assert_eq!(t.key_hash, 0, "not hashed when nobody listens");
        assert_eq!(traceparent(&t.span), "");
    }
}
