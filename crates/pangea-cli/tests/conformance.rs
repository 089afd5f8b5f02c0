//! The conformance vectors under `conformance/`, which any client, in any
//! language, runs to check itself against the protocol (docs/protocol.md;
//! conformance/README.md says how):
//!
//! - `routing.json`: a deployment, a client's state and a read → the plan
//!   (`pangea_core::read::plan_read_at`, what `pangea-client` plans with);
//! - `exchanges.json`: request frames, byte for byte → what a replica answers
//!   (run against a real single-replica cluster).
//!
//! Without `PANGEA_BLESS` the test checks every vector; with `PANGEA_BLESS=1` it
//! rewrites the expectations from what the code does now (then read the diff:
//! a changed vector is a changed protocol).

mod common;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use pangea_core::hlc::Timestamp;
use pangea_core::location::{Location, LocationEntry};
use pangea_core::read::{Consistency, PeerView, ReadRequest, plan_read_at};
use pangea_core::{ReplicaId, ScopeId, Token};
use pangea_proto::Message as _;
use pangea_proto::v1 as pb;
use pangea_topology::{Deployment, RegionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn blessing() -> bool {
    std::env::var_os("PANGEA_BLESS").is_some_and(|v| v == "1")
}

/// Writes `value` to `path` as the vectors are kept: pretty JSON, a newline at
/// the end.
fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    std::fs::write(path, text)?;
    Ok(())
}

// ---------------------------------------------------------------- routing

#[derive(Debug, Serialize, Deserialize)]
struct RoutingFile {
    format: u32,
    about: String,
    deployments: BTreeMap<String, DeploymentFiles>,
    cases: Vec<RoutingCase>,
}

