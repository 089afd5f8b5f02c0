//! Serving client requests: each request, carrying its deadline, is one frame on a
//! bidirectional QUIC stream, answered by one frame; a stream carries its client's
//! requests one after another. Every request is first authorized
//! (`pangea_core::auth`: the caller's certificate names a client, loader or
//! operator; the matrix is in docs/operations.md "Who may do what"). Reads are
//! answered straight from the store (concurrently with the driver) after
//! `pangea_core::read::decide` checks the consistency the client asked for against
//! the durable watermarks the driver published. Writes go through the driver and are
//! answered once durable. Operator actions, refused attempts at them or at system
//! tables, and pre-versioned merges are recorded in the audit log (`audit_log`).

use crate::Shared;
use crate::audit_log::Outcome;
use crate::driver::{Input, Unacked};
use crate::shared::PublishedWatermarks;
use bytes::Bytes;
use pangea_core::auth::{self, Action, Principal};
use pangea_core::digest::ContentDigest;
use pangea_core::read::{Consistency, Decision, decide, vouching_scope};
use pangea_core::{
    BytesRange, Error as CoreError, Limits, ReadFilter, RowMutation, ScopeId, Token,
};
use pangea_net::frame::{encode_frame_nesting, encode_frame_pair, write_frame_pieces};
use pangea_net::read_frame_within;
use pangea_proto::Message as _;

/// The code a refused request's stream is stopped with (its answer says why).
const STOP_REFUSED: u32 = 1;
/// The code a stream is reset with when its request was read but will not be
/// answered (the replica is stopping): a client must not take it for a request
/// never read, which a finished stream means (docs/protocol.md, §2 "Streams").
const RESET_UNANSWERED: u32 = 2;
use pangea_proto::v1 as pb;
use pangea_topology::shard::{GroupId, process_of};
use pangea_topology::{Deployment, RegionId, ReplicaId, process_id};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Largest client request frame: a maximal row mutation plus its envelope.
pub const CLIENT_FRAME_BYTES_MAX: usize = pangea_net::FRAME_BYTES_MAX;
/// Requests without a deadline get this one.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);
pub use pangea_core::frontend::{SCAN_ROWS_DEFAULT, SCAN_ROWS_MAX};
/// Most keys in one get-many.
pub const GET_MANY_KEYS_MAX: usize = 1_000;
/// Rows a scan reads from the store at a time.
const SCAN_FETCH_ROWS: usize = 64;
/// Most rows a page of a sampled scan visits (it counts the rows it sends
/// against `limit`): about 10 ms of a replica's time for rows of 2 KiB.
const SAMPLE_VISIT_MAX: usize = 10_000;
/// Bytes of rows a get-many response or scan page carries when the client does
/// not say: a page of large rows stays a few milliseconds of a link's time.
pub const RESPONSE_BYTES_DEFAULT: usize = 4 << 20;
/// Most bytes of rows one response carries, whatever the client asks: with the
/// envelope it stays within a frame ([`CLIENT_FRAME_BYTES_MAX`]). A single row may
/// be as large (`Limits::row_bytes_max`) and is sent alone.
pub const RESPONSE_BYTES_MAX: usize = 16 << 20;

/// The response budget a request asks for (`max_bytes`, 0: the default).
fn response_bytes(asked: u32) -> usize {
    match asked as usize {
        0 => RESPONSE_BYTES_DEFAULT,
        n => n.min(RESPONSE_BYTES_MAX),
    }
}
/// Longest a request frame's body may take to arrive after its header: a peer that
/// announces a frame and sends it slowly holds budget only this long.
pub const FRAME_BODY_TIME_MAX: Duration = Duration::from_secs(30);

type Code = pb::error::Code;

/// A failed request: a code the client can act on, and a message naming what.
#[derive(Debug)]
struct Failure {
    code: Code,
    message: String,
    /// Watermarks to attach (not-covered answers carry them so the client learns).
    watermarks: Option<Arc<PublishedWatermarks>>,
    /// Refused by authorization (counted apart from placement refusals).
    denied: bool,
    /// A write's token, sent with `NotReplicated` (the write happened).
    token: Option<Token>,
}

impl Failure {
    fn new(code: Code, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            watermarks: None,
            denied: false,
            token: None,
        }
    }

    /// An authorization refusal (`PolicyForbids` naming who, what and the missing
    /// permission).
    fn denied(d: auth::Denied) -> Self {
        Failure {
            denied: true,
            ..Failure::new(Code::PolicyForbids, d.to_string())
        }
    }

    fn into_proto(self) -> pb::Error {
        pb::Error {
            code: self.code as i32,
            message: self.message,
            token: self.token.map(|t| t.encode()).unwrap_or_default(),
        }
    }

    fn outcome(&self) -> &'static str {
        if self.denied {
            return "denied";
        }
        match self.code {
            Code::NotCovered => "not_covered",
            Code::TooStale => "too_stale",
            Code::PolicyForbids => "policy",
            Code::DeadlineExceeded => "deadline",
            Code::InvalidArgument => "invalid",
            Code::NotFound => "not_found",
            Code::Unavailable => "unavailable",
            Code::NotReplicated => "not_replicated",
            Code::CursorExpired => "cursor_expired",
            _ => "internal",
        }
    }
}

impl From<CoreError> for Failure {
    fn from(e: CoreError) -> Self {
        let code = match &e {
            CoreError::UnknownTable { .. } | CoreError::UnknownFamily { .. } => Code::NotFound,
            CoreError::PolicyForbids { .. } => Code::PolicyForbids,
            // A fenced clock, or a new store relearning its own stream: another
            // replica takes the write (the client fails over).
            CoreError::Storage(_)
            | CoreError::OwnStreamUnknown { .. }
            | CoreError::Clock(pangea_core::hlc::ClockError::Fenced { .. }) => Code::Unavailable,
            _ => Code::InvalidArgument,
        };
        Failure::new(code, pangea_core::Chain(&e).to_string())
    }
}

/// Serves every request stream of one client connection.
pub async fn handle_client(shared: Arc<Shared>, connection: quinn::Connection, caller: Principal) {
    let budget = pangea_net::FrameBudget::new(
        shared.intake.frame_budget.clone(),
        crate::mib(shared.config.frame_budget_mib),
        crate::mib(shared.config.frame_budget_connection_mib),
    );
    loop {
        // Requests are bidirectional streams; a unidirectional one is a replication
        // link, which only a replica certificate may open.
        let (send, recv) = tokio::select! {
            bi = connection.accept_bi() => match bi {
                Ok(streams) => streams,
                Err(_) => return,
            },
            uni = connection.accept_uni() => {
                if uni.is_ok() {
                    tracing::warn!(caller = %caller, "refused: a replication link from a non-replica certificate");
                    shared.metrics.inc_frames_rejected("wrong_role");
                    let reason = format!(
                        "{caller} may not open a replication link: only replica certificates replicate"
                    );
                    connection.close(crate::peers::CLOSE_WRONG_ROLE.into(), reason.as_bytes());
                }
                return;
            }
        };
        let (shared, caller, budget) = (shared.clone(), caller.clone(), budget.clone());
        tokio::spawn(async move { serve_stream(shared, caller, budget, send, recv).await });
    }
}

