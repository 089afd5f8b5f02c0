//! The admin endpoint, spoken to over real TCP with a tiny HTTP/1.1 client: routes,
//! status codes, content types, the exposition a scraper sees, the connection cap and
//! shutdown. Every test is bounded by a timeout, so a hung server fails, not hangs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use pangea_node::admin::{
    ADMIN_CONNECTIONS_MAX, AdminState, Health, OriginMark, SHUTDOWN_DRAIN_MAX, ScopeMarks,
    Watermarks, serve,
};
use pangea_node::metrics::{
    METRIC_NAMES, NodeMetrics, OPENMETRICS_CONTENT_TYPE, is_exported_series,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// Bound on a whole test.
const TEST_TIME_MAX: Duration = Duration::from_secs(20);
/// Bound on one request, and on `serve` returning after shutdown.
const STEP_TIME_MAX: Duration = Duration::from_secs(5);

/// An `AdminState` over a real `NodeMetrics`, with health switchable by the test.
struct FakeState {
    metrics: Arc<NodeMetrics>,
    healthy: AtomicBool,
}

impl AdminState for FakeState {
    fn metrics_text(&self) -> String {
        self.metrics.encode()
    }

    fn health(&self) -> Health {
        let ok = self.healthy.load(Ordering::SeqCst);
        Health {
            ok,
            replica: "eu-west-1a".to_owned(),
            region: "eu-west-1".to_owned(),
            detail: if ok {
                serde_json::json!({})
            } else {
                serde_json::json!({ "reason": "store not open" })
            },
        }
    }

    fn watermarks(&self) -> Watermarks {
        let origin = OriginMark {
            sequence: 42,
            timestamp: 1_700_000_000_000,
            lag_ms: 3,
        };
        Watermarks {
            replica: "eu-west-1a".to_owned(),
            region: "eu-west-1".to_owned(),
            scopes: vec![ScopeMarks {
                scope: "eu".to_owned(),
                origins: [("us-east-1a".to_owned(), origin)].into(),
                ..ScopeMarks::default()
            }],
            apply_lag: serde_json::json!({}),
        }
    }
}

fn fake_state() -> Arc<FakeState> {
    let metrics = Arc::new(NodeMetrics::new());
    // One observation of every metric, as a replica would make them.
    metrics.observe_request("get", "eventual", "ok", 0.0031);
    metrics.observe_request("get", "eventual", "ok", 0.012);
    metrics.observe_request("mutate", "none", "deadline", 0.4);
    metrics.set_replication_lag("eu", "us-east-1a", 0.25);
    metrics.set_watermark_age("eu", 0.5);
    metrics.set_watermark_sequence("eu", "us-east-1a", 42);
    metrics.set_inflight_bytes("us-east-1a", 65_536);
    metrics.add_bytes_sent("inter_continent", 1_500);
    metrics.add_bytes_sent("inter_continent", 500);
    metrics.inc_frames_sent("mutations", "us-east-1a");
    metrics.inc_frames_rejected("unknown_scope");
    metrics.inc_connection_attempts("retried");
    metrics.inc_handshakes_refused("expired");
    metrics.inc_applied("eu", "us-east-1a");
    metrics.set_peer_suspected("ap-south-1a", true);
    metrics.set_connections("peer", 2);
    metrics.set_connections("client", 7);
    metrics.inc_residency_violation();
    Arc::new(FakeState {
        metrics,
        healthy: AtomicBool::new(true),
    })
}

/// A running `serve`, stopped by `stop`.
struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(state: Arc<dyn AdminState>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Ok(Self { addr, stop, task })
    }

    /// Resolves the shutdown future and waits (bounded) for `serve` to return.
    async fn stop(self) -> Result<Duration> {
        let started = Instant::now();
        let _ = self.stop.send(());
        timeout(STEP_TIME_MAX, self.task)
            .await
            .context("serve did not return after shutdown")???;
        Ok(started.elapsed())
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Result<serde_json::Value> {
        ensure!(
            self.header("content-type") == Some("application/json"),
            "{self:?}"
        );
        Ok(serde_json::from_str(&self.body)?)
    }
}

/// Sends one request with `Connection: close` and reads the reply to end of stream.
async fn request(addr: SocketAddr, method: &str, path: &str) -> Result<Reply> {
    timeout(STEP_TIME_MAX, async {
        let mut stream = TcpStream::connect(addr).await?;
        let head = format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await?;
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).await?;
        parse_reply(&bytes)
    })
    .await
    .with_context(|| format!("{method} {path} timed out"))?
}

