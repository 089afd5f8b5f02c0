//! Traces (docs/client.md#traces): the W3C trace context a client request carries,
//! and OpenTelemetry export over OTLP/HTTP (protobuf) — off unless an endpoint is
//! configured.
//!
//! `pangea start` calls [`configure`] with `--otlp-endpoint` (or `otlp_endpoint` in
//! the node config, or `PANGEA_OTLP_ENDPOINT`), falling back to the standard
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`; the logging
//! setup adds [`layer`] next to its fmt layer, and [`shutdown`] flushes at exit.
//! Spans reach the layer only where the log filter (`PANGEA_LOG`) lets them through:
//! the request and attempt spans are at `info`.
//!
//! The exporter posts to a collector over plain HTTP/1.1 with a small hyper client
//! of its own (hyper is already here for the admin endpoint): the `reqwest` client
//! opentelemetry-otlp ships would add some forty crates to the build. For TLS or a
//! remote backend, run a collector next to the replica and point it there.

use anyhow::{Context as _, Result};
use bytes::Bytes;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;
use tracing_subscriber::registry::LookupSpan;

/// The standard variables naming a collector (the per-signal one is used as is; the
/// general one gets `/v1/traces` appended).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const OTLP_TRACES_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// Where OTLP/HTTP receivers take traces, under the collector's base URL.
pub const OTLP_TRACES_PATH: &str = "/v1/traces";
/// Most time one export may take (connect, send, answer).
pub const OTLP_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest collector answer read (they are a few bytes).
const OTLP_RESPONSE_BYTES_MAX: usize = 64 * 1024;

/// The process's exporter, once [`configure`] turned export on.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The W3C `traceparent` value (`00-<trace id>-<span id>-<flags>`) as a span
/// context, if it is well formed (version `ff`, all-zero ids, upper-case hex and
/// wrong lengths are refused, as the W3C recommendation says).
pub fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let mut parts = value.split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    // Version 00 has exactly four fields; later versions may append more.
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let cx = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8()),
        true,
        TraceState::default(),
    );
    cx.is_valid().then_some(cx)
}

/// The parent context for a span serving a request that carried `traceparent`
/// (`None` when it carried none, or a malformed one).
pub fn remote_parent(traceparent: &str) -> Option<opentelemetry::Context> {
    if traceparent.is_empty() {
        return None;
    }
    parse_traceparent(traceparent)
        .map(|sc| opentelemetry::Context::new().with_remote_span_context(sc))
}

/// The collector to export to: the configured endpoint (a base URL; `/v1/traces` is
/// appended unless it is already there), else the standard environment variables.
/// `None`: export stays off.
pub fn otlp_endpoint(configured: Option<&str>) -> Option<String> {
    if let Some(base) = configured.map(str::trim).filter(|s| !s.is_empty()) {
        let base = base.trim_end_matches('/');
        return Some(if base.ends_with(OTLP_TRACES_PATH) {
            base.to_owned()
        } else {
            format!("{base}{OTLP_TRACES_PATH}")
        });
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if let Some(v) = env(OTLP_TRACES_ENDPOINT_ENV) {
        return Some(v.trim().to_owned());
    }
    env(OTLP_ENDPOINT_ENV).map(|v| {
        let base = v.trim().trim_end_matches('/');
        format!("{base}{OTLP_TRACES_PATH}")
    })
}

/// A tracer provider exporting in batches (from the SDK's own thread) to the OTLP/HTTP
/// endpoint `endpoint` (full URL, `http://`), with `service.name = pangea-node` and
/// `service.instance.id = instance`.
pub fn otlp_provider(endpoint: &str, instance: &str) -> Result<SdkTracerProvider> {
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    let uri: hyper::Uri = endpoint
        .parse()
        .with_context(|| format!("OTLP endpoint {endpoint:?} is not a URL"))?;
    anyhow::ensure!(
        uri.scheme_str() == Some("http") && uri.host().is_some(),
        "OTLP endpoint {endpoint:?}: only http://HOST:PORT is supported (run a collector next to the replica for TLS)"
    );
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .with_timeout(OTLP_EXPORT_TIMEOUT)
        .with_http_client(Http1Client::new(OTLP_EXPORT_TIMEOUT)?)
        .build()
        .context("OTLP exporter")?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("pangea-node")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            instance.to_owned(),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Turns OTLP export on for this process when an endpoint is configured (see
/// [`otlp_endpoint`]); returns the endpoint, or `None` when export stays off. Call
/// once, before the logging setup asks for [`layer`].
pub fn configure(configured: Option<&str>, instance: &str) -> Result<Option<String>> {
    let Some(endpoint) = otlp_endpoint(configured) else {
        return Ok(None);
    };
    if PROVIDER.get().is_none() {
        let provider = otlp_provider(&endpoint, instance)?;
        if let Err(unused) = PROVIDER.set(provider) {
            let _ = unused.shutdown();
        }
    }
    Ok(Some(endpoint))
}

/// The tracing layer that turns spans into OpenTelemetry spans for the exporter
/// [`configure`] started; `None` (a layer that does nothing) when export is off.
pub fn layer<S>() -> Option<tracing_opentelemetry::OpenTelemetryLayer<S, SdkTracer>>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let provider = PROVIDER.get()?;
    Some(tracing_opentelemetry::layer().with_tracer(provider.tracer("pangea")))
}

/// Exports the spans still queued and stops the exporter (at process exit).
pub fn shutdown() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.shutdown();
    }
}

