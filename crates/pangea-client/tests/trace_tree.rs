//! Traces follow one read across hedges and fallbacks (docs/client.md#traces): with
//! the OpenTelemetry SDK's in-memory exporter behind a tracing-opentelemetry layer,
//! a hedged read and a watermark read that falls back to the origin export the span
//! tree they should — one `pangea.get` root, a `pangea.attempt` child per request
//! with its replica, region, kind, consistency, outcome and redacted key — and each
//! replica's `pangea.serve` span joins the trace through the request's
//! `traceparent`. No span, event or log line carries a key or a value.
//!
//! The subscriber is this test binary's global default (this file holds one test):
//! the in-process replicas run on threads of their own, and their spans must reach
//! the same exporter to show that the trace context crossed the wire.

mod common;

use anyhow::{Context, Result};
use bytes::Bytes;
use common::LocalCluster;
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use pangea_client::{
    Client, ClientConfig, Consistency, HedgePolicy, Mutation, ReadOptions, RowMutation,
    WriteOptions,
};
use pangea_core::redact::KeyHash;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;

const TOPOLOGY: &str = "topology/local-3-regions.toml";
const PLACEMENT: &str = "topology/local-3-regions.placement.toml";

/// Log lines, kept for the redaction check.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

fn set(key: &str, value: &str) -> Result<RowMutation> {
    let m = Mutation::SetCell {
        family: "profile".into(),
        column: Bytes::from_static(b"p"),
        value: Bytes::from(value.to_owned()),
    };
    Ok(RowMutation::new(
        "ad_profiles",
        key.to_owned(),
        vec![m],
        &pangea_core::Limits::default(),
    )?)
}

fn write_opts() -> WriteOptions {
    WriteOptions {
        deadline: Some(Duration::from_secs(2)),
        ..Default::default()
    }
}

fn attr(s: &SpanData, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

fn describe(s: &SpanData) -> String {
    let attrs: Vec<String> = s
        .attributes
        .iter()
        .filter(|kv| {
            !kv.key.as_str().starts_with("code.") && !kv.key.as_str().starts_with("thread.")
        })
        .map(|kv| format!("{}={}", kv.key, kv.value.as_str()))
        .collect();
    format!(
        "{} span={} parent={} [{}]",
        s.name,
        s.span_context.span_id(),
        s.parent_span_id,
        attrs.join(" ")
    )
}

/// The `pangea.get` root whose `key.hash` is `key`'s, and its attempt children.
fn read_tree<'a>(spans: &'a [SpanData], key: &str) -> Result<(&'a SpanData, Vec<&'a SpanData>)> {
    let hash = KeyHash::of(key.as_bytes()).to_string();
    let roots: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "pangea.get" && attr(s, "key.hash").as_deref() == Some(&hash))
        .collect();
    anyhow::ensure!(
        roots.len() == 1,
        "{} pangea.get spans for the key",
        roots.len()
    );
    let root = roots[0];
    anyhow::ensure!(
        root.parent_span_id == SpanId::INVALID,
        "the read's span is a root: {}",
        describe(root)
    );
    let children: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.parent_span_id == root.span_context.span_id())
        .collect();
    for c in &children {
        anyhow::ensure!(
            c.name == "pangea.attempt",
            "child of the read: {}",
            describe(c)
        );
        anyhow::ensure!(
            c.span_context.trace_id() == root.span_context.trace_id(),
            "attempt in another trace: {}",
            describe(c)
        );
        anyhow::ensure!(
            attr(c, "key.hash").as_deref() == Some(&hash),
            "{}",
            describe(c)
        );
        anyhow::ensure!(
            attr(c, "key.len") == Some(key.len().to_string()),
            "{}",
            describe(c)
        );
    }
    Ok((root, children))
}