/// Reads one reply from a keep-alive connection (its body framed by Content-Length).
async fn read_reply(stream: &mut TcpStream) -> Result<Reply> {
    let mut bytes = Vec::new();
    let mut chunk = [0_u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        ensure!(
            n > 0,
            "connection closed mid-reply: {:?}",
            String::from_utf8_lossy(&bytes)
        );
        bytes.extend_from_slice(&chunk[..n]);
        if let Some(end) = find(&bytes, b"\r\n\r\n") {
            let head = parse_head(&bytes[..end + 4])?;
            let length: usize = head
                .header("content-length")
                .context("no length")?
                .parse()?;
            if bytes.len() >= end + 4 + length {
                return parse_reply(&bytes);
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A whole reply: head and a body of the announced length.
fn parse_reply(bytes: &[u8]) -> Result<Reply> {
    let reply = parse_head(bytes)?;
    if let Some(length) = reply.header("content-length") {
        ensure!(
            length.parse::<usize>()? == reply.body.len(),
            "length mismatch: {reply:?}"
        );
    }
    Ok(reply)
}

/// The head of a reply, and whatever body bytes follow it.
fn parse_head(bytes: &[u8]) -> Result<Reply> {
    let end = find(bytes, b"\r\n\r\n").ok_or_else(|| anyhow!("no end of head"))?;
    let head = std::str::from_utf8(&bytes[..end])?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().context("no status line")?;
    let mut parts = status_line.splitn(3, ' ');
    ensure!(
        parts.next() == Some("HTTP/1.1"),
        "bad status line {status_line:?}"
    );
    let status = parts.next().context("no status")?.parse()?;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line.split_once(':').context("bad header")?;
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let body = String::from_utf8(bytes[end + 4..].to_vec())?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// Checks the exposition line by line the way an OpenMetrics parser would: metadata
/// for every family before its samples, sample names belonging to a declared family,
/// numeric values, `# EOF` last and once.
fn check_exposition(text: &str) -> Result<()> {
    ensure!(text.ends_with("# EOF\n"), "no final # EOF");
    let mut families: Vec<(&str, &str)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if *line == "# EOF" {
            ensure!(i == lines.len() - 1, "# EOF before the end");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').context("bad TYPE")?;
            families.push((name, kind));
        } else if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
        } else if line.starts_with('#') || line.is_empty() {
            bail!("unexpected line {line:?}");
        } else {
            let (series, value) = line.rsplit_once(' ').context("no value")?;
            let name = series.split('{').next().context("no name")?;
            let value = value.trim_start_matches('+');
            ensure!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
            ensure!(
                !series.contains('{') || series.ends_with('}'),
                "bad labels in {line:?}"
            );
            let (family, kind) = families.last().context("sample before TYPE")?;
            let suffix = name
                .strip_prefix(family)
                .context("sample of another family")?;
            let allowed: &[&str] = match *kind {
                "counter" => &["_total", "_created"],
                "gauge" => &[""],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                other => bail!("unexpected type {other}"),
            };
            ensure!(allowed.contains(&suffix), "{name} is not a {kind} sample");
            ensure!(is_exported_series(name), "{name} is not in METRIC_NAMES");
        }
    }
    Ok(())
}

#[tokio::test]
async fn metrics_serves_the_openmetrics_exposition() -> Result<()> {
    timeout(TEST_TIME_MAX, async {
        let server = Server::start(fake_state()).await?;
        let reply = request(server.addr, "GET", "/metrics").await?;
        ensure!(reply.status == 200, "{reply:?}");
        ensure!(reply.header("content-type") == Some(OPENMETRICS_CONTENT_TYPE), "{reply:?}");
        let text = &reply.body;
        check_exposition(text)?;
        for expected in [
            // prometheus-client puts `le` first; label order does not matter to parsers.
            r#"pangea_request_duration_seconds_bucket{le="0.0025",op="get",mode="eventual",outcome="ok"} 0"#,
            r#"pangea_request_duration_seconds_bucket{le="0.005",op="get",mode="eventual",outcome="ok"} 1"#,
            r#"pangea_request_duration_seconds_bucket{le="0.02",op="get",mode="eventual",outcome="ok"} 2"#,
            r#"pangea_request_duration_seconds_bucket{le="+Inf",op="get",mode="eventual",outcome="ok"} 2"#,
            r#"pangea_request_duration_seconds_count{op="mutate",mode="none",outcome="deadline"} 1"#,
            "# UNIT pangea_request_duration_seconds seconds",
            r#"pangea_replication_lag_seconds{scope="eu",origin="us-east-1a"} 0.25"#,
            r#"pangea_watermark_age_seconds{scope="eu"} 0.5"#,
            r#"pangea_watermark_sequence{scope="eu",origin="us-east-1a"} 42"#,
            r#"pangea_inflight_bytes{peer="us-east-1a"} 65536"#,
            r#"pangea_replication_bytes_sent_total{link_class="inter_continent"} 2000"#,
            r#"pangea_replication_frames_sent_total{kind="mutations",peer="us-east-1a"} 1"#,
            r#"pangea_frames_rejected_total{reason="unknown_scope"} 1"#,
            r#"pangea_connection_attempts_total{outcome="retried"} 1"#,
            r#"pangea_handshakes_refused_total{reason="expired"} 1"#,
            r#"pangea_applied_total{scope="eu",origin="us-east-1a"} 1"#,
            r#"pangea_peer_suspected{peer="ap-south-1a"} 1"#,
            r#"pangea_connections{kind="client"} 7"#,
            "pangea_residency_violations_total 1",
            "pangea_up 1",
            concat!(r#"pangea_build_info{version=""#, env!("CARGO_PKG_VERSION"), r#""} 1"#),
        ] {
            ensure!(text.lines().any(|l| l == expected), "missing {expected:?} in\n{text}");
        }
        for name in METRIC_NAMES {
            let help = format!("# HELP {} ", name.trim_end_matches("_total"));
            ensure!(text.contains(&help), "no help text for {name}");
            ensure!(text.contains(&format!("\n{name}")), "no sample of {name}");
        }
        server.stop().await?;
        Ok(())
    })
    .await?
}

#[tokio::test]
async fn health_is_200_when_ok_and_503_when_not() -> Result<()> {
    timeout(TEST_TIME_MAX, async {
        let state = fake_state();
        let server = Server::start(state.clone()).await?;

        let reply = request(server.addr, "GET", "/health").await?;
        ensure!(reply.status == 200, "{reply:?}");
        let health: Health = serde_json::from_value(reply.json()?)?;
        ensure!(health.ok && health.replica == "eu-west-1a" && health.region == "eu-west-1");

        state.healthy.store(false, Ordering::SeqCst);
        let reply = request(server.addr, "GET", "/health").await?;
        ensure!(reply.status == 503, "{reply:?}");
        let body = reply.json()?;
        ensure!(body["ok"] == false, "{body}");
        ensure!(body["detail"]["reason"] == "store not open", "{body}");

        server.stop().await?;
        Ok(())
    })
    .await?
}

#[tokio::test]
async fn watermarks_are_served_as_json() -> Result<()> {
    timeout(TEST_TIME_MAX, async {
        let server = Server::start(fake_state()).await?;
        let reply = request(server.addr, "GET", "/watermarks").await?;
        ensure!(reply.status == 200, "{reply:?}");
        let body = reply.json()?;
        ensure!(
            body["scopes"][0]["scope"] == "eu"
                && body["scopes"][0]["origins"]["us-east-1a"]["sequence"] == 42,
            "{body}"
        );
        // Query strings do not change the route.
        let reply = request(server.addr, "GET", "/watermarks?scope=eu").await?;
        ensure!(reply.status == 200, "{reply:?}");
        server.stop().await?;
        Ok(())
    })
    .await?
}

#[tokio::test]
async fn unknown_paths_are_404_and_other_methods_405() -> Result<()> {
    timeout(TEST_TIME_MAX, async {
        let server = Server::start(fake_state()).await?;
        for path in ["/", "/nope", "/metrics/extra", "/health/"] {
            let reply = request(server.addr, "GET", path).await?;
            ensure!(reply.status == 404, "GET {path}: {reply:?}");
            ensure!(reply.header("content-type") == Some("text/plain; charset=utf-8"));
        }
        for (method, path) in [
            ("POST", "/metrics"),
            ("DELETE", "/health"),
            ("PUT", "/watermarks"),
        ] {
            let reply = request(server.addr, method, path).await?;
            ensure!(reply.status == 405, "{method} {path}: {reply:?}");
            ensure!(reply.header("allow") == Some("GET"), "{reply:?}");
        }
        let reply = request(server.addr, "POST", "/nope").await?;
        ensure!(reply.status == 404, "{reply:?}");
        server.stop().await?;
        Ok(())
    })
    .await?
}

#[tokio::test]
async fn fault_routes_are_refused_unless_fault_injection_is_on() -> Result<()> {
    timeout(TEST_TIME_MAX, async {
        // The fake state keeps the trait's default: fault injection off.
        let server = Server::start(fake_state()).await?;
        for (method, path) in [
            ("GET", "/fault"),
            ("POST", "/fault/link?peers=a&partitioned=true"),
            ("POST", "/fault/clock?offset_ms=5000"),
            ("POST", "/fault/heal"),
        ] {
            let reply = request(server.addr, method, path).await?;
            ensure!(reply.status == 403, "{method} {path}: {reply:?}");
        }
        // Changes are POSTs, the view a GET; a look-alike path is unknown.
        let reply = request(server.addr, "GET", "/fault/heal").await?;
        ensure!(
            reply.status == 405 && reply.header("allow") == Some("POST"),
            "{reply:?}"
        );
        let reply = request(server.addr, "POST", "/faults").await?;
        ensure!(reply.status == 404, "{reply:?}");
        server.stop().await?;
        Ok(())
    })
    .await?
}

#[tokio::test]
async fn malformed_requests_do_not_hurt_the_server() -> Result<()> {
    timeout(TEST_TIME_MAX, async {
        let server = Server::start(fake_state()).await?;
        let garbage: [&[u8]; 4] = [
            b"\x00\x01\x02\xff\xfe\r\n\r\n",
            b"GET /metrics HTTP/9.9\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: nope\r\n\r\n",
            &[b'A'; 64 * 1024],
        ];
        for bytes in garbage {
            let mut stream = TcpStream::connect(server.addr).await?;
            // The server may close while we write the large one; that is fine.
            let _ = stream.write_all(bytes).await;
            let mut reply = Vec::new();
            let _ = timeout(STEP_TIME_MAX, stream.read_to_end(&mut reply)).await;
            if !reply.is_empty() {
                let reply = parse_reply(&reply)?;
                ensure!((400..500).contains(&reply.status), "{reply:?}");
            }
        }
        let reply = request(server.addr, "GET", "/metrics").await?;
        ensure!(reply.status == 200, "{reply:?}");
        server.stop().await?;
        Ok(())
    })
    .await?
}

#[tokio::test]
async fn shutdown_returns_promptly_with_idle_keep_alive_connections_open() -> Result<()> {
    timeout(TEST_TIME_MAX, async {
        let server = Server::start(fake_state()).await?;
        let addr = server.addr;
        // A keep-alive connection that served a request and now idles.
        let mut idle = TcpStream::connect(addr).await?;
        idle.write_all(b"GET /health HTTP/1.1\r\nHost: admin\r\n\r\n")
            .await?;
        let reply = timeout(STEP_TIME_MAX, read_reply(&mut idle)).await??;
        ensure!(reply.status == 200, "{reply:?}");
        // And one that connected and said nothing yet.
        let mut silent = TcpStream::connect(addr).await?;

        let took = server.stop().await?;
        // Idle connections close at once: no need to wait out the drain bound.
        ensure!(took < SHUTDOWN_DRAIN_MAX, "shutdown took {took:?}");

        let mut rest = Vec::new();
        let n = timeout(STEP_TIME_MAX, idle.read_to_end(&mut rest)).await??;
        ensure!(
            n == 0,
            "idle connection got {:?}",
            String::from_utf8_lossy(&rest)
        );
        let _ = timeout(STEP_TIME_MAX, silent.read_to_end(&mut rest)).await?;
        ensure!(
            TcpStream::connect(addr).await.is_err(),
            "still accepting after shutdown"
        );
        Ok(())
    })
    .await?
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() -> Result<()> {
    timeout(TEST_TIME_MAX, async {
        let server = Server::start(fake_state()).await?;
        // Fill every slot with a connection that has sent half a request head.
        let mut held = Vec::new();
        for _ in 0..ADMIN_CONNECTIONS_MAX {
            let mut stream = TcpStream::connect(server.addr).await?;
            stream.write_all(b"GET /metrics HTTP/1.1\r\n").await?;
            held.push(stream);
        }
        // One more: the kernel accepts it, the server does not serve it yet.
        let mut extra = TcpStream::connect(server.addr).await?;
        extra
            .write_all(b"GET /health HTTP/1.1\r\nHost: admin\r\n\r\n")
            .await?;
        let mut byte = [0_u8; 1];
        ensure!(
            timeout(Duration::from_millis(300), extra.read(&mut byte))
                .await
                .is_err(),
            "a connection beyond the cap was served"
        );
        // Freeing one slot lets it through.
        drop(held.pop());
        let reply = timeout(STEP_TIME_MAX, read_reply(&mut extra)).await??;
        ensure!(reply.status == 200, "{reply:?}");
        drop(held);
        drop(extra);
        server.stop().await?;
        Ok(())
    })
    .await?
}
