//! The admin HTTP endpoint: `GET /metrics`, `GET /health`, `GET /watermarks`.
//!
//! Why a separate endpoint: Prometheus scrapes, load balancers probe health and
//! operators look at watermarks over plain HTTP, while replicas and clients speak
//! QUIC with mutual TLS. This is a bare hyper HTTP/1 server on its own TCP listener,
//! so it shares nothing with the serving path but the [`AdminState`] it reads.
//!
//! Shape (mini-redis's `run(listener, shutdown)`): [`serve`] accepts connections
//! until `shutdown` resolves, runs one task per connection, and caps concurrent
//! connections with a semaphore ([`ADMIN_CONNECTIONS_MAX`]): at the cap it stops
//! accepting, so extra connections wait in the kernel backlog instead of costing
//! memory. Every connection has bounds (header read time, buffer size, lifetime), so
//! a slow or idle client cannot hold a permit forever. On shutdown it stops
//! accepting, asks open connections to finish their current response and close, and
//! returns after at most [`SHUTDOWN_DRAIN_MAX`].
//!
//! Routes: a known path with a method other than GET is 405 (with `Allow: GET`); an
//! unknown path is 404 whatever the method. The `/fault` routes (drills, see
//! [`crate::fault`]) answer 403 unless the replica runs with fault injection; their
//! changes are POSTs with the parameters in the query string. Nothing here reads a
//! request body, and malformed requests are answered (or dropped) by hyper; nothing
//! panics on input.
//!
//! What the endpoint shows is what [`AdminState`] returns: the implementation must
//! keep user keys and values out of it, as out of metrics (DESIGN.md principle 5).

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use crate::fault::FaultError;
use crate::metrics::OPENMETRICS_CONTENT_TYPE;

/// Most admin connections served at once. Scrapers and probes open a handful; the
/// cap keeps a misbehaving client from taking memory or tasks from the replica.
pub const ADMIN_CONNECTIONS_MAX: usize = 64;

/// Longest time a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest life of one admin connection (keep-alive included). When it is reached
/// the connection finishes its current response and closes; a scraper reconnects.
pub const CONNECTION_LIFETIME_MAX: Duration = Duration::from_secs(60);

/// Longest time [`serve`] waits, after `shutdown` resolved, for open connections to
/// finish their responses; then they are dropped.
pub const SHUTDOWN_DRAIN_MAX: Duration = Duration::from_secs(5);

/// Read buffer per connection (hyper's minimum is 8 KiB): bounds the request head.
pub const CONNECTION_BUFFER_BYTES_MAX: usize = 16 * 1024;

/// Pause after a failed `accept` (e.g. out of file descriptors) before retrying, so
/// the loop does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

const JSON_CONTENT_TYPE: &str = "application/json";
const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// What the admin endpoint reads from the replica. Called on the admin connection's
/// task: implementations must be quick and must not block on the serving path.
pub trait AdminState: Send + Sync + 'static {
    /// The OpenMetrics exposition (usually [`crate::metrics::NodeMetrics::encode`]).
    fn metrics_text(&self) -> String;
    /// Whether the replica is healthy; `/health` answers 200 if so, else 503.
    fn health(&self) -> Health;
    /// The replica's watermarks (operator names and numbers only).
    fn watermarks(&self) -> Watermarks;
    /// A `/fault` route (`action` is the path after `/fault`, `query` the query
    /// string): drills only, see [`crate::fault`]. By default fault injection is off.
    fn fault(&self, action: &str, query: &str) -> Result<serde_json::Value, FaultError> {
        let _ = (action, query);
        Err(FaultError::Disabled)
    }
}

/// The body of `/health`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// Whether the replica can serve: the HTTP status is 200 if true, 503 if not, so a
    /// load balancer needs only the status.
    pub ok: bool,
    /// The replica id, so a probe through a load balancer knows who answered.
    pub replica: String,
    /// The replica's region.
    pub region: String,
    /// Free-form detail for operators (why it is unhealthy, peers suspected, ...).
    pub detail: serde_json::Value,
}

/// The body of `/watermarks`: how far this replica has durably applied each
/// origin's stream, per scope.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Watermarks {
    pub replica: String,
    pub region: String,
    pub scopes: Vec<ScopeMarks>,
    /// Apply lag per origin over recent writes (`lag::ApplyLag::summary`).
    pub apply_lag: serde_json::Value,
}

/// One scope's watermarks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScopeMarks {
    pub scope: String,
    /// The lowest origin watermark's hybrid timestamp, and its age on this
    /// replica's clock.
    pub low_watermark: u64,
    pub low_watermark_age_ms: u64,
    /// By origin replica id.
    pub origins: std::collections::BTreeMap<String, OriginMark>,
}

/// How far one origin's stream is applied.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OriginMark {
    pub sequence: u64,
    /// The hybrid timestamp of the write at `sequence`, and its age.
    pub timestamp: u64,
    pub lag_ms: u64,
}

impl Watermarks {
    /// Per scope, the sequence of `origin`'s stream applied here (0 where none).
    pub fn sequences_of(&self, origin: &str) -> std::collections::BTreeMap<String, u64> {
        self.scopes
            .iter()
            .map(|s| {
                let seq = s.origins.get(origin).map_or(0, |o| o.sequence);
                (s.scope.clone(), seq)
            })
            .collect()
    }
}