/// Serves the requests of one stream one after another, until the client finishes
/// it (clients reuse a stream for their next request to this replica once the
/// answer is in).
async fn serve_stream(
    shared: Arc<Shared>,
    caller: Principal,
    budget: pangea_net::FrameBudget,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    loop {
        let read = read_frame_within::<pb::ClientRequest>(
            &mut recv,
            CLIENT_FRAME_BYTES_MAX,
            &budget,
            FRAME_BODY_TIME_MAX,
        )
        .await;
        let req = match read {
            Ok(Some(r)) => {
                shared.poller.request();
                r
            }
            Ok(None) => break,
            Err(e) => {
                // The stream is no longer at a frame boundary: answer, stop the
                // client's sending, end it.
                use pangea_net::Error as E;
                let (reason, failure) = match &e {
                    E::FrameTooLarge { .. } => (
                        "frame_too_large",
                        Failure::new(Code::InvalidArgument, format!("malformed request: {e}")),
                    ),
                    E::OverBudget { .. } => (
                        "over_budget",
                        Failure::new(
                            Code::Unavailable,
                            format!("replica {} refused a request: {e}", shared.id),
                        ),
                    ),
                    // Never read, so never acted on: UNAVAILABLE (a write was not
                    // applied), not DEADLINE_EXCEEDED (unknown).
                    E::FrameTimeout { .. } => (
                        "frame_timeout",
                        Failure::new(Code::Unavailable, format!("request refused: {e}")),
                    ),
                    _ => (
                        "malformed",
                        Failure::new(Code::InvalidArgument, format!("malformed request: {e}")),
                    ),
                };
                shared.metrics.inc_frames_rejected(reason);
                let _ = recv.stop(STOP_REFUSED.into());
                let resp = response(&shared, Err(failure), None, 0);
                let _ = resp.write(&mut send).await;
                break;
            }
        };
        let owed = Owed(Some(send));
        let Ok(_permit) = shared.intake.requests.clone().acquire_owned().await else {
            // Shutting down: nothing was done, and the client may send it elsewhere.
            let _ = owed.paid().finish();
            return;
        };
        let _inflight = shared.intake.inflight.enter();
        let resp = serve_request(&shared, &caller, req).await;
        send = owed.paid();
        if resp.write(&mut send).await.is_err() {
            return;
        }
    }
    let _ = send.finish();
}

/// The stream of a request being served. Dropped before [`Owed::paid`] (the
/// task ended mid-request: the replica is stopping), it resets the stream, so the
/// client learns that the request may have been acted on; a stream dropped as it
/// is finishes, which tells a client that its request was never read.
struct Owed(Option<quinn::SendStream>);

impl Owed {
    fn paid(mut self) -> quinn::SendStream {
        self.0.take().expect("an owed stream is paid once")
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        if let Some(send) = &mut self.0 {
            let _ = send.reset(RESET_UNANSWERED.into());
        }
    }
}

/// A row key (or prefix, or resume key) of a request within the replica's limit
/// (a mutation's key is checked with the mutation); `field` names it.
fn key_within(limits: &Limits, key: &[u8], field: &str) -> Result<(), Failure> {
    Limits::check(
        pangea_core::limits::Limited::RowKey,
        key.len(),
        limits.row_key_bytes_max,
    )
    .map_err(|e| Failure::new(Code::InvalidArgument, format!("{field}: {e}")))
}

/// One request: checked against its deadline, traced, counted, answered.
async fn serve_request(shared: &Arc<Shared>, caller: &Principal, req: pb::ClientRequest) -> Reply {
    let started = Instant::now();
    let (op, mode) = describe(&req);
    let known = req.known_watermarks;
    let budget = if req.deadline_us > 0 {
        Duration::from_micros(req.deadline_us)
    } else {
        DEFAULT_DEADLINE
    };
    let span = serve_span(shared, caller, &req, op, mode);
    let work = tracing::Instrument::instrument(process(shared, caller, req), span.clone());
    // A client may ask for any budget: one past what an `Instant` can hold is as
    // good as a day.
    let deadline_at = started
        .checked_add(budget)
        .unwrap_or_else(|| started + Duration::from_secs(86_400));
    let done = tokio::time::timeout_at(deadline_at.into(), work).await;
    let took = started.elapsed();
    let result = {
        match done {
            // Reads complete without yielding, so the timer may not have fired: an
            // answer later than the deadline is still an expired request. Not a
            // write that was made: its token is the answer (DEADLINE_EXCEEDED would
            // tell the client the outcome is unknown).
            Ok(Ok(_)) if took > budget && !op.starts_with("mutate") => Err(Failure::new(
                Code::DeadlineExceeded,
                format!(
                    "deadline of {} µs exceeded at replica {}",
                    budget.as_micros(),
                    shared.id
                ),
            )),
            Ok(r) => r,
            Err(_) => Err(Failure::new(
                Code::DeadlineExceeded,
                format!(
                    "deadline of {} µs exceeded at replica {}",
                    budget.as_micros(),
                    shared.id
                ),
            )),
        }
    };
    let outcome = match &result {
        Ok(_) => "ok",
        Err(f) => f.outcome(),
    };
    span.record("outcome", outcome);
    if result.is_err() && !span.is_disabled() {
        span.record("otel.status_code", "ERROR");
    }
    let resp = match result {
        Ok((body, wm)) => response(shared, Ok(body), wm, known),
        Err(f) => {
            let wm = f.watermarks.clone();
            response(shared, Err(f), wm, known)
        }
    };
    shared
        .metrics
        .observe_request(op, mode, outcome, took.as_secs_f64());
    resp
}