/// A minimal OTLP/HTTP client: one HTTP/1.1 POST per export batch over a fresh TCP
/// connection, on a one-thread runtime of its own (the SDK exports from a plain
/// thread, and a replica's serving runtime must not carry telemetry).
struct Http1Client {
    runtime: Option<tokio::runtime::Runtime>,
    timeout: Duration,
}

impl std::fmt::Debug for Http1Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http1Client")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Http1Client {
    fn new(timeout: Duration) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("pangea-otlp")
            .enable_all()
            .build()
            .context("OTLP exporter runtime")?;
        Ok(Http1Client {
            runtime: Some(runtime),
            timeout,
        })
    }
}

impl Drop for Http1Client {
    fn drop(&mut self) {
        // Dropped wherever the SDK lets go of it, possibly inside a runtime.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

type ExportFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'a>>;

impl HttpClient for Http1Client {
    // `HttpClient` is declared with `#[async_trait]`; this is its expanded signature.
    fn send_bytes<'s, 'f>(&'s self, request: Request<Bytes>) -> ExportFuture<'f>
    where
        's: 'f,
        Self: 'f,
    {
        let timeout = self.timeout;
        let task = self
            .runtime
            .as_ref()
            .map(|rt| rt.spawn(async move { tokio::time::timeout(timeout, post(request)).await }));
        Box::pin(async move {
            match task {
                None => Err("OTLP exporter stopped".into()),
                Some(task) => match task.await {
                    Ok(Ok(result)) => result,
                    Ok(Err(_)) => Err(format!("OTLP export took longer than {timeout:?}").into()),
                    Err(e) => Err(Box::new(e) as HttpError),
                },
            }
        })
    }
}

async fn post(request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
    use http_body_util::BodyExt as _;
    let (mut parts, body) = request.into_parts();
    let host = parts.uri.host().ok_or("OTLP endpoint has no host")?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = parts.uri.port_u16().unwrap_or(80);
    let authority = parts
        .uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_else(|| host.clone());
    let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);
    // HTTP/1.1 wants the path in the request line and the authority in `Host`.
    parts.uri = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()?;
    parts
        .headers
        .insert(hyper::header::HOST, authority.parse()?);
    let response = sender
        .send_request(Request::from_parts(parts, http_body_util::Full::new(body)))
        .await?;
    let (parts, body) = response.into_parts();
    let body = http_body_util::Limited::new(body, OTLP_RESPONSE_BYTES_MAX)
        .collect()
        .await?
        .to_bytes();
    drop(sender);
    connection.abort();
    Ok(Response::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parsing_follows_w3c() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(ok).expect("valid");
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        let unsampled =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert!(unsampled.is_some_and(|s| !s.is_sampled()));
        // A later version may append fields.
        assert!(
            parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
                .is_some()
        );
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
        assert!(remote_parent("").is_none());
        assert!(remote_parent("garbage").is_none());
    }

    #[test]
    fn endpoint_gets_the_traces_path_once() {
        assert_eq!(
            otlp_endpoint(Some("http://127.0.0.1:4318")).as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            otlp_endpoint(Some("http://collector:4318/")).as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            otlp_endpoint(Some("http://collector:4318/v1/traces")).as_deref(),
            Some("http://collector:4318/v1/traces")
        );
    }

    #[test]
    fn only_plain_http_endpoints() {
        let err = otlp_provider("https://collector:4318/v1/traces", "r").unwrap_err();
        assert!(err.to_string().contains("only http://"), "{err}");
        assert!(otlp_provider("not a url", "r").is_err());
    }

    /// The exporter's client against a one-shot HTTP server on loopback: one POST to
    /// /v1/traces with a protobuf body, the answer read back.
    #[test]
    fn http1_client_posts_one_batch() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"body") {
                let n = s.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .expect("write");
            String::from_utf8_lossy(&got).into_owned()
        });
        let client = Http1Client::new(Duration::from_secs(5)).expect("client");
        let req = Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(Bytes::from_static(b"body"))
            .expect("request");
        let resp = block_on(client.send_bytes(req)).expect("answer");
        assert_eq!(resp.status(), 200);
        assert_eq!(&resp.body()[..], b"ok");
        let seen = server.join().expect("server");
        assert!(seen.starts_with("POST /v1/traces HTTP/1.1\r\n"), "{seen}");
        assert!(
            seen.to_ascii_lowercase().contains(&format!("host: {addr}")),
            "{seen}"
        );
    }

    /// A one-shot HTTP server on loopback: returns its address and, once a request
    /// came, the request's head and body.
    fn one_shot_server() -> (
        std::net::SocketAddr,
        std::thread::JoinHandle<(String, Vec<u8>)>,
    ) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            let (head, body) = loop {
                let n = s.read(&mut buf).expect("read");
                assert!(n > 0, "connection closed before a whole request");
                got.extend_from_slice(&buf[..n]);
                let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    break (head, got[end + 4..end + 4 + len].to_vec());
                }
            };
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                .expect("write");
            (head, body)
        });
        (addr, server)
    }

    /// `pangea start`'s logging setup with the layer added (as in the CLI's
    /// `init_logging`): the composition type-checks, with or without export.
    #[test]
    fn the_layer_composes_with_the_fmt_subscriber() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_writer(std::io::sink)
            .with_ansi(false)
            .finish()
            .with(layer());
        tracing::subscriber::with_default(subscriber, || tracing::info!("composed"));
    }

    /// Spans go out over OTLP/HTTP: the SDK's batch thread posts protobuf to
    /// /v1/traces through [`Http1Client`], with the span and the replica in it.
    #[test]
    fn spans_are_exported_over_otlp_http() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let (addr, server) = one_shot_server();
        let endpoint = otlp_endpoint(Some(&format!("http://{addr}"))).expect("configured");
        let provider = otlp_provider(&endpoint, "use1-test").expect("provider");
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("pangea.unit_test_span", op = "get");
            span.in_scope(|| tracing::info!("inside"));
        });
        provider.force_flush().expect("flushed");
        let (head, body) = server.join().expect("server");
        assert!(head.starts_with("post /v1/traces http/1.1"), "{head}");
        assert!(
            head.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        let has = |s: &str| body.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(has("pangea.unit_test_span"), "span name in the export");
        assert!(
            has("use1-test") && has("pangea-node"),
            "resource in the export"
        );
        let _ = provider.shutdown();
    }

    /// Polls a future to completion outside the client's own runtime.
    fn block_on<F: Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(f)
    }
}