/// Serves the admin endpoint on `listener` until `shutdown` resolves, then stops
/// accepting, lets open connections finish their current response for at most
/// [`SHUTDOWN_DRAIN_MAX`], and returns.
///
/// Failed `accept` calls (a client that reset, no file descriptors left) are logged
/// and retried after a pause: they never end the endpoint. The `Result` is for
/// errors that should end it; there are none today.
pub async fn serve(
    listener: TcpListener,
    state: Arc<dyn AdminState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut shutdown = pin!(shutdown);
    let permits = Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX));
    // Tells connection tasks to shut down gracefully; they watch for a change.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();

    loop {
        // Reap finished connection tasks so the set stays as small as the open
        // connections (at most ADMIN_CONNECTIONS_MAX).
        while let Some(done) = connections.try_join_next() {
            log_join(done);
        }

        // A permit first: at the cap, stop accepting (mini-redis does the same).
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => {
                // Invariant: `permits` is owned here and never closed.
                permit.expect("the admin connection semaphore is never closed")
            }
        };

        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let state = Arc::clone(&state);
                let stop_rx = stop_rx.clone();
                connections.spawn(async move {
                    tracing::debug!(%peer, "admin connection");
                    serve_connection(stream, state, stop_rx, permit).await;
                });
            }
            Err(error) => {
                drop(permit);
                tracing::warn!(%error, "admin endpoint: accept failed; retrying");
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                }
            }
        }
    }

    // Stop accepting before draining, so no connection arrives that we would ignore.
    drop(listener);
    // Receivers see the change even if a task has not started to watch yet.
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_DRAIN_MAX, async {
        while let Some(done) = connections.join_next().await {
            log_join(done);
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "admin endpoint: connections still open after the drain time; dropping them"
        );
        connections.shutdown().await;
    }
    Ok(())
}

fn log_join(done: Result<(), tokio::task::JoinError>) {
    // A panic is an `AdminState` implementation's: in a debug build that connection
    // is lost and the endpoint goes on (release builds abort on a panic, fail-stop:
    // Cargo.toml). Cancellation only happens when a drain times out.
    if let Err(error) = done
        && error.is_panic()
    {
        tracing::error!(%error, "admin connection task panicked");
    }
}

/// Drives one HTTP/1 connection until it closes, its lifetime runs out, or the
/// endpoint shuts down. Holds `_permit` for as long as the connection is open.
async fn serve_connection(
    stream: TcpStream,
    state: Arc<dyn AdminState>,
    mut stop_rx: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let service = service_fn(move |request: Request<Incoming>| {
        let response = route(state.as_ref(), &request);
        async move { Ok::<_, Infallible>(response) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(CONNECTION_BUFFER_BYTES_MAX)
        .keep_alive(true);
    let mut connection = pin!(builder.serve_connection(TokioIo::new(stream), service));
    let mut lifetime = pin!(tokio::time::sleep(CONNECTION_LIFETIME_MAX));
    // After a graceful shutdown was asked for, only the connection is polled: the
    // stop channel would report its (closed) state again at once.
    let mut closing = *stop_rx.borrow_and_update();
    if closing {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    // Malformed requests, header timeouts, resets: the client's problem.
                    tracing::debug!(%error, "admin connection ended with an error");
                }
                return;
            }
            _ = stop_rx.changed(), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
            () = &mut lifetime, if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The response to one request. Never fails: every error is a status code.
fn route(state: &dyn AdminState, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if let Some(action) = path.strip_prefix("/fault")
        && (action.is_empty() || action.starts_with('/'))
    {
        return fault(state, request, action);
    }
    let known = matches!(path, "/metrics" | "/health" | "/watermarks");
    if !known {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if request.method() != Method::GET {
        return method_not_allowed("GET");
    }
    match path {
        "/metrics" => respond(
            StatusCode::OK,
            OPENMETRICS_CONTENT_TYPE,
            state.metrics_text(),
        ),
        "/health" => {
            let health = state.health();
            let status = if health.ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json(status, &health)
        }
        _ => json(StatusCode::OK, &state.watermarks()),
    }
}

fn method_not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// `GET /fault` shows the injected faults; `POST /fault/{link,clock,heal}` changes
/// them (parameters in the query string, no body). 403 when fault injection is off.
fn fault(
    state: &dyn AdminState,
    request: &Request<Incoming>,
    action: &str,
) -> Response<Full<Bytes>> {
    let expected = if action.is_empty() {
        Method::GET
    } else {
        Method::POST
    };
    if request.method() != expected {
        return method_not_allowed(if action.is_empty() { "GET" } else { "POST" });
    }
    match state.fault(action, request.uri().query().unwrap_or("")) {
        Ok(body) => json(StatusCode::OK, &body),
        Err(FaultError::Disabled) => text(
            StatusCode::FORBIDDEN,
            "fault injection is off on this replica (start it with --fault-injection)\n",
        ),
        Err(FaultError::BadRequest(message)) => respond(
            StatusCode::BAD_REQUEST,
            TEXT_CONTENT_TYPE,
            format!("{message}\n"),
        ),
    }
}

fn json(status: StatusCode, body: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(body) {
        Ok(mut bytes) => {
            bytes.push(b'\n');
            respond(status, JSON_CONTENT_TYPE, bytes)
        }
        // Only a map with non-string keys fails to serialize, which a `Value`
        // cannot hold; answer 500 rather than trust that.
        Err(error) => {
            tracing::error!(%error, "admin endpoint: serializing a JSON body failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
        }
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    respond(status, TEXT_CONTENT_TYPE, body)
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Health and watermarks change by the second; a cache must not serve old ones.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