/// The span of one request: a child of the client's attempt span when the request
/// carried a `traceparent`. User keys appear only hashed (`pangea_core::redact`);
/// values never.
fn serve_span(
    shared: &Shared,
    caller: &Principal,
    req: &pb::ClientRequest,
    op: &'static str,
    mode: &'static str,
) -> tracing::Span {
    use pb::client_request::Request as R;
    use tracing::field::Empty;
    let span = tracing::info_span!(
        "pangea.serve",
        otel.kind = "server",
        op,
        mode,
        caller = %caller.name(),
        replica = %shared.id,
        region = %shared.region,
        key.hash = Empty,
        key.len = Empty,
        keys = Empty,
        outcome = Empty,
        otel.status_code = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    let key = match &req.request {
        Some(R::Get(g)) => Some(&g.row_key),
        Some(R::GetMany(g)) => {
            span.record("keys", g.row_keys.len());
            g.row_keys.first()
        }
        Some(R::ScanPrefix(s)) => Some(&s.prefix),
        Some(R::Mutate(m)) => m.mutation.as_ref().map(|m| &m.row_key),
        Some(R::MutateRows(b)) => {
            span.record("keys", b.rows.len());
            b.rows.first().map(|m| &m.row_key)
        }
        _ => None,
    };
    if let Some(k) = key {
        span.record(
            "key.hash",
            tracing::field::display(pangea_core::redact::KeyHash::of(k)),
        );
        span.record("key.len", k.len());
    }
    if let Some(parent) = crate::telemetry::remote_parent(&req.traceparent) {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        // Fails only without an OpenTelemetry layer: then there is no trace to join.
        let _ = span.set_parent(parent);
    }
    span
}

fn describe(req: &pb::ClientRequest) -> (&'static str, &'static str) {
    use pb::client_request::Request as R;
    let mode = |c: &Option<pb::Consistency>| match c.as_ref().and_then(|c| c.mode.as_ref()) {
        None | Some(pb::consistency::Mode::Eventual(_)) => "eventual",
        Some(pb::consistency::Mode::RowAffinity(_)) => "affinity",
        Some(pb::consistency::Mode::WatermarkToken(_)) => "watermark",
        Some(pb::consistency::Mode::BoundedStalenessMs(_)) => "bounded",
        Some(pb::consistency::Mode::AsOfMs(_)) => "as_of",
    };
    match &req.request {
        Some(R::Get(g)) => ("get", mode(&g.consistency)),
        Some(R::GetMany(g)) => ("get_many", mode(&g.consistency)),
        Some(R::ScanPrefix(s)) => ("scan", mode(&s.consistency)),
        Some(R::Mutate(_)) => ("mutate", "none"),
        Some(R::MutateRows(_)) => ("mutate_rows", "none"),
        Some(R::Watermarks(_)) => ("watermarks", "none"),
        Some(R::Deployment(_)) => ("deployment", "none"),
        Some(R::LocationChanges(_)) => ("location_changes", "none"),
        Some(R::Changes(_)) => ("changes", "none"),
        Some(R::PlacementMove(_)) => ("placement_move", "none"),
        Some(R::Audit(_)) => ("audit", "none"),
        Some(R::Reload(_)) => ("reload", "none"),
        None => ("unknown", "none"),
    }
}

/// What a request produced.
enum Body {
    Message(pb::client_response::Response),
    /// A get's row as its encoded answer (`None`: no row), shared with the row
    /// cache (`pangea_store::CachedRow::latest_encoded`).
    EncodedRow(Option<Bytes>),
}

impl From<pb::client_response::Response> for Body {
    fn from(r: pb::client_response::Response) -> Body {
        Body::Message(r)
    }
}

/// An answer ready to write: its `served_by` (field 1 of a `ClientResponse`), with
/// the watermarks as published, encoded before, and the rest. Both kinds decode, on
/// the client, as a `ClientResponse`.
struct Reply {
    served_by: pb::ClientResponseEncodedGet,
    rest: Rest,
}

// One per request being answered, moved once: not worth a box per message.
#[allow(clippy::large_enum_variant)]
enum Rest {
    /// The response (`served_by` unset): written after `served_by` in one frame.
    Message(pb::ClientResponse),
    /// A get's answer from the row cache's encoded row: the row (`get.row`, fields
    /// 11 and 1) as the cache holds it, uncopied.
    EncodedRow(Option<Bytes>),
}

impl Reply {
    async fn write(&self, send: &mut quinn::SendStream) -> pangea_net::Result<()> {
        match &self.rest {
            Rest::Message(m) => {
                // Handed to quinn as it is: no copy into the stream's send buffer.
                send.write_chunk(encode_frame_pair(&self.served_by, m)?)
                    .await?;
                Ok(())
            }
            Rest::EncodedRow(row) => {
                let (nest, tail): (&[u32], Bytes) = match row {
                    Some(row) => (&[11, 1], row.clone()),
                    // An empty `get` (no row): field 11 of length 0.
                    None => (&[11], Bytes::new()),
                };
                let pieces = encode_frame_nesting(&self.served_by, nest, tail)?;
                write_frame_pieces(send, pieces).await
            }
        }
    }
}

/// The answer to a request whose caller holds the watermarks `known` names
/// (`ClientRequest.known_watermarks`): `wm`, the watermarks of the scope checked,
/// are left out when they are those.
fn response(
    shared: &Shared,
    result: Result<Body, Failure>,
    wm: Option<Arc<PublishedWatermarks>>,
    known: u64,
) -> Reply {
    let (watermarks, watermarks_digest) = match &wm {
        Some(w) if w.digest == known => (None, w.digest),
        Some(w) => (Some(w.wire.clone()), w.digest),
        None => (None, 0),
    };
    let served_by = pb::ClientResponseEncodedGet {
        served_by: Some(pb::ServedByEncoded {
            replica: shared.id.to_string(),
            region: shared.region.to_string(),
            watermarks,
            deployment: shared.deployed.sources_digest(),
            watermarks_digest,
        }),
        get: None,
    };
    let rest = match result {
        Ok(Body::EncodedRow(row)) => Rest::EncodedRow(row),
        Ok(Body::Message(r)) => Rest::Message(pb::ClientResponse {
            served_by: None,
            response: Some(r),
        }),
        Err(f) => Rest::Message(pb::ClientResponse {
            served_by: None,
            response: Some(pb::client_response::Response::Error(f.into_proto())),
        }),
    };
    Reply { served_by, rest }
}

fn consistency(c: Option<pb::Consistency>) -> Result<Consistency, Failure> {
    use pb::consistency::Mode;
    Ok(match c.and_then(|c| c.mode) {
        None | Some(Mode::Eventual(_)) => Consistency::Eventual,
        Some(Mode::RowAffinity(_)) => Consistency::RowAffinity,
        Some(Mode::WatermarkToken(t)) => {
            Consistency::Watermark(Token::decode(&t).map_err(|e| {
                Failure::new(Code::InvalidArgument, format!("consistency token: {e}"))
            })?)
        }
        Some(Mode::BoundedStalenessMs(ms)) => Consistency::BoundedStaleness { max_ms: ms },
        Some(Mode::AsOfMs(ms)) => Consistency::AsOf { ms },
    })
}

fn filter(f: Option<pb::RowFilter>) -> Result<ReadFilter, Failure> {
    ReadFilter::from_proto(f.unwrap_or_default())
        .map_err(|e| Failure::new(Code::InvalidArgument, e.to_string()))
}

/// For a data principal: the app profile named in the request must be the
/// certificate's (an empty one means the certificate's), and must allow this
/// replica (priority class, pinned list).
fn check_profile(shared: &Shared, caller: &Principal, requested: &str) -> Result<(), Failure> {
    let Some(own) = caller.app_profile() else {
        return Ok(());
    };
    if !requested.is_empty() && requested != own {
        return Err(Failure::new(
            Code::PolicyForbids,
            format!("app profile {requested:?} is not the certificate's ({own:?})"),
        ));
    }
    let d = shared.deployment();
    let Some(profile) = d.topology.app_profiles.get(own) else {
        return Err(Failure::new(
            Code::PolicyForbids,
            format!("unknown app profile {own:?}"),
        ));
    };
    let me = d.topology.replica(shared.id.as_str());
    let role = me.map(|r| r.role);
    if !me.is_some_and(|r| profile.may_use(r)) {
        return Err(Failure::new(
            Code::PolicyForbids,
            format!(
                "app profile {:?} may not use replica {} ({:?})",
                profile.name, shared.id, role
            ),
        ));
    }
    Ok(())
}

/// The caller may touch rows of `scope` (its app profile's `policies`).
fn check_rows(shared: &Shared, caller: &Principal, scope: &ScopeId) -> Result<(), Failure> {
    auth::authorize_rows(&shared.deployment(), caller, scope).map_err(Failure::denied)
}

/// Whether an action is recorded in the audit log: operator actions always,
/// merges always, and refused writes of system tables.
fn audited(action: &Action<'_>, denied: bool) -> bool {
    match action {
        _ if action.is_operator() => true,
        Action::Merge { .. } => true,
        Action::Write { table } => denied && table.starts_with('_'),
        _ => false,
    }
}

/// The audit log's target of a request: tables and policies by name, key prefixes
/// hashed.
fn audit_target(req: &pb::ClientRequest) -> String {
    use pangea_core::redact::RedactedKey;
    use pb::client_request::Request as R;
    match &req.request {
        Some(R::PlacementMove(m)) => format!(
            "{} prefix {} -> {}{}",
            m.table,
            RedactedKey(&m.prefix),
            m.to_policy,
            if m.home_region.is_empty() {
                String::new()
            } else {
                format!(" (home {})", m.home_region)
            }
        ),
        Some(R::Mutate(m)) => m.mutation.as_ref().map_or_else(String::new, |m| {
            format!("{} {}", m.table, RedactedKey(&m.row_key))
        }),
        Some(R::MutateRows(b)) => format!("{} ({} rows)", b.table, b.rows.len()),
        _ => String::new(),
    }
}

/// The scope of a row, refusing rows this replica must not hold (residency) or
/// does not answer for (another process of the replica serves their group;
/// `Deployment::answers`).
fn scope_here(shared: &Shared, table: &str, key: &[u8], write: bool) -> Result<ScopeId, Failure> {
    let d = shared.deployment();
    known_table(&d, table)?;
    let scope = shared.scope_of(table, key);
    if !d.answers(&shared.id, &scope, write) {
        return Err(not_here(&d, &shared.id, &scope));
    }
    Ok(scope)
}

/// Refuses a table the placement's schema does not define.
fn known_table(d: &Deployment, table: &str) -> Result<(), Failure> {
    match d.placement.schema.table(table) {
        Some(_) => Ok(()),
        None => Err(Failure::new(
            Code::NotFound,
            format!("unknown table {table:?}"),
        )),
    }
}

/// Why replica `id` does not serve rows of `scope`: its placement policy keeps
/// them out of this region, or another process of the replica hosts their group.
fn not_here(d: &Deployment, id: &ReplicaId, scope: &ScopeId) -> Failure {
    let me = d.topology.replica(id.as_str());
    let hosted_elsewhere = me.is_some_and(|me| {
        d.placement
            .policy(scope)
            .is_some_and(|p| p.regions.contains(&me.region))
    });
    let why = match me.filter(|_| hosted_elsewhere) {
        Some(me) => {
            let group = scope.group().unwrap_or(GroupId(0));
            let host = process_of(d.topology.shard_groups, me.serving_processes(), group);
            format!(
                "replica {id} does not host shard group {} of scope {:?}: process {} of \
                 replica {} does",
                group.0,
                scope.as_str(),
                process_id(me.of.as_str(), host),
                me.of
            )
        }
        None => format!(
            "placement policy {:?} does not allow replica {id} to serve this row",
            scope.as_str()
        ),
    };
    Failure::new(Code::PolicyForbids, why)
}

/// The scope a prefix scan answers for: the prefix's own when it fixes the
/// shard group, else the first group of the prefix's policy this process hosts
/// (a replica of many processes answers a scan one process at a time, the
/// client merging them; docs/sharding.md). Refuses as [`scope_here`] does.
fn scan_scope(shared: &Shared, table: &str, prefix: &[u8]) -> Result<ScopeId, Failure> {
    let d = shared.deployment();
    if d.prefix_group(table, prefix).is_some() {
        return scope_here(shared, table, prefix, false);
    }
    known_table(&d, table)?;
    let scope = shared.scope_of(table, prefix);
    let hosted = d
        .placement
        .policies
        .get(scope.policy())
        .and_then(|p| p.scopes().iter().find(|s| d.answers(&shared.id, s, false)));
    match hosted {
        Some(s) => Ok(s.clone()),
        None => Err(not_here(&d, &shared.id, &scope)),
    }
}

/// Checks the consistency asked for against our durable watermarks.
fn admit(
    shared: &Shared,
    scope: &ScopeId,
    c: &Consistency,
) -> Result<Arc<PublishedWatermarks>, Failure> {
    let d = shared.deployment();
    let vouching = vouching_scope(scope, c, |s| d.allowed(&shared.id, s));
    let wm = shared.watermarks_of(vouching);
    // A token of a process a resize retired from its scope is covered here.
    let c = match c {
        Consistency::Watermark(t) if pangea_core::read::retired_origin(&d, t) => {
            &Consistency::Eventual
        }
        c => c,
    };
    match decide(c, &wm, shared.clock.now().wall_ms) {
        Decision::Serve => Ok(wm),
        Decision::NotCovered { origin, have, need } => Err(Failure {
            watermarks: Some(wm),
            ..Failure::new(
                Code::NotCovered,
                format!(
                    "replica {} has applied {origin}'s writes up to #{have}, the token needs #{need}",
                    shared.id
                ),
            )
        }),
        Decision::TooStale { lag_ms, max_ms } => Err(Failure {
            watermarks: Some(wm),
            ..Failure::new(
                Code::TooStale,
                format!("replica {} lags {lag_ms} ms, bound {max_ms} ms", shared.id),
            )
        }),
    }
}

async fn read_row(
    shared: &Shared,
    table: &str,
    key: &Bytes,
    f: &ReadFilter,
) -> Result<Option<pb::Row>, Failure> {
    let d = shared.deployment();
    let row = shared
        .store_row(table, key)
        .await
        .map_err(|e| Failure::new(Code::Unavailable, pangea_core::Chain(&e).to_string()))?;
    Ok(row.and_then(|r| {
        r.read(
            key,
            f,
            d.placement.schema.table(table),
            shared.clock.now().wall_ms,
        )
    }))
}

/// A point read of the newest version of every cell, answered from the row's
/// encoded answer, which the row cache keeps until the row changes.
async fn read_row_encoded(
    shared: &Shared,
    table: &str,
    key: &Bytes,
) -> Result<Option<Bytes>, Failure> {
    let (d, generation) = shared.deployed.deployment_and_generation();
    let row = shared
        .store_row(table, key)
        .await
        .map_err(|e| Failure::new(Code::Unavailable, pangea_core::Chain(&e).to_string()))?;
    Ok(row.and_then(|r| {
        r.latest_encoded(
            key,
            d.placement.schema.table(table),
            shared.clock.now().wall_ms,
            generation,
        )
    }))
}

type Served = (Body, Option<Arc<PublishedWatermarks>>);

/// One page of a scan (`ScanPrefixRequest`): rows under the prefix and in the
/// range, forward or back, past the resume key; filtered, sampled, bounded in
/// rows and bytes (docs/protocol.md "Scan prefix").
/// Most changes in one answer of a change stream (`limit` 0 or above it).
const CHANGES_PAGE_MAX: usize = 1_000;
/// Most log entries one answer looks at, and most mutation bytes it carries
/// (at least one change whatever its size: a row is at most 16 MiB).
const CHANGES_SCAN_MAX: usize = 20_000;
const CHANGES_BYTES_MAX: usize = 4 << 20;

/// A page of a table's change stream (`pangea_core::changes`): the scopes this
/// process answers for that the caller's app profile may read (data residency:
/// a scope it may not read is passed over, as the watermarks request does),
/// each origin's stream from the cursor up to what this replica holds durably.
fn changes(
    shared: &Shared,
    caller: &Principal,
    limits: &Limits,
    c: pb::ChangesRequest,
) -> Result<(pb::ChangesResponse, pangea_core::changes::Cursor), Failure> {
    use pangea_core::changes::{ChangesError, Cursor, Query, Stream};
    key_within(limits, &c.prefix, "prefix")?;
    let d = shared.deployment();
    known_table(&d, &c.table)?;
    if d.placement
        .schema
        .table(&c.table)
        .and_then(|t| t.change_retention_ms)
        .is_none()
    {
        return Err(Failure::new(
            Code::InvalidArgument,
            format!(
                "table {:?} has no change stream: give it `changes = {{ retention = \"24h\" }}` \
                 in the placement file",
                c.table
            ),
        ));
    }
    let from = match c.cursor.is_empty() {
        true => None,
        false => Some(
            Cursor::decode(&c.cursor)
                .map_err(|e| Failure::new(Code::InvalidArgument, format!("cursor: {e}")))?,
        ),
    };
    let streams: Vec<Stream> = shared
        .published
        .watermarks()
        .values()
        .filter(|w| d.answers(&shared.id, &w.scope, false))
        .filter(|w| auth::authorize_rows(&d, caller, &w.scope).is_ok())
        .flat_map(|w| Stream::of(w))
        .collect();
    let from = match from {
        Some(cursor) => cursor,
        None if c.from_earliest => Cursor::default(),
        None => Cursor::at(&streams),
    };
    let q = Query {
        table: &c.table,
        prefix: &c.prefix,
        limit: match c.limit as usize {
            0 => CHANGES_PAGE_MAX,
            n => n.min(CHANGES_PAGE_MAX),
        },
        scan_max: CHANGES_SCAN_MAX,
        bytes_max: CHANGES_BYTES_MAX,
    };
    let page = shared
        .read_changes(&streams, &from, &q)
        .map_err(|e| match e {
            ChangesError::Expired { .. } => {
                Failure::new(Code::CursorExpired, format!("replica {}: {e}", shared.id))
            }
            ChangesError::Storage(e) => Failure::from(CoreError::from(e)),
        })?;
    Ok((page.to_proto(), from))
}

/// Registers the caller's change-stream reader `name` at `cursor` (where its
/// page began: what it has handled): this replica keeps the log after it.
/// Loaders only — a registration makes every replica it reaches keep log, so
/// a frontend credential may not.
async fn register_reader(
    shared: &Shared,
    caller: &Principal,
    name: String,
    cursor: pangea_core::changes::Cursor,
) -> Result<(), Failure> {
    if !matches!(caller, Principal::Loader { .. }) {
        return Err(Failure::new(
            Code::PolicyForbids,
            format!(
                "{} {} may not register change-stream reader {name:?}: a loader certificate \
                 is needed (readers make replicas keep their log)",
                caller.kind(),
                caller.name()
            ),
        ));
    }
    let (reply, answer) = tokio::sync::oneshot::channel();
    let gone = || Failure::new(Code::Unavailable, "the replica is stopping".to_owned());
    shared
        .driver
        .send(Input::RegisterReader {
            name,
            cursor,
            reply,
        })
        .await
        .map_err(|_| gone())?;
    answer
        .await
        .map_err(|_| gone())?
        .map_err(|e| Failure::new(Code::InvalidArgument, e))
}

async fn scan(
    shared: &Arc<Shared>,
    caller: &Principal,
    limits: &Limits,
    s: pb::ScanPrefixRequest,
) -> Result<Served, Failure> {
    key_within(limits, &s.prefix, "prefix")?;
    key_within(limits, &s.resume_after, "resume_after")?;
    let scope = scan_scope(shared, &s.table, &s.prefix)?;
    check_rows(shared, caller, &scope)?;
    let c = consistency(s.consistency)?;
    let wm = admit(shared, &scope, &c)?;
    // A prefix that does not fix the partition key reaches every shard
    // group of the policy this process hosts: each must meet the
    // consistency asked for.
    let d = shared.deployment();
    if d.prefix_group(&s.table, &s.prefix).is_none()
        && let Some(policy) = d.placement.policies.get(scope.policy())
    {
        for other in policy
            .scopes()
            .iter()
            .filter(|o| **o != scope && d.answers(&shared.id, o, false))
        {
            admit(shared, other, &c)?;
        }
    }
    let limit = match s.limit as usize {
        0 => SCAN_ROWS_DEFAULT,
        n => n.min(SCAN_ROWS_MAX),
    };
    let f = filter(s.filter)?.under(&c);
    // The keys left to visit: under the prefix, in the range, past the
    // resume key (below it, going down).
    let mut range = BytesRange::prefix(&s.prefix);
    if let Some(r) = s.range {
        let r = BytesRange::from_proto(r);
        for (field, b) in [("range.start", &r.start), ("range.end", &r.end)] {
            if let Bound::Included(k) | Bound::Excluded(k) = b {
                key_within(limits, k, field)?;
            }
        }
        range = range.intersect(&r);
    }
    let reverse = s.reverse;
    let past = |range: &mut BytesRange, key: &Bytes| {
        let rest = if reverse {
            BytesRange {
                start: Bound::Unbounded,
                end: Bound::Excluded(key.clone()),
            }
        } else {
            BytesRange {
                start: Bound::Excluded(key.clone()),
                end: Bound::Unbounded,
            }
        };
        *range = range.intersect(&rest);
    };
    if !s.resume_after.is_empty() {
        past(&mut range, &s.resume_after);
    }
    // A sample keeps the rows whose key hashes below the fraction: the same rows
    // on every replica and every page, so a sample pages and repeats.
    let sample = match s.row_sample {
        0.0 => None,
        p if p > 0.0 && p <= 1.0 => Some(p),
        p => {
            return Err(Failure::new(
                Code::InvalidArgument,
                format!("row_sample: {p} is not a fraction in (0, 1]"),
            ));
        }
    };
    // `limit` counts rows visited; a sampled page counts rows sent, and visits
    // at most SAMPLE_VISIT_MAX.
    let visit_max = if sample.is_some() {
        SAMPLE_VISIT_MAX
    } else {
        limit
    };
    let mut rows = Vec::new();
    let mut last = Bytes::new();
    let now = shared.clock.now().wall_ms;
    let schema = d.placement.schema.table(&s.table);
    let (budget, mut bytes) = (response_bytes(s.max_bytes), 0);
    // Rows are read from the store a few at a time: a page of large rows ends at
    // its bytes long before `limit`, and reads no more than it sends.
    let (mut visited, mut more) = (0, false);
    'page: while visited < visit_max && rows.len() < limit {
        let want = (visit_max - visited).min(SCAN_FETCH_ROWS);
        let found = shared
            .scan_off_thread(s.table.clone(), range.clone(), reverse, want + 1)
            .await
            .map_err(|e| Failure::new(Code::Unavailable, pangea_core::Chain(&e).to_string()))?;
        more = found.len() > want;
        for (key, row) in found.into_iter().take(want) {
            if bytes >= budget || rows.len() >= limit {
                // Full: the page ends, resuming after the last row taken.
                more = true;
                break 'page;
            }
            visited += 1;
            last = key.clone();
            past(&mut range, &key);
            // Rows of a policy this replica may not serve never leave it, nor rows
            // of a policy the caller's app profile does not list.
            let row_scope = shared.scope_of(&s.table, &key);
            if !d.answers(&shared.id, &row_scope, false)
                || auth::authorize_rows(&d, caller, &row_scope).is_err()
                || sample.is_some_and(|p| !pangea_core::filter::in_sample(&key, p))
            {
                continue;
            }
            if let Some(mut r) = row.read(&key, &f, schema, now) {
                if s.keys_only {
                    r.families.clear();
                }
                bytes += r.encoded_len();
                rows.push(r);
            }
        }
        if !more {
            break;
        }
    }
    let resume_key = if more { last } else { Bytes::new() };
    Ok((
        pb::client_response::Response::ScanPrefix(pb::ScanPrefixResponse { rows, resume_key })
            .into(),
        Some(wm),
    ))
}