/// The replica's span of the request `attempt` sent.
fn serve_of<'a>(spans: &'a [SpanData], attempt: &SpanData) -> Option<&'a SpanData> {
    spans.iter().find(|s| {
        s.name == "pangea.serve"
            && s.parent_span_id == attempt.span_context.span_id()
            && s.span_context.trace_id() == attempt.span_context.trace_id()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_read_is_one_trace_across_hedges_fallbacks_and_replicas() -> Result<()> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let logs = Logs::default();
    let pangea = Targets::new()
        .with_target("pangea_client", LevelFilter::TRACE)
        .with_target("pangea_node", LevelFilter::TRACE)
        .with_target("pangea_net", LevelFilter::TRACE)
        .with_target("pangea_store", LevelFilter::TRACE)
        .with_default(LevelFilter::WARN);
    let subscriber = tracing_subscriber::registry()
        .with(pangea)
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("trace_tree")))
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(logs.clone()),
        );
    tracing::subscriber::set_global_default(subscriber).context("one subscriber per binary")?;

    let cluster = LocalCluster::start(TOPOLOGY, PLACEMENT, true).await?;
    let eu = Client::connect(ClientConfig::from_cluster(
        &cluster.file,
        "eu-west-1",
        "frontend",
    )?)
    .await?;
    let us = Client::connect(ClientConfig::from_cluster(
        &cluster.file,
        "us-east-1",
        "frontend",
    )?)
    .await?;
    // A second us-east-1 frontend whose path to its region's replicas gets slow.
    let wan = pangea_net::wan::WanControl::new();
    let mut slow_config = ClientConfig::from_cluster(&cluster.file, "us-east-1", "frontend")?;
    slow_config.wan = Some(wan.clone());
    let slow = Client::connect(slow_config).await?;
    let mut secrets: Vec<String> = Vec::new();

    // 1. A hedged read: both us-east-1 replicas answer 30 ms late and the hedge goes
    // out after 1 ms, so the read has two attempts, one served, one cancelled.
    let hedge_key = "trace/hedged-row-5f1c";
    let hedge_value = "secret-hedged-value-81d2";
    secrets.extend([hedge_key.into(), hedge_value.into()]);
    us.mutate(set(hedge_key, hedge_value)?, &write_opts())
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in ["use1-a", "use1-b"] {
        let addr = cluster
            .file
            .replica(id)
            .context("in topology")?
            .address
            .parse()?;
        wan.set_delay(addr, Duration::from_millis(30));
    }
    let hedged = ReadOptions {
        hedge: Some(HedgePolicy {
            percentile: 0.5,
            floor: Duration::from_millis(1),
            ceiling: Duration::from_millis(1),
            budget_fraction: 1.0,
        }),
        ..ReadOptions::default().with_deadline(Duration::from_secs(1))
    };
    let r = slow
        .get(
            "ad_profiles",
            Bytes::from_static(hedge_key.as_bytes()),
            &hedged,
        )
        .await?;
    assert_eq!(r.attempts, 2, "primary and hedge: {r:?}");

    // 2. A watermark read that falls back: written by a eu-west-1 frontend (at the
    // nearest replica it finds up), read at once from us-east-1 (replication takes
    // tens of ms), so the nearest replica is not covered and the origin answers.
    // Rarely replication wins the race; then try another key.
    let mut fallback_key = None;
    for n in 0..5 {
        let key = format!("trace/fallback-row-{n}-9c4e");
        let value = format!("secret-fallback-value-{n}-2b7a");
        secrets.extend([key.clone(), value.clone()]);
        let token = eu.mutate(set(&key, &value)?, &write_opts()).await?.value;
        let opts = ReadOptions {
            hedge: None,
            ..ReadOptions::default()
                .with_consistency(Consistency::Watermark(token.clone()))
                .with_deadline(Duration::from_secs(2))
        };
        let r = us
            .get("ad_profiles", Bytes::from(key.clone()), &opts)
            .await?;
        let got = r
            .value
            .as_ref()
            .and_then(|row| row.families.first())
            .and_then(|f| f.cells.first());
        assert_eq!(
            got.map(|c| &c.value[..]),
            Some(value.as_bytes()),
            "read-your-writes"
        );
        if r.attempts >= 2 {
            assert_eq!(r.replica, token.origin, "{r:?}");
            fallback_key = Some((key, token));
            break;
        }
    }
    let (fallback_key, token) = fallback_key.context("no watermark read fell back in 5 tries")?;

    // Let the cancelled attempt's request reach its replica and end there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop((eu, us, slow));
    let cluster_regions: std::collections::BTreeMap<String, String> = cluster
        .file
        .replicas
        .iter()
        .map(|r| (r.id.clone(), r.region.clone()))
        .collect();
    cluster.stop().await?;
    let _ = provider.force_flush();
    let spans = exporter.get_finished_spans()?;
    let dump = || spans.iter().map(describe).collect::<Vec<_>>().join("\n");

    // The hedged read.
    let (root, attempts) = read_tree(&spans, hedge_key)?;
    assert_eq!(attr(root, "consistency").as_deref(), Some("eventual"));
    assert_eq!(attr(root, "outcome").as_deref(), Some("served"));
    assert_eq!(attr(root, "attempts").as_deref(), Some("2"));
    let kinds: Vec<(String, String)> = attempts
        .iter()
        .map(|a| {
            (
                attr(a, "kind").unwrap_or_default(),
                attr(a, "outcome").unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(attempts.len(), 2, "{kinds:?}\n{}", dump());
    assert!(kinds.iter().any(|(k, _)| k == "primary"), "{kinds:?}");
    assert!(kinds.iter().any(|(k, _)| k == "hedge"), "{kinds:?}");
    let mut outcomes: Vec<&str> = kinds.iter().map(|(_, o)| o.as_str()).collect();
    outcomes.sort();
    assert_eq!(outcomes, ["cancelled", "served"], "{kinds:?}");
    for a in &attempts {
        assert_eq!(
            attr(a, "region").as_deref(),
            Some("us-east-1"),
            "{}",
            describe(a)
        );
        assert_eq!(attr(a, "consistency").as_deref(), Some("eventual"));
        assert_eq!(
            attr(a, "otel.kind"),
            None,
            "otel.kind becomes the span kind"
        );
        assert_eq!(a.span_kind, opentelemetry::trace::SpanKind::Client);
        let replica = attr(a, "replica").unwrap_or_default();
        assert!(replica.starts_with("use1-"), "{}", describe(a));
    }
    let served = attempts
        .iter()
        .find(|a| attr(a, "outcome").as_deref() == Some("served"))
        .expect("checked above");
    assert_eq!(attr(root, "replica"), attr(served, "replica"));
    let serve = serve_of(&spans, served)
        .with_context(|| format!("no replica span joined the served attempt\n{}", dump()))?;
    assert!(serve.parent_span_is_remote);
    assert_eq!(attr(serve, "replica"), attr(served, "replica"));
    assert_eq!(attr(serve, "op").as_deref(), Some("get"));
    assert_eq!(attr(serve, "outcome").as_deref(), Some("ok"));
    assert_eq!(attr(serve, "key.hash"), attr(served, "key.hash"));
    assert_eq!(serve.span_kind, opentelemetry::trace::SpanKind::Server);

    // The watermark read that fell back to the origin.
    let (root, attempts) = read_tree(&spans, &fallback_key)?;
    assert_eq!(attr(root, "consistency").as_deref(), Some("watermark"));
    assert_eq!(attr(root, "outcome").as_deref(), Some("served"));
    assert_eq!(
        attr(root, "replica").as_deref(),
        Some(token.origin.as_str())
    );
    let primary: Vec<&&SpanData> = attempts
        .iter()
        .filter(|a| attr(a, "kind").as_deref() == Some("primary"))
        .collect();
    let fallback: Vec<&&SpanData> = attempts
        .iter()
        .filter(|a| attr(a, "kind").as_deref() == Some("fallback"))
        .collect();
    assert_eq!(primary.len(), 1, "{}", dump());
    assert!(!fallback.is_empty(), "{}", dump());
    assert_eq!(attr(primary[0], "outcome").as_deref(), Some("not_covered"));
    assert_eq!(attr(primary[0], "region").as_deref(), Some("us-east-1"));
    assert_eq!(
        attr(primary[0], "consistency").as_deref(),
        Some("watermark")
    );
    let origin = fallback
        .iter()
        .find(|a| attr(a, "replica").as_deref() == Some(token.origin.as_str()))
        .with_context(|| format!("no fallback to the origin\n{}", dump()))?;
    assert_eq!(attr(origin, "outcome").as_deref(), Some("served"));
    let origin_region = cluster_regions
        .get(token.origin.as_str())
        .context("origin in the cluster")?;
    assert_eq!(attr(origin, "region").as_ref(), Some(origin_region));
    assert_eq!(attr(origin, "reason").as_deref(), Some("origin-fallback"));
    let refused = serve_of(&spans, primary[0]).context("the not-covered replica's span")?;
    assert_eq!(attr(refused, "outcome").as_deref(), Some("not_covered"));
    assert_eq!(attr(refused, "mode").as_deref(), Some("watermark"));
    let answered = serve_of(&spans, origin).context("the origin's span")?;
    assert_eq!(
        attr(answered, "replica").as_deref(),
        Some(token.origin.as_str())
    );

    // Shown with --nocapture: the two traces.
    for s in spans.iter().filter(|s| {
        s.span_context.trace_id() == root.span_context.trace_id()
            || read_tree(&spans, hedge_key)
                .is_ok_and(|(r, _)| r.span_context.trace_id() == s.span_context.trace_id())
    }) {
        eprintln!("{}", describe(s));
    }

    // Writes have spans too.
    assert!(
        spans.iter().any(|s| s.name == "pangea.mutate"),
        "{}",
        dump()
    );

    // Nothing anywhere carries a key or a value: span names, attributes, events,
    // status, and every log line.
    let logs =
        String::from_utf8_lossy(&logs.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    assert!(logs.contains("replica serving"), "the log capture works");
    for s in &spans {
        let mut texts: Vec<String> = vec![s.name.to_string(), format!("{:?}", s.status)];
        texts.extend(
            s.attributes
                .iter()
                .map(|kv| format!("{}={}", kv.key, kv.value.as_str())),
        );
        for e in &s.events.events {
            texts.push(e.name.to_string());
            texts.extend(
                e.attributes
                    .iter()
                    .map(|kv| format!("{}={}", kv.key, kv.value.as_str())),
            );
        }
        for t in &texts {
            for secret in &secrets {
                assert!(
                    !t.contains(secret.as_str()),
                    "{secret:?} in span {}: {t}",
                    s.name
                );
            }
        }
    }
    for secret in &secrets {
        assert!(!logs.contains(secret.as_str()), "{secret:?} in the logs");
    }
    eprintln!(
        "{} spans exported, {} log bytes checked for {} keys and values",
        spans.len(),
        logs.len(),
        secrets.len()
    );
    let _ = provider.shutdown();
    Ok(())
}
