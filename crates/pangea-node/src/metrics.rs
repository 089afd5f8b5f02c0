//! The Prometheus metrics a replica exports.
//!
//! Why this module exists: operators watch a Pangea deployment through dashboards and
//! alerts (serving latency against the 20 ms p99 budget, replication lag per origin,
//! WAN bytes per link class). The metric names below are a contract with those
//! dashboards, so they live in one place, each with help text, and [`METRIC_NAMES`]
//! lists them so a test elsewhere can check that dashboards reference only what is
//! exported.
//!
//! Choices:
//! - One [`NodeMetrics`] per replica process, shared as `Arc<NodeMetrics>`; every
//!   method takes `&self` because prometheus-client metrics are atomics (families sit
//!   behind a read-mostly lock that is only written when a new label set appears).
//! - **Data residency (DESIGN.md principle 5).** Label values are only
//!   operator-chosen names: replica ids, scope names, modes, outcomes, reasons.
//!   Never a user's row key or value: a restricted row's key must not reach a metrics
//!   label, because metrics leave the region (scraped by a central Prometheus).
//! - **Bounded cardinality.** Labels whose values form a closed set (`op`, `mode`,
//!   `outcome`, `link_class`, frame `kind`, connection `kind`) are mapped onto that
//!   set; anything else is recorded as `other` rather than creating a new series.
//!   These labels then cost no allocation on the serving path. Frame-rejection
//!   reasons are free-form but must be short snake_case, else they become `other`.
//!   Scope, origin and peer names come from the validated topology file, so their
//!   number is bounded by the deployment.
//! - The exposition is OpenMetrics text (prometheus-client's only text format): it
//!   ends with `# EOF` and must be served with [`OPENMETRICS_CONTENT_TYPE`] so that
//!   Prometheus picks its OpenMetrics parser.

use std::fmt;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// The content type of [`NodeMetrics::encode`]'s output. Prometheus chooses its parser
/// by content type; the text has OpenMetrics-only lines (`# UNIT`, `# EOF`), so
/// serving it as the classic `text/plain; version=0.0.4` would be rejected.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prefix of every metric name.
pub const METRIC_PREFIX: &str = "pangea";

/// Upper bounds (seconds) of `pangea_request_duration_seconds` buckets. Reads have a
/// 20 ms p99 budget, so the buckets are dense from 0.1 ms to 50 ms (0.01 and 0.02
/// bracket the budget) and sparse up to 2.5 s for deadline-bound and failover paths.
pub const REQUEST_DURATION_BUCKETS_SECONDS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Longest frame-rejection reason recorded as given; longer ones become `other`.
pub const REASON_BYTES_MAX: usize = 64;

/// Every metric family name as it appears in the exposition (`# TYPE` lines give the
/// family; counters are listed with the `_total` of their sample). Histogram samples
/// add `_bucket`, `_sum` and `_count` to the family name; see [`is_exported_series`].
pub const METRIC_NAMES: &[&str] = &[
    "pangea_request_duration_seconds",
    "pangea_replication_lag_seconds",
    "pangea_watermark_age_seconds",
    "pangea_watermark_sequence",
    "pangea_inflight_bytes",
    "pangea_replication_bytes_sent_total",
    "pangea_replication_frames_sent_total",
    "pangea_frames_rejected_total",
    "pangea_connection_attempts_total",
    "pangea_handshakes_refused_total",
    "pangea_applied_total",
    "pangea_peer_suspected",
    "pangea_connections",
    "pangea_residency_violations_total",
    "pangea_up",
    "pangea_build_info",
];

/// The families of [`METRIC_NAMES`] that are histograms.
const HISTOGRAM_NAMES: &[&str] = &["pangea_request_duration_seconds"];

/// Whether `series` (a sample name as a dashboard query writes it, e.g.
/// `pangea_request_duration_seconds_bucket`) is exported by [`NodeMetrics`].
pub fn is_exported_series(series: &str) -> bool {
    if METRIC_NAMES.contains(&series) {
        return true;
    }
    HISTOGRAM_NAMES.iter().any(|family| {
        series
            .strip_prefix(family)
            .is_some_and(|suffix| matches!(suffix, "_bucket" | "_sum" | "_count"))
    })
}

/// Label values of a closed set not in the set are recorded as this.
const OTHER: &str = "other";