/// This replica's store against placement: rows it holds that their policy does not
/// allow here (a residency violation; 0 is the only acceptable answer). The bytes in
/// the store are checked, against the placement file's residency as well as the
/// location entries in force: a row a location entry moved outside the regions the
/// file gives it is a violation, whatever `_location` says. Yields to the
/// runtime between pages of the scan: on a single-threaded runtime (`threads = 1`) a
/// scan that never yielded would stall serving and replication until it ended.
async fn audit(shared: &Arc<Shared>) -> Result<pb::AuditResponse, Failure> {
    let d = shared.deployment();
    let files = shared.deployed.files();
    let now_ms = shared.clock.now().wall_ms;
    let mut tables = Vec::new();
    // Every scope allowed here, even with no rows: an empty scope compares too.
    let mut digests: BTreeMap<ScopeId, ContentDigest> = d
        .scopes()
        .filter(|s| d.allowed(&shared.id, s))
        .map(|s| (s.clone(), ContentDigest::new()))
        .collect();
    for table in d.placement.schema.user_tables() {
        let mut t = pb::AuditTable {
            table: table.to_string(),
            ..Default::default()
        };
        let mut rest = BytesRange::ALL;
        loop {
            let rows = shared
                .scan_off_thread(table.to_string(), rest.clone(), false, 10_000)
                .await
                .map_err(|e| Failure::new(Code::Unavailable, pangea_core::Chain(&e).to_string()))?;
            let Some((last, _)) = rows.last() else { break };
            rest.start = Bound::Excluded(last.clone());
            tokio::task::yield_now().await;
            for (key, row) in &rows {
                t.rows += 1;
                let scope = shared.scope_of(table, key);
                digests.entry(scope.clone()).or_default().add(
                    &d.placement.schema,
                    table,
                    key,
                    row,
                    now_ms,
                );
                let allowed = shared
                    .published
                    .with_location(|l| l.audit_allows(&files, &d, &shared.id, table, key));
                if !allowed {
                    t.rows_disallowed += 1;
                    t.bytes_disallowed += (key.len() + row.value_bytes()) as u64;
                }
            }
        }
        tables.push(t);
    }
    use std::sync::atomic::Ordering::Relaxed;
    Ok(pb::AuditResponse {
        replica: shared.id.to_string(),
        region: shared.region.to_string(),
        tables,
        restricted_frames_to_outsiders: shared.residency.to_outsiders.load(Relaxed),
        restricted_frames_from_outsiders: shared.residency.from_outsiders.load(Relaxed),
        scopes: digests
            .into_iter()
            .map(|(scope, digest)| pb::ScopeDigest {
                scope: scope.to_string(),
                rows: digest.rows(),
                digest: digest.finish().to_be_bytes().to_vec().into(),
            })
            .collect(),
    })
}