#[derive(Debug, Serialize, Deserialize)]
struct DeploymentFiles {
    topology: String,
    placement: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct RoutingCase {
    name: String,
    deployment: String,
    client_region: String,
    app_profile: String,
    table: String,
    key: String,
    consistency: Mode,
    /// The wall clock (Unix ms) bounded reads are judged at; default 1.7e12.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    now_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    location: Vec<Entry>,
    #[serde(default, skip_serializing_if = "View::is_empty")]
    view: View,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expect: Option<Expect>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
enum Mode {
    Eventual,
    RowAffinity,
    Watermark { token: TokenJson },
    Bounded { max_staleness_ms: u64 },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TokenJson {
    scope: String,
    origin: String,
    sequence: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    table: String,
    prefix: String,
    policy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    home: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    migrating_to: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct View {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    rtt_ms: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    down: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    covers: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    freshness_ms: BTreeMap<String, u64>,
}

impl View {
    fn is_empty(&self) -> bool {
        self.rtt_ms.is_empty()
            && self.down.is_empty()
            && self.covers.is_empty()
            && self.freshness_ms.is_empty()
    }
}

impl PeerView for View {
    fn rtt_ms(&self, r: &ReplicaId) -> Option<f64> {
        self.rtt_ms.get(r.as_str()).copied()
    }
    fn is_down(&self, r: &ReplicaId) -> bool {
        self.down.contains(r.as_str())
    }
    fn covers(&self, r: &ReplicaId, _: &Token) -> bool {
        self.covers.contains(r.as_str())
    }
    fn freshness(&self, r: &ReplicaId, _: &ScopeId) -> Option<Timestamp> {
        self.freshness_ms
            .get(r.as_str())
            .map(|ms| Timestamp::new(*ms, 0))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Expect {
    Plan {
        scope: String,
        primary: Vec<(String, String)>,
        fallback: Vec<(String, String)>,
    },
    Error {
        error: String,
    },
}

const NOW_MS: u64 = 1_700_000_000_000;

fn consistency_of(m: &Mode) -> Consistency {
    match m {
        Mode::Eventual => Consistency::Eventual,
        Mode::RowAffinity => Consistency::RowAffinity,
        Mode::Watermark { token } => Consistency::Watermark(Token {
            scope: ScopeId::new(token.scope.as_str()),
            origin: ReplicaId::new(token.origin.as_str()),
            sequence: token.sequence,
            timestamp: Timestamp::ZERO,
        }),
        Mode::Bounded { max_staleness_ms } => Consistency::BoundedStaleness {
            max_ms: *max_staleness_ms,
        },
    }
}

fn plan_of(d: &Deployment, case: &RoutingCase) -> Expect {
    let mut location = Location::new();
    for e in &case.location {
        let prefix = Bytes::from(e.prefix.clone().into_bytes());
        location.set(
            Arc::from(e.table.as_str()),
            prefix.clone(),
            Some(LocationEntry {
                table: Arc::from(e.table.as_str()),
                prefix,
                policy: ScopeId::new(e.policy.as_str()),
                home: e.home.as_deref().map(RegionId::new),
                version: 1,
                migrating_to: e.migrating_to.as_deref().map(ScopeId::new),
                job_id: String::new(),
            }),
        );
    }
    let region = RegionId::new(case.client_region.as_str());
    let consistency = consistency_of(&case.consistency);
    let req = ReadRequest {
        client_region: &region,
        profile: &d.topology.app_profiles[&case.app_profile],
        table: &case.table,
        key: case.key.as_bytes(),
        consistency: &consistency,
        deadline: None,
    };
    let now = case.now_ms.unwrap_or(NOW_MS);
    match plan_read_at(d, &location, &req, &case.view, now) {
        Ok(plan) => {
            let pairs = |cs: &[pangea_core::read::Candidate]| {
                cs.iter()
                    .map(|c| (c.replica.to_string(), c.reason.to_string()))
                    .collect()
            };
            Expect::Plan {
                scope: plan.scope.to_string(),
                primary: pairs(&plan.primary),
                fallback: pairs(&plan.fallback),
            }
        }
        Err(e) => Expect::Error {
            error: match e {
                pangea_core::read::RouteError::NoEligibleReplica { .. } => {
                    "no_eligible_replica".into()
                }
                pangea_core::read::RouteError::TooManyReplicas { .. } => "too_many_replicas".into(),
            },
        },
    }
}

#[test]
fn routing_vectors() -> Result<()> {
    let path = repo("conformance/routing.json");
    let mut file: RoutingFile = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| path.display().to_string())?;
    let mut deployments = BTreeMap::new();
    for (name, f) in &file.deployments {
        let d = Deployment::load(&repo(&f.topology), Some(&repo(&f.placement)))
            .map_err(|p| anyhow::anyhow!("{name}: {p}"))?;
        deployments.insert(name.clone(), d);
    }
    let mut wrong = Vec::new();
    for case in &mut file.cases {
        let d = deployments
            .get(&case.deployment)
            .with_context(|| format!("{}: no deployment {:?}", case.name, case.deployment))?;
        ensure!(
            d.topology.app_profiles.contains_key(&case.app_profile),
            "{}: no app profile {:?}",
            case.name,
            case.app_profile
        );
        let got = plan_of(d, case);
        if blessing() {
            case.expect = Some(got);
        } else if case.expect.as_ref() != Some(&got) {
            wrong.push(format!(
                "{}: expected {:?}, planned {got:?}",
                case.name, case.expect
            ));
        }
    }
    if blessing() {
        write_json(&path, &file)?;
    }
    ensure!(
        wrong.is_empty(),
        "{} of {} routing vectors differ:\n{}",
        wrong.len(),
        file.cases.len(),
        wrong.join("\n")
    );
    Ok(())
}

// -------------------------------------------------------------- exchanges

#[derive(Debug, Serialize, Deserialize)]
struct ExchangeFile {
    format: u32,
    about: String,
    cluster: ExchangeCluster,
    exchanges: Vec<Exchange>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ExchangeCluster {
    topology: String,
    placement: String,
    replica: String,
    region: String,
    app_profile: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Exchange {
    name: String,
    /// The bytes to write on a new bidirectional stream, as hex: a frame (4-byte
    /// big-endian length, then a `ClientRequest`), or bytes that are not one.
    frame: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expect: Option<Answer>,
}

/// What an answer must show; what varies from run to run (timestamps, watermarks)
/// is left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Answer {
    /// `get`, `get_many`, `scan_prefix`, `mutate`, `watermarks`, `error`.
    response: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    served_by: Option<(String, String)>,
    /// An error's code name and a part of its message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message_contains: Option<String>,
    /// Rows answered (a get's row, absent: none), each as its key and its cells'
    /// `[family, column, value]`, UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rows: Option<Vec<RowJson>>,
    /// A scan page's resume key, UTF-8 (empty: the scan is done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resume_key: Option<String>,
    /// A write's token (`TokenV1`) as scope, origin, sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<(String, String, u64)>,
    /// The scopes a watermarks answer lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scopes: Option<Vec<String>>,
}

/// A row as the vectors show it: its key and its cells' `[family, column, value]`.
type RowJson = (String, Vec<(String, String, String)>);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>> {
    ensure!(s.len().is_multiple_of(2), "odd hex length {}", s.len());
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).with_context(|| format!("hex at {i}")))
        .collect()
}

fn utf8(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn rows_of(rows: &[pb::Row]) -> Vec<RowJson> {
    rows.iter()
        .map(|r| {
            let cells = r
                .families
                .iter()
                .flat_map(|f| {
                    f.cells
                        .iter()
                        .map(|c| (f.name.clone(), utf8(&c.column), utf8(&c.value)))
                })
                .collect();
            (utf8(&r.key), cells)
        })
        .collect()
}

fn answer_of(resp: &pb::ClientResponse) -> Answer {
    use pb::client_response::Response as W;
    let mut a = Answer {
        response: String::new(),
        served_by: resp
            .served_by
            .as_ref()
            .map(|s| (s.replica.clone(), s.region.clone())),
        code: None,
        message_contains: None,
        rows: None,
        resume_key: None,
        token: None,
        scopes: None,
    };
    match &resp.response {
        Some(W::Error(e)) => {
            a.response = "error".into();
            a.code = Some(
                pb::error::Code::try_from(e.code)
                    .map_or_else(|_| format!("{}", e.code), |c| c.as_str_name().to_owned()),
            );
            // The message up to its first variable part is what a client may show.
            a.message_contains = Some(e.message.chars().take(40).collect());
        }
        Some(W::Get(g)) => {
            a.response = "get".into();
            a.rows = Some(rows_of(g.row.as_slice()));
        }
        Some(W::GetMany(g)) => {
            a.response = "get_many".into();
            a.rows = Some(rows_of(&g.rows));
        }
        Some(W::ScanPrefix(s)) => {
            a.response = "scan_prefix".into();
            a.rows = Some(rows_of(&s.rows));
            a.resume_key = Some(utf8(&s.resume_key));
        }
        Some(W::Mutate(m)) => {
            a.response = "mutate".into();
            a.token = Token::decode(&m.token)
                .ok()
                .map(|t| (t.scope.to_string(), t.origin.to_string(), t.sequence));
        }
        Some(W::Watermarks(w)) => {
            a.response = "watermarks".into();
            a.scopes = Some(w.scopes.iter().map(|s| s.scope.clone()).collect());
        }
        other => a.response = format!("{other:?}").chars().take(40).collect(),
    }
    a
}

/// Whether `got` shows what `want` asks: every field `want` gives is equal (the
/// message: contains `want`'s part); fields it leaves out are not checked.
fn shows(got: &Answer, want: &Answer) -> bool {
    fn given<T: PartialEq>(want: &Option<T>, got: &Option<T>) -> bool {
        want.is_none() || want == got
    }
    let message_ok = match (&want.message_contains, &got.message_contains) {
        (Some(w), Some(g)) => g.contains(w.as_str()),
        (None, _) => true,
        (Some(_), None) => false,
    };
    message_ok
        && want.response == got.response
        && given(&want.served_by, &got.served_by)
        && given(&want.code, &got.code)
        && given(&want.rows, &got.rows)
        && given(&want.resume_key, &got.resume_key)
        && given(&want.token, &got.token)
        && given(&want.scopes, &got.scopes)
}

/// The exchanges the vectors are written from (with `PANGEA_BLESS=1`), in order
/// on a fresh single-replica cluster: the writes first, then what reads them.
fn exchanges_to_write(profile: &str) -> Vec<(&'static str, Vec<u8>)> {
    use pb::client_request::Request as R;
    let frame = |r: Option<R>, app_profile: &str| {
        let req = pb::ClientRequest {
            deadline_us: 2_000_000,
            app_profile: app_profile.to_owned(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: r,
        };
        let body = req.encode_to_vec();
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&body);
        f
    };
    let req = |r: R| frame(Some(r), profile);
    let consistency = |mode| Some(pb::Consistency { mode: Some(mode) });
    let get = |key: &[u8], c: Option<pb::Consistency>| {
        R::Get(pb::GetRequest {
            table: "ad_profiles".into(),
            row_key: Bytes::copy_from_slice(key),
            filter: None,
            consistency: c,
        })
    };
    let set = |key: &str, value: &str| {
        common::set_cell("ad_profiles", key.as_bytes(), "profile", b"p", value.into())
    };
    let token = |sequence| {
        Token {
            scope: ScopeId::new("global"),
            origin: ReplicaId::new("solo"),
            sequence,
            timestamp: Timestamp::ZERO,
        }
        .encode()
    };
    use pb::consistency::Mode;
    vec![
        (
            "mutate: set a cell; the answer is the write's token",
            req(set("conf/1", "hello")),
        ),
        ("mutate: a second row", req(set("conf/2", "world"))),
        ("get: eventual", req(get(b"conf/1", None))),
        (
            "get: a row that does not exist (no row in the answer)",
            req(get(b"conf/0", None)),
        ),
        (
            "get: watermark read with the first write's token (sequence 1)",
            req(get(b"conf/1", consistency(Mode::WatermarkToken(token(1))))),
        ),
        (
            "get: watermark read of a write not yet applied: NOT_COVERED",
            req(get(
                b"conf/1",
                consistency(Mode::WatermarkToken(token(1_000_000))),
            )),
        ),
        (
            "get: bounded staleness, 60 s",
            req(get(
                b"conf/2",
                consistency(Mode::BoundedStalenessMs(60_000)),
            )),
        ),
        (
            "get-many: rows in request order, a missing one as its key alone",
            req(R::GetMany(pb::GetManyRequest {
                table: "ad_profiles".into(),
                row_keys: vec!["conf/2".into(), "conf/0".into(), "conf/1".into()],
                ..Default::default()
            })),
        ),
        (
            "scan: one row per page, with a resume key",
            req(R::ScanPrefix(pb::ScanPrefixRequest {
                table: "ad_profiles".into(),
                prefix: "conf/".into(),
                limit: 1,
                ..Default::default()
            })),
        ),
        (
            "scan: resumed after conf/1, the last page",
            req(R::ScanPrefix(pb::ScanPrefixRequest {
                table: "ad_profiles".into(),
                prefix: "conf/".into(),
                limit: 10,
                resume_after: "conf/1".into(),
                ..Default::default()
            })),
        ),
        (
            "mutate: delete the row conf/2",
            req(R::Mutate(pb::MutateRequest {
                mutation: Some(pb::RowMutation {
                    event_time_ms: None,
                    table: "ad_profiles".into(),
                    row_key: "conf/2".into(),
                    mutations: vec![pb::Mutation {
                        kind: Some(pb::mutation::Kind::DeleteFromRow(
                            pb::mutation::DeleteFromRow {},
                        )),
                    }],
                }),
                ..Default::default()
            })),
        ),
        ("get: the deleted row is gone", req(get(b"conf/2", None))),
        (
            "watermarks: every scope of the replica",
            req(R::Watermarks(pb::WatermarkRequest {
                scope: String::new(),
            })),
        ),
        (
            "get: unknown table: NOT_FOUND",
            req(R::Get(pb::GetRequest {
                table: "no_such_table".into(),
                row_key: "k".into(),
                ..Default::default()
            })),
        ),
        (
            "mutate: unknown family: NOT_FOUND",
            req(common::set_cell(
                "ad_profiles",
                b"conf/3",
                "no_such_family",
                b"c",
                b"v".to_vec(),
            )),
        ),
        (
            "get: a 4097-byte row key: INVALID_ARGUMENT",
            req(get(&[b'k'; 4097], None)),
        ),
        (
            "an envelope without a request: INVALID_ARGUMENT",
            frame(None, profile),
        ),
        (
            "an app profile the topology does not have: POLICY_FORBIDS",
            frame(Some(get(b"conf/1", None)), "no-such-profile"),
        ),
        (
            "a frame longer than 17 MiB: INVALID_ARGUMENT before its body is read",
            vec![0x01, 0x10, 0x00, 0x01],
        ),
        (
            "a body that is not a ClientRequest: INVALID_ARGUMENT",
            vec![0x00, 0x00, 0x00, 0x03, 0xff, 0xff, 0xff],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_vectors() -> Result<()> {
    let path = repo("conformance/exchanges.json");
    let mut file: ExchangeFile = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| path.display().to_string())?;
    if blessing() {
        file.exchanges = exchanges_to_write(&file.cluster.app_profile)
            .into_iter()
            .map(|(name, frame)| Exchange {
                name: name.to_owned(),
                frame: hex(&frame),
                expect: None,
            })
            .collect();
    }
    let cluster = common::Cluster::up_with(&file.cluster.topology, &file.cluster.placement, false)?;
    let result = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let raw = cluster.raw_client(&file.cluster.app_profile)?;
        let addr = cluster.replica(&file.cluster.replica)?.address.parse()?;
        let conn = raw.connect(addr, &file.cluster.replica).await?;
        let mut wrong = Vec::new();
        for x in &mut file.exchanges {
            let bytes = unhex(&x.frame).with_context(|| x.name.clone())?;
            let Some(resp) = common::call_bytes(&conn, &bytes).await? else {
                bail!("{}: the replica ended the stream without an answer", x.name);
            };
            let got = answer_of(&resp);
            match &x.expect {
                _ if blessing() => x.expect = Some(got),
                Some(want) if shows(&got, want) => {}
                want => wrong.push(format!("{}: expected {want:?}, answered {got:?}", x.name)),
            }
        }
        ensure!(
            wrong.is_empty(),
            "{} of {} exchanges differ:\n{}",
            wrong.len(),
            file.exchanges.len(),
            wrong.join("\n")
        );
        anyhow::Ok(())
    })
    .await
    .context("the exchanges timed out");
    cluster.down(2_000)?;
    result??;
    if blessing() {
        write_json(&path, &file)?;
    }
    Ok(())
}