const OPS: &[&str] = &["get", "get_many", "scan", "mutate", "watermarks"];
const MODES: &[&str] = &["eventual", "affinity", "watermark", "bounded", "none"];
const OUTCOMES: &[&str] = &[
    "ok",
    "not_covered",
    "too_stale",
    "policy",
    "deadline",
    "invalid",
    "not_found",
    "unavailable",
    "internal",
];
const LINK_CLASSES: &[&str] = &["intra_region", "inter_region", "inter_continent"];
const FRAME_KINDS: &[&str] = &[
    "mutations",
    "heartbeats",
    "gap_request",
    "gap_fill",
    "snapshot_request",
    "snapshot_chunk",
];
const CONNECTION_KINDS: &[&str] = &["peer", "client"];

/// `value` as the `&'static str` of the closed set `allowed` it equals, else `other`.
fn closed(allowed: &'static [&'static str], value: &str) -> &'static str {
    allowed
        .iter()
        .copied()
        .find(|a| *a == value)
        .unwrap_or(OTHER)
}

/// A frame-rejection reason if it is short snake_case, else `other`: the caller
/// builds reasons from code, but a reason must never carry frame content.
fn reason_label(reason: &str) -> String {
    let snake_case = !reason.is_empty()
        && reason.len() <= REASON_BYTES_MAX
        && reason
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if snake_case {
        reason.to_owned()
    } else {
        OTHER.to_owned()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    op: &'static str,
    mode: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeOriginLabels {
    scope: String,
    origin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabels {
    scope: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkClassLabels {
    link_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FrameLabels {
    kind: &'static str,
    peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildInfoLabels {
    version: &'static str,
}

/// A gauge holding seconds (fractional).
type SecondsGauge = Gauge<f64, AtomicU64>;

fn new_request_histogram() -> Histogram {
    Histogram::new(REQUEST_DURATION_BUCKETS_SECONDS)
}

/// The metrics of one replica process, with typed handles. Share as
/// `Arc<NodeMetrics>`; all methods take `&self`.
#[derive(Debug)]
pub struct NodeMetrics {
    /// Owns every metric below (they are shared handles) for [`NodeMetrics::encode`];
    /// never mutated after construction.
    registry: Registry,
    request_duration_seconds: Family<RequestLabels, Histogram>,
    replication_lag_seconds: Family<ScopeOriginLabels, SecondsGauge>,
    watermark_age_seconds: Family<ScopeLabels, SecondsGauge>,
    watermark_sequence: Family<ScopeOriginLabels, Gauge>,
    inflight_bytes: Family<PeerLabels, Gauge>,
    replication_bytes_sent: Family<LinkClassLabels, Counter>,
    replication_frames_sent: Family<FrameLabels, Counter>,
    frames_rejected: Family<ReasonLabels, Counter>,
    connection_attempts: Family<OutcomeLabels, Counter>,
    handshakes_refused: Family<ReasonLabels, Counter>,
    applied: Family<ScopeOriginLabels, Counter>,
    peer_suspected: Family<PeerLabels, Gauge>,
    connections: Family<KindLabels, Gauge>,
    residency_violations: Counter,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeMetrics {
    /// A registry with every metric of [`METRIC_NAMES`] registered, `pangea_up` and
    /// `pangea_build_info` set to 1.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(METRIC_PREFIX);
        // prometheus-client appends the unit to the name (and emits `# UNIT`), adds
        // `_total` to counters and a full stop to help texts.

        let request_duration_seconds = Family::<RequestLabels, Histogram>::new_with_constructor(
            new_request_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "request_duration",
            "Time a replica took to answer a client request, by operation (op), \
             consistency mode and outcome",
            Unit::Seconds,
            request_duration_seconds.clone(),
        );

        let replication_lag_seconds = Family::<ScopeOriginLabels, SecondsGauge>::default();
        registry.register_with_unit(
            "replication_lag",
            "Local time minus the timestamp of this replica's watermark for an origin \
             in a scope (0 if the watermark is ahead of the local clock)",
            Unit::Seconds,
            replication_lag_seconds.clone(),
        );

        let watermark_age_seconds = Family::<ScopeLabels, SecondsGauge>::default();
        registry.register_with_unit(
            "watermark_age",
            "Local time minus this replica's low watermark timestamp (minimum over \
             origins) in a scope: the staleness bound of bounded-staleness reads",
            Unit::Seconds,
            watermark_age_seconds.clone(),
        );

        let watermark_sequence = Family::<ScopeOriginLabels, Gauge>::default();
        registry.register(
            "watermark_sequence",
            "Highest sequence of an origin's stream in a scope applied without gaps",
            watermark_sequence.clone(),
        );

        let inflight_bytes = Family::<PeerLabels, Gauge>::default();
        registry.register_with_unit(
            "inflight",
            "Replication bytes sent to a peer and not yet acknowledged",
            Unit::Bytes,
            inflight_bytes.clone(),
        );

        let replication_bytes_sent = Family::<LinkClassLabels, Counter>::default();
        registry.register(
            "replication_bytes_sent",
            "Replication frame bytes sent, by link class (intra_region, inter_region, \
             inter_continent)",
            replication_bytes_sent.clone(),
        );

        let replication_frames_sent = Family::<FrameLabels, Counter>::default();
        registry.register(
            "replication_frames_sent",
            "Replication frames sent, by frame kind and peer",
            replication_frames_sent.clone(),
        );

        let frames_rejected = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "frames_rejected",
            "Replication frames received and rejected, by reason",
            frames_rejected.clone(),
        );

        let connection_attempts = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "connection_attempts",
            "Incoming QUIC connection attempts, by what became of them: accepted, retried \
             (address validation), refused_<cap>, handshake_timeout, handshake_failed",
            connection_attempts.clone(),
        );

        let handshakes_refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "handshakes_refused",
            "Incoming handshakes refused, by reason: no_certificate, unknown_ca, expired, \
             revoked, bad_certificate, wrong_alpn (TLS alerts), no_identity (no usable \
             pangea:// identity in an accepted certificate), other",
            handshakes_refused.clone(),
        );

        let applied = Family::<ScopeOriginLabels, Counter>::default();
        registry.register(
            "applied",
            "Row mutations applied from an origin's stream in a scope",
            applied.clone(),
        );

        let peer_suspected = Family::<PeerLabels, Gauge>::default();
        registry.register(
            "peer_suspected",
            "1 if the failure detector suspects the peer, 0 if not",
            peer_suspected.clone(),
        );

        let connections = Family::<KindLabels, Gauge>::default();
        registry.register(
            "connections",
            "Open connections, by kind (peer, client)",
            connections.clone(),
        );

        let residency_violations = Counter::default();
        registry.register(
            "residency_violations",
            "Rows found on this replica outside their placement policy's regions",
            residency_violations.clone(),
        );

        let up: Gauge = Gauge::default();
        up.set(1);
        registry.register("up", "1 while the replica process is running", up);

        let build_info = Family::<BuildInfoLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildInfoLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; the version label is the pangea-node version",
            build_info,
        );

        Self {
            registry,
            request_duration_seconds,
            replication_lag_seconds,
            watermark_age_seconds,
            watermark_sequence,
            inflight_bytes,
            replication_bytes_sent,
            replication_frames_sent,
            frames_rejected,
            connection_attempts,
            handshakes_refused,
            applied,
            peer_suspected,
            connections,
            residency_violations,
        }
    }

    /// Records one client request. `op`, `mode` and `outcome` outside their documented
    /// sets are recorded as `other`. Negative durations count as 0; NaN is dropped
    /// (it would poison the histogram's sum forever).
    pub fn observe_request(&self, op: &str, mode: &str, outcome: &str, seconds: f64) {
        let Some(seconds) = non_negative(seconds) else {
            return;
        };
        let labels = RequestLabels {
            op: closed(OPS, op),
            mode: closed(MODES, mode),
            outcome: closed(OUTCOMES, outcome),
        };
        self.request_duration_seconds
            .get_or_create(&labels)
            .observe(seconds);
    }

    /// Sets now − the watermark timestamp of `origin` in `scope`. A negative lag
    /// (watermark ahead of the local clock) is recorded as 0; NaN is ignored.
    pub fn set_replication_lag(&self, scope: &str, origin: &str, seconds: f64) {
        let Some(seconds) = non_negative(seconds) else {
            return;
        };
        self.replication_lag_seconds
            .get_or_create(&scope_origin(scope, origin))
            .set(seconds);
    }

    /// Sets now − the low watermark timestamp of `scope`. Negative is recorded as 0;
    /// NaN is ignored.
    pub fn set_watermark_age(&self, scope: &str, seconds: f64) {
        let Some(seconds) = non_negative(seconds) else {
            return;
        };
        self.watermark_age_seconds
            .get_or_create(&ScopeLabels {
                scope: scope.to_owned(),
            })
            .set(seconds);
    }

    /// Sets the watermark sequence of `origin` in `scope`.
    pub fn set_watermark_sequence(&self, scope: &str, origin: &str, seq: i64) {
        self.watermark_sequence
            .get_or_create(&scope_origin(scope, origin))
            .set(seq);
    }

    /// Sets the unacknowledged replication bytes to `peer`.
    pub fn set_inflight_bytes(&self, peer: &str, bytes: i64) {
        self.inflight_bytes
            .get_or_create(&PeerLabels {
                peer: peer.to_owned(),
            })
            .set(bytes);
    }

    /// Adds replication bytes sent over a link of `link_class` (intra_region,
    /// inter_region, inter_continent; anything else is recorded as `other`).
    pub fn add_bytes_sent(&self, link_class: &str, bytes: u64) {
        let labels = LinkClassLabels {
            link_class: closed(LINK_CLASSES, link_class),
        };
        self.replication_bytes_sent
            .get_or_create(&labels)
            .inc_by(bytes);
    }

    /// Counts one replication frame of `kind` sent to `peer` (kinds outside the
    /// documented set are recorded as `other`).
    pub fn inc_frames_sent(&self, kind: &str, peer: &str) {
        let labels = FrameLabels {
            kind: closed(FRAME_KINDS, kind),
            peer: peer.to_owned(),
        };
        self.replication_frames_sent.get_or_create(&labels).inc();
    }

    /// Counts one incoming connection attempt by its outcome (a fixed name).
    pub fn inc_connection_attempts(&self, outcome: &'static str) {
        self.connection_attempts
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Counts one refused handshake; `reason` as [`Self::inc_frames_rejected`]'s.
    pub fn inc_handshakes_refused(&self, reason: &str) {
        self.handshakes_refused
            .get_or_create(&ReasonLabels {
                reason: reason_label(reason),
            })
            .inc();
    }

    /// Counts one rejected frame. `reason` is a snake_case name chosen by the caller
    /// (`unknown_scope`, `malformed`, ...); anything else is recorded as `other`.
    pub fn inc_frames_rejected(&self, reason: &str) {
        self.frames_rejected
            .get_or_create(&ReasonLabels {
                reason: reason_label(reason),
            })
            .inc();
    }

    /// Counts one row mutation applied from `origin`'s stream in `scope`.
    pub fn inc_applied(&self, scope: &str, origin: &str) {
        self.applied
            .get_or_create(&scope_origin(scope, origin))
            .inc();
    }

    /// Sets whether `peer` is suspected by the failure detector.
    /// Drops the per-peer series of a peer that left the deployment, so a removed
    /// replica neither stays "suspected" nor keeps its last in-flight bytes.
    pub fn forget_peer(&self, peer: &str) {
        let labels = PeerLabels {
            peer: peer.to_owned(),
        };
        self.peer_suspected.remove(&labels);
        self.inflight_bytes.remove(&labels);
    }

    pub fn set_peer_suspected(&self, peer: &str, suspected: bool) {
        self.peer_suspected
            .get_or_create(&PeerLabels {
                peer: peer.to_owned(),
            })
            .set(i64::from(suspected));
    }

    /// Sets the number of open connections of `kind` (peer, client; anything else is
    /// recorded as `other`).
    pub fn set_connections(&self, kind: &str, n: i64) {
        self.connections
            .get_or_create(&KindLabels {
                kind: closed(CONNECTION_KINDS, kind),
            })
            .set(n);
    }

    /// Counts one row found outside its placement's regions (placement audit).
    pub fn inc_residency_violation(&self) {
        self.residency_violations.inc();
    }

    /// The OpenMetrics text exposition, ending with `# EOF`. Serve it with
    /// [`OPENMETRICS_CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        match self.try_encode() {
            Ok(text) => text,
            // Unreachable in practice: writing into a `String` cannot fail, and
            // prometheus-client only reports writer errors. An empty exposition is
            // still a valid one, so a scrape sees "no data" instead of broken text.
            Err(fmt::Error) => {
                tracing::error!("encoding metrics failed; serving an empty exposition");
                "# EOF\n".to_owned()
            }
        }
    }

    fn try_encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

fn scope_origin(scope: &str, origin: &str) -> ScopeOriginLabels {
    ScopeOriginLabels {
        scope: scope.to_owned(),
        origin: origin.to_owned(),
    }
}

/// `v` clamped at 0, or `None` for NaN. Infinity is kept: it lands in `+Inf`.
fn non_negative(v: f64) -> Option<f64> {
    if v.is_nan() { None } else { Some(v.max(0.0)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe_everything(m: &NodeMetrics) {
        m.observe_request("get", "eventual", "ok", 0.003);
        m.set_replication_lag("eu", "r1", 0.25);
        m.set_watermark_age("eu", 0.5);
        m.set_watermark_sequence("eu", "r1", 42);
        m.set_inflight_bytes("r2", 4096);
        m.add_bytes_sent("inter_region", 1500);
        m.inc_frames_sent("mutations", "r2");
        m.inc_frames_rejected("unknown_scope");
        m.inc_connection_attempts("retried");
        m.inc_handshakes_refused("no_certificate");
        m.inc_applied("eu", "r1");
        m.set_peer_suspected("r3", true);
        m.set_connections("peer", 3);
        m.inc_residency_violation();
    }

    /// The sample names of an exposition (no comments, no labels).
    fn sample_names(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect()
    }

    #[test]
    fn every_listed_name_is_exported_after_one_observation_each() {
        let m = NodeMetrics::new();
        observe_everything(&m);
        let text = m.encode();
        let samples = sample_names(&text);
        for name in METRIC_NAMES {
            assert!(
                text.contains(&format!("# HELP {} ", name.trim_end_matches("_total"))),
                "no help text for {name}:\n{text}"
            );
            assert!(
                samples
                    .iter()
                    .any(|s| s == name || s.strip_prefix(name).is_some_and(|r| r == "_bucket")),
                "{name} has no sample:\n{text}"
            );
        }
        // And nothing is exported that the list does not name.
        for sample in samples {
            assert!(
                is_exported_series(sample),
                "{sample} is missing from METRIC_NAMES"
            );
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn closed_label_sets_map_unknown_values_to_other() {
        let m = NodeMetrics::new();
        m.observe_request("user:1234", "eventual", "ok", 0.001);
        m.add_bytes_sent("moon", 1);
        m.inc_frames_rejected("Key=\"secret\"\n");
        m.inc_frames_rejected(&"x".repeat(REASON_BYTES_MAX + 1));
        let text = m.encode();
        assert!(!text.contains("user:1234"));
        assert!(!text.contains("secret"));
        assert!(
            text.contains(r#"op="other",mode="eventual",outcome="ok""#),
            "{text}"
        );
        assert!(text.contains(r#"pangea_replication_bytes_sent_total{link_class="other"} 1"#));
        assert!(
            text.contains(r#"pangea_frames_rejected_total{reason="other"} 2"#),
            "{text}"
        );
    }

    #[test]
    fn nan_is_dropped_and_negative_is_zero() {
        let m = NodeMetrics::new();
        m.observe_request("get", "eventual", "ok", f64::NAN);
        m.observe_request("get", "eventual", "ok", -1.0);
        m.set_replication_lag("eu", "r1", -3.0);
        let text = m.encode();
        assert!(!text.contains("NaN"), "{text}");
        assert!(text.contains(
            r#"pangea_request_duration_seconds_count{op="get",mode="eventual",outcome="ok"} 1"#
        ));
        assert!(text.contains(r#"pangea_replication_lag_seconds{scope="eu",origin="r1"} 0.0"#));
    }

    #[test]
    fn exported_series_accepts_histogram_suffixes_only_for_histograms() {
        assert!(is_exported_series("pangea_request_duration_seconds_bucket"));
        assert!(is_exported_series("pangea_applied_total"));
        assert!(!is_exported_series("pangea_applied"));
        assert!(!is_exported_series("pangea_applied_total_bucket"));
        assert!(!is_exported_series("pangea_request_duration_seconds_max"));
    }
}