/// Authorizes a request, runs it, and records it in the audit log if it is one of
/// the audited kinds.
async fn process(
    shared: &Arc<Shared>,
    caller: &Principal,
    req: pb::ClientRequest,
) -> Result<Served, Failure> {
    let Some(action) = auth::action_of(&req) else {
        return Err(Failure::new(Code::InvalidArgument, "empty request"));
    };
    let d = shared.deployment();
    // A table the placement does not define is unknown to everyone (the placement
    // is no secret: every client loads it), before any permission is asked.
    if let Action::Read { table } | Action::Write { table } | Action::Merge { table } = action
        && d.placement.schema.table(table).is_none()
    {
        return Err(Failure::new(
            Code::NotFound,
            format!("unknown table {table:?}"),
        ));
    }
    if let Err(denied) = auth::authorize(&d, caller, &action) {
        if audited(&action, true) {
            let target = audit_target(&req);
            shared.audit.record(
                caller,
                action.as_str(),
                &target,
                Outcome::Denied,
                &denied.missing,
            );
        }
        return Err(Failure::denied(denied));
    }
    let audit = audited(&action, false).then(|| (action.as_str(), audit_target(&req)));
    let result = match &audit {
        // An audited action runs in a span of its own (who, what, outcome), a
        // child of the request's.
        Some((action, target)) => {
            let span = tracing::info_span!(
                "pangea.audit",
                principal = %caller,
                action,
                target = %target,
                outcome = tracing::field::Empty,
            );
            let r =
                tracing::Instrument::instrument(execute(shared, caller, req), span.clone()).await;
            span.record("outcome", if r.is_ok() { "ok" } else { "refused" });
            r
        }
        None => execute(shared, caller, req).await,
    };
    if let Some((action, target)) = audit {
        use pb::client_response::Response as W;
        let (outcome, detail) = match &result {
            Ok((Body::Message(W::PlacementMove(m)), _)) => {
                (Outcome::Ok, format!("job {}", m.job_id))
            }
            Ok((Body::Message(W::Reload(r)), _)) => (Outcome::Ok, r.changes.join("; ")),
            // A batch of merges: denied when any row was refused, naming the first.
            Ok((Body::Message(W::MutateRows(r)), _)) => {
                let applied = r.rows.iter().filter(|o| o.error.is_none()).count();
                let summary = format!("{applied} of {} rows applied", r.rows.len());
                let refused = r
                    .rows
                    .iter()
                    .enumerate()
                    .find_map(|(n, o)| Some((n, o.error.as_ref()?)));
                match refused {
                    None => (Outcome::Ok, summary),
                    Some((n, e)) => (
                        Outcome::Denied,
                        format!("{summary}; row {n} refused: {}", e.message),
                    ),
                }
            }
            Ok(_) => (Outcome::Ok, String::new()),
            Err(f) if f.code == Code::PolicyForbids || f.code == Code::InvalidArgument => {
                (Outcome::Denied, f.message.clone())
            }
            Err(f) => (Outcome::Failed, f.message.clone()),
        };
        shared
            .audit
            .record(caller, action, &target, outcome, &detail);
    }
    result
}

/// How many regions besides this one a write asked to wait for
/// (`MutateRequest::wait_regions`, `wait_all_regions`), checked against the regions
/// the row's placement policy spans before anything is written.
fn regions_to_wait_for(
    shared: &Shared,
    d: &Deployment,
    scope: &ScopeId,
    (asked, all): &(u32, bool),
) -> Result<usize, Failure> {
    if *asked == 0 && !*all {
        return Ok(0);
    }
    let others: BTreeSet<&RegionId> = d
        .topology
        .replicas
        .values()
        .filter(|r| r.role.stores_rows() && r.region != shared.region && d.allowed(&r.id, scope))
        .map(|r| &r.region)
        .collect();
    if *all {
        return Ok(others.len());
    }
    if *asked as usize > others.len() {
        return Err(Failure::new(
            Code::InvalidArgument,
            format!(
                "wait_regions {asked}: policy {scope} spans {} region(s) besides {} ({})",
                others.len(),
                shared.region,
                others
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Ok(*asked as usize)
}

/// Waits until replicas in `regions` regions besides this one have durably applied
/// the write `token` names (their applied-watermark reports, which the driver asks
/// for at once), or until `until`: then `NotReplicated`, naming where it has been
/// applied and where not yet, with the token.
async fn wait_for_regions(
    shared: &Shared,
    token: &Token,
    regions: usize,
    until: Instant,
) -> Result<(), Failure> {
    loop {
        // Armed before asking: a report between the answer and the wait wakes it.
        let heard = shared.published.heartbeats_heard().notified();
        tokio::pin!(heard);
        heard.as_mut().enable();
        let (reply, answer) = oneshot::channel();
        let asked = crate::driver::Input::RegionsApplied {
            scope: token.scope.clone(),
            sequence: token.sequence,
            reply,
        };
        // The write is durable here already: not UNAVAILABLE (not applied).
        let gone = || Failure {
            token: Some(token.clone()),
            ..Failure::new(
                Code::NotReplicated,
                format!(
                    "write {}#{} is durable at {}, which is shutting down before it \
                     heard where else it was applied",
                    token.origin, token.sequence, shared.id
                ),
            )
        };
        shared.driver_writes.send(asked).await.map_err(|_| gone())?;
        let (mut reached, all) = answer.await.map_err(|_| gone())?.unwrap_or_default();
        reached.remove(&shared.region);
        if reached.len() >= regions {
            return Ok(());
        }
        tokio::select! {
            () = &mut heard => {}
            () = tokio::time::sleep_until(until.into()) => {
                let not_yet: Vec<&str> = all
                    .iter()
                    .filter(|r| **r != shared.region && !reached.contains(*r))
                    .map(|r| r.as_str())
                    .collect();
                let reached: Vec<&str> = reached.iter().map(|r| r.as_str()).collect();
                return Err(Failure {
                    token: Some(token.clone()),
                    ..Failure::new(
                        Code::NotReplicated,
                        format!(
                            "write {}#{} is durable at {} and replicating, but by the \
                             deadline it was applied in {} of the {regions} other region(s) \
                             asked: applied in [{}], not yet in [{}]",
                            token.origin,
                            token.sequence,
                            shared.id,
                            reached.len(),
                            reached.join(", "),
                            not_yet.join(", ")
                        ),
                    )
                });
            }
        }
    }
}

/// When a write's answer must leave to reach the client before its deadline: a
/// margin before it, so the client learns how far the write got.
fn answer_by(received: Instant, deadline: Duration) -> Instant {
    let margin = (deadline / 10).min(Duration::from_millis(5));
    received + deadline.saturating_sub(margin)
}

/// A full disk (or a store being reopened) refuses writes at once: the client
/// writes at another replica.
fn refuse_writes_if_disk_refuses(shared: &Shared) -> Result<(), Failure> {
    match shared.disk.refusal() {
        Some(state) => Err(Failure::new(
            Code::Unavailable,
            format!("replica {}: {state}; write at another replica", shared.id),
        )),
        None => Ok(()),
    }
}

/// A client's row mutation, checked for this replica.
struct Admitted {
    mutation: RowMutation,
    scope: ScopeId,
}

/// Checks a client's row mutation before anything of it is written: limits, the
/// schema, a loader's merges, residency (`scope_here`) and the caller's rows.
fn admit_write(
    shared: &Shared,
    caller: &Principal,
    d: &Deployment,
    limits: &Limits,
    m: pb::RowMutation,
) -> Result<Admitted, Failure> {
    auth::check_merge_keys(&m).map_err(|e| Failure::new(Code::InvalidArgument, e))?;
    let mutation = RowMutation::from_proto(m, limits)?;
    mutation.check_schema(&d.placement.schema)?;
    for x in mutation.mutations() {
        if let pangea_core::Mutation::MergeRow(row) = x {
            auth::check_merge(
                d,
                row,
                shared.clock.now().wall_ms,
                auth::MergeWindow::DEFAULT,
            )
            .map_err(|e| Failure::new(Code::InvalidArgument, format!("MergeRow refused: {e}")))?;
        }
    }
    let scope = scope_here(shared, mutation.table(), mutation.row_key(), true)?;
    check_rows(shared, caller, &scope)?;
    Ok(Admitted { mutation, scope })
}

/// A write handed to the driver; its outcome comes once it is durable.
type Proposed = oneshot::Receiver<Result<Token, Unacked>>;

/// Hands a checked write to the driver. An error means it was not handed over.
async fn propose(shared: &Shared, mutation: RowMutation) -> Result<Proposed, Failure> {
    let (reply, wait) = oneshot::channel();
    shared
        .driver_writes
        .send(Input::Propose { mutation, reply })
        .await
        .map_err(|_| Failure::new(Code::Unavailable, "replica is shutting down"))?;
    Ok(wait)
}

/// A proposed write's token once it is durable. UNAVAILABLE tells the client the
/// write was not applied; when that is not known, DEADLINE_EXCEEDED
/// (docs/protocol.md, §4).
async fn outcome_of(shared: &Shared, wait: Proposed) -> Result<Token, Failure> {
    match wait.await {
        Ok(Ok(token)) => Ok(token),
        Ok(Err(Unacked::Refused(e))) => Err(e.into()),
        Ok(Err(Unacked::Unknown(e))) => Err(unknown_outcome(
            shared,
            format!(
                "the store failed while making it durable: {}",
                pangea_core::Chain(&e)
            ),
        )),
        Err(_) => Err(unknown_outcome(shared, "it is shutting down".to_owned())),
    }
}

fn unknown_outcome(shared: &Shared, why: String) -> Failure {
    Failure::new(
        Code::DeadlineExceeded,
        format!("replica {} stopped waiting for the write: {why}", shared.id),
    )
}

/// A batch write (`MutateRows`): every row checked alone, the rows that pass
/// handed to the driver in order before any is waited for (they share its group
/// commits), then each row's outcome; a row not durable by `until` is unknown
/// (DEADLINE_EXCEEDED), so the answer always comes in time.
async fn mutate_rows(
    shared: &Shared,
    caller: &Principal,
    limits: &Limits,
    b: pb::MutateRowsRequest,
    until: Instant,
) -> Result<pb::MutateRowsResponse, Failure> {
    Limits::check(
        pangea_core::limits::Limited::BatchRows,
        b.rows.len(),
        limits.batch_rows_max,
    )
    .map_err(|e| Failure::new(Code::InvalidArgument, e.to_string()))?;
    refuse_writes_if_disk_refuses(shared)?;
    let d = shared.deployment();
    let wait = (b.wait_regions, b.wait_all_regions);
    let mut pending = Vec::with_capacity(b.rows.len());
    // Once one row could not be queued in time, the rest are not tried.
    let mut queue_full = false;
    for mut row in b.rows {
        if row.table.is_empty() {
            row.table.clone_from(&b.table);
        }
        if row.table != b.table && row.table.starts_with('_') {
            // Audited as a refused write of a system table sent alone.
            shared.audit.record(
                caller,
                "write",
                &format!("{} (in a batch of {})", row.table, b.table),
                Outcome::Denied,
                "a batch writes one table",
            );
        }
        let admitted = if queue_full {
            Err(Failure::new(
                Code::Unavailable,
                format!(
                    "replica {} could not queue the batch by the deadline",
                    shared.id
                ),
            ))
        } else if row.table == b.table {
            admit_write(shared, caller, &d, limits, row).and_then(|w| {
                let regions = regions_to_wait_for(shared, &d, &w.scope, &wait)?;
                Ok((w, regions))
            })
        } else {
            Err(Failure::new(
                Code::InvalidArgument,
                format!(
                    "row of table {:?} in a batch of table {:?}: a batch writes one table",
                    row.table, b.table
                ),
            ))
        };
        pending.push(match admitted {
            Ok((w, regions)) => {
                match tokio::time::timeout_at(until.into(), propose(shared, w.mutation)).await {
                    Ok(proposed) => proposed.map(|p| (p, regions)),
                    Err(_) => {
                        queue_full = true;
                        Err(Failure::new(
                            Code::Unavailable,
                            format!(
                                "replica {} could not queue the batch by the deadline",
                                shared.id
                            ),
                        ))
                    }
                }
            }
            Err(f) => Err(f),
        });
    }
    let mut rows = Vec::with_capacity(pending.len());
    for p in pending {
        let outcome = match p {
            Ok((proposed, regions)) => {
                match tokio::time::timeout_at(until.into(), outcome_of(shared, proposed)).await {
                    Ok(Ok(token)) if regions > 0 => {
                        let waited = wait_for_regions(shared, &token, regions, until);
                        match tokio::time::timeout_at(until.into(), waited).await {
                            Ok(done) => done.map(|()| token),
                            Err(_) => Err(Failure {
                                token: Some(token.clone()),
                                ..Failure::new(
                                    Code::NotReplicated,
                                    format!(
                                        "write {}#{} is durable at {}; by the deadline it \
                                         had not heard where else it was applied",
                                        token.origin, token.sequence, shared.id
                                    ),
                                )
                            }),
                        }
                    }
                    Ok(done) => done,
                    Err(_) => Err(unknown_outcome(
                        shared,
                        "it was not durable by the deadline".to_owned(),
                    )),
                }
            }
            Err(f) => Err(f),
        };
        rows.push(match outcome {
            Ok(token) => pb::RowOutcome {
                token: token.encode(),
                error: None,
            },
            Err(f) => pb::RowOutcome {
                token: Bytes::new(),
                error: Some(f.into_proto()),
            },
        });
    }
    Ok(pb::MutateRowsResponse { rows })
}

/// Runs an authorized request.
async fn execute(
    shared: &Arc<Shared>,
    caller: &Principal,
    req: pb::ClientRequest,
) -> Result<Served, Failure> {
    use pb::client_request::Request as R;
    use pb::client_response::Response as W;
    let received = Instant::now();
    // Data requests obey the app profile's routing (priority class, pinned
    // replicas); watermark probes and operator requests are not routed by it.
    if !matches!(
        req.request,
        Some(
            R::Watermarks(_) | R::Deployment(_) | R::Audit(_) | R::PlacementMove(_) | R::Reload(_)
        )
    ) {
        check_profile(shared, caller, &req.app_profile)?;
    }
    // A replica still catching up after its start refuses reads: the client asks
    // the next candidate (readiness.rs).
    if matches!(
        req.request,
        Some(R::Get(_) | R::GetMany(_) | R::ScanPrefix(_) | R::LocationChanges(_) | R::Changes(_))
    ) {
        let phase = shared.phase();
        if phase != crate::readiness::Phase::Ready {
            return Err(Failure::new(
                Code::Unavailable,
                format!("replica {} is not serving reads yet: {phase}", shared.id),
            ));
        }
    }
    let limits: Limits = shared.core_limits;
    let deadline = match req.deadline_us {
        0 => DEFAULT_DEADLINE,
        us => Duration::from_micros(us),
    };
    match req
        .request
        .ok_or_else(|| Failure::new(Code::InvalidArgument, "empty request"))?
    {
        R::Get(g) => {
            key_within(&limits, &g.row_key, "row_key")?;
            let scope = scope_here(shared, &g.table, &g.row_key, false)?;
            check_rows(shared, caller, &scope)?;
            let c = consistency(g.consistency)?;
            let wm = admit(shared, &scope, &c)?;
            let f = filter(g.filter)?.under(&c);
            if f.is_latest() {
                let row = read_row_encoded(shared, &g.table, &g.row_key).await?;
                return Ok((Body::EncodedRow(row), Some(wm)));
            }
            let row = read_row(shared, &g.table, &g.row_key, &f).await?;
            Ok((W::Get(pb::GetResponse { row }).into(), Some(wm)))
        }
        R::GetMany(g) => {
            if g.row_keys.len() > GET_MANY_KEYS_MAX {
                return Err(Failure::new(
                    Code::InvalidArgument,
                    format!("{} keys, limit {GET_MANY_KEYS_MAX}", g.row_keys.len()),
                ));
            }
            for (i, key) in g.row_keys.iter().enumerate() {
                key_within(&limits, key, &format!("row_keys[{i}]"))?;
            }
            let c = consistency(g.consistency)?;
            let f = filter(g.filter)?.under(&c);
            let mut scope: Option<ScopeId> = None;
            // Other shard groups of the first key's policy, admitted.
            let mut groups: Vec<ScopeId> = Vec::new();
            let mut rows = Vec::with_capacity(g.row_keys.len());
            let mut wm = None;
            let budget = response_bytes(g.max_bytes);
            let mut bytes = 0;
            for key in &g.row_keys {
                // Full: the client asks again for the keys not answered.
                if bytes >= budget {
                    break;
                }
                let s = scope_here(shared, &g.table, key, false)?;
                match &scope {
                    Some(first) if first.policy() != s.policy() => {
                        return Err(Failure::new(
                            Code::InvalidArgument,
                            "get-many keys span placement policies; split the request by policy",
                        ));
                    }
                    // Another shard group of the policy: its own watermarks
                    // must meet the consistency asked for too (once a group).
                    Some(first) if *first != s && !groups.contains(&s) => {
                        admit(shared, &s, &c)?;
                        groups.push(s);
                    }
                    Some(_) => {}
                    None => {
                        check_rows(shared, caller, &s)?;
                        wm = Some(admit(shared, &s, &c)?);
                        scope = Some(s);
                    }
                }
                let row = read_row(shared, &g.table, key, &f)
                    .await?
                    .unwrap_or_else(|| pb::Row {
                        key: key.clone(),
                        families: vec![],
                    });
                bytes += row.encoded_len();
                rows.push(row);
            }
            Ok((W::GetMany(pb::GetManyResponse { rows }).into(), wm))
        }
        R::ScanPrefix(s) => scan(shared, caller, &limits, s).await,
        R::Mutate(m) => {
            refuse_writes_if_disk_refuses(shared)?;
            let wait = (m.wait_regions, m.wait_all_regions);
            let m = m
                .mutation
                .ok_or_else(|| Failure::new(Code::InvalidArgument, "mutate without a mutation"))?;
            let d = shared.deployment();
            let write = admit_write(shared, caller, &d, &limits, m)?;
            let wait_regions = regions_to_wait_for(shared, &d, &write.scope, &wait)?;
            let token = outcome_of(shared, propose(shared, write.mutation).await?).await?;
            if wait_regions > 0 {
                wait_for_regions(shared, &token, wait_regions, answer_by(received, deadline))
                    .await?;
            }
            let wm = shared.watermarks_of(&write.scope);
            Ok((
                W::Mutate(pb::MutateResponse {
                    token: token.encode(),
                })
                .into(),
                Some(wm),
            ))
        }
        R::MutateRows(b) => Ok((
            W::MutateRows(
                mutate_rows(shared, caller, &limits, b, answer_by(received, deadline)).await?,
            )
            .into(),
            None,
        )),
        R::PlacementMove(m) => {
            let id = crate::migration::start(shared, m.table, m.prefix, m.to_policy, m.home_region)
                .await
                .map_err(|e| Failure::new(Code::InvalidArgument, e))?;
            Ok((
                W::PlacementMove(pb::PlacementMoveResponse { job_id: id }).into(),
                None,
            ))
        }
        R::Audit(_) => Ok((W::Audit(audit(shared).await?).into(), None)),
        R::Reload(_) => {
            crate::reload::reload_certificates(shared);
            let changes = crate::reload::reload(shared)
                .await
                .map_err(|e| Failure::new(Code::InvalidArgument, e))?;
            Ok((W::Reload(pb::ReloadResponse { changes }).into(), None))
        }
        R::Changes(mut c) => {
            let reader = std::mem::take(&mut c.reader);
            // The log is read from fjall, on a blocking thread (`Shared::store_row`).
            let (page, from) = {
                let (shared, caller) = (shared.clone(), caller.clone());
                tokio::task::spawn_blocking(move || changes(&shared, &caller, &limits, c))
                    .await
                    .map_err(|e| {
                        Failure::new(Code::Unavailable, format!("reading changes: {e}"))
                    })??
            };
            if !reader.is_empty() {
                register_reader(shared, caller, reader, from).await?;
            }
            Ok((W::Changes(page).into(), None))
        }
        R::LocationChanges(r) => {
            let page = shared
                .published
                .with_location(|l| pangea_core::location::changes_page(l, &r.cursor, r.limit));
            Ok((W::LocationChanges(page).into(), None))
        }
        R::Deployment(_) => {
            let s = shared.deployed.sources();
            let files = pb::DeploymentResponse {
                topology: s.topology.clone(),
                placement: s.placement.clone().unwrap_or_default(),
                digest: s.digest,
            };
            Ok((W::Deployment(files).into(), None))
        }
        R::Watermarks(w) => {
            let all = shared.published.watermarks();
            // A data principal sees the scopes its app profile may read.
            let d = shared.deployment();
            let scopes = all
                .values()
                .filter(|s| w.scope.is_empty() || s.scope.as_str() == w.scope)
                .filter(|s| auth::authorize_rows(&d, caller, &s.scope).is_ok())
                .map(|s| s.to_proto())
                .collect();
            Ok((W::Watermarks(pb::WatermarkResponse { scopes }).into(), None))
        }
    }
}
