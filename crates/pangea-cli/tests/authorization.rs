//! Who may do what, from the attacker's side, on a real local cluster
//! (docs/operations.md "Who may do what"; issue 30): every identity kind against
//! every request kind, then replays of the attacks that once destroyed rows or broke
//! residency with an ordinary frontend certificate or an operator's typo. Each
//! replay checks that no replica lost a row or changed a byte.

mod common;

use anyhow::{Context, Result, ensure};
use common::{Cluster, RawClient, call, error_of, eventually, pangea, request, set_cell};
use pangea_core::location::{LOCATION_COLUMN, LOCATION_FAMILY, LocationEntry, location_key};
use pangea_net::{Credential, certs, tls};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use std::collections::BTreeMap;
use std::time::Duration;

const TABLE: &str = "ad_profiles";
const DEADLINE_US: u64 = 5_000_000;

/// A raw QUIC client presenting `credential` from the cluster's certificates.
fn raw(c: &Cluster, credential: &Credential) -> Result<RawClient> {
    let ca = certs::load_ca(&c.file.certs)?;
    let own = certs::load_credential(&c.file.certs, credential)?;
    RawClient::new(tls::client_config(&ca, own)?)
}

/// A raw QUIC client presenting replica `id`'s own certificate.
fn raw_replica(c: &Cluster, id: &str) -> Result<RawClient> {
    let ca = certs::load_ca(&c.file.certs)?;
    let own = certs::load_replica(&c.file.certs, id)?;
    RawClient::new(tls::client_config(&ca, own)?)
}

/// A `MergeRow` of one cell version stamped `(wall_ms, origin)`, into `table`/`key`.
fn merge(
    table: &str,
    key: &[u8],
    state_key: &[u8],
    wall_ms: u64,
    origin: &str,
) -> pb::client_request::Request {
    let state = pb::RowState {
        key: state_key.to_vec().into(),
        tombstone: None,
        families: vec![pb::FamilyState {
            name: if table == TABLE {
                "profile"
            } else {
                LOCATION_FAMILY
            }
            .into(),
            tombstone: None,
            columns: vec![pb::ColumnState {
                qualifier: if table == TABLE {
                    b"p".to_vec()
                } else {
                    LOCATION_COLUMN.to_vec()
                }
                .into(),
                range_tombstones: vec![],
                versions: vec![pb::VersionedValue {
                    version: Some(pb::Version {
                        timestamp: wall_ms << 16,
                        origin: origin.into(),
                    }),
                    value: Some(b"forged".to_vec().into()),
                }],
                folded: vec![],
            }],
        }],
    };
    pb::client_request::Request::Mutate(pb::MutateRequest {
        mutation: Some(pb::RowMutation {
            event_time_ms: None,
            table: table.into(),
            row_key: key.to_vec().into(),
            mutations: vec![pb::Mutation {
                kind: Some(pb::mutation::Kind::MergeRow(pb::mutation::MergeRow {
                    state: Some(state),
                })),
            }],
        }),
        ..Default::default()
    })
}

/// The attack's entry: every row of the table under a policy that does not exist.
fn forged_entry(prefix: &[u8], policy: &str) -> pb::client_request::Request {
    let e = LocationEntry {
        table: TABLE.into(),
        prefix: prefix.to_vec().into(),
        policy: policy.into(),
        home: None,
        version: 99,
        migrating_to: None,
        job_id: "forged".into(),
    };
    set_cell(
        "_location",
        &location_key(TABLE, prefix),
        LOCATION_FAMILY,
        LOCATION_COLUMN,
        e.to_proto().encode_to_vec(),
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What one request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Served,
    /// Refused by authorization: `PolicyForbids` naming who and what is missing.
    Denied,
    /// Refused as invalid input (a forged merge, say).
    Invalid,
    /// The replica closed the connection (a certificate of the wrong role).
    Closed,
}

/// A batch write (`MutateRows`) of `table` carrying the rows of single-row writes.
fn batch(table: &str, rows: Vec<pb::client_request::Request>) -> pb::client_request::Request {
    pb::client_request::Request::MutateRows(pb::MutateRowsRequest {
        table: table.into(),
        rows: rows
            .into_iter()
            .map(|r| match r {
                pb::client_request::Request::Mutate(m) => m.mutation.expect("a mutation"),
                other => panic!("not a write: {other:?}"),
            })
            .collect(),
        ..Default::default()
    })
}

async fn ask(conn: &quinn::Connection, r: pb::client_request::Request) -> Answer {
    match call(conn, &request("frontend", DEADLINE_US, r)).await {
        Err(_) => Answer::Closed,
        Ok(resp) => {
            // A batch is served when every row is; else its first refused row says.
            let row_error = match &resp.response {
                Some(pb::client_response::Response::MutateRows(b)) => {
                    b.rows.iter().find_map(|o| o.error.clone())
                }
                _ => None,
            };
            let error = row_error
                .map(|e| {
                    (
                        pb::error::Code::try_from(e.code).unwrap_or_default(),
                        e.message,
                    )
                })
                .or_else(|| error_of(&resp).map(|(code, m)| (code, m.to_owned())));
            match error {
                None => Answer::Served,
                Some((pb::error::Code::PolicyForbids, m)) if m.contains(" may not ") => {
                    Answer::Denied
                }
                Some((pb::error::Code::InvalidArgument, _)) => Answer::Invalid,
                Some((code, m)) => panic!("unexpected answer {code:?}: {m}"),
            }
        }
    }
}

/// Rows per replica per table, and every scope's digest, from the operator's audit:
/// what "no replica lost a row or changed a byte" compares.
async fn holdings(c: &Cluster, op: &pangea_client::Client) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for id in c.ids() {
        let a = op.audit(&id.as_str().into()).await?;
        let tables: Vec<String> = a
            .tables
            .iter()
            .map(|t| format!("{}={}/{}", t.table, t.rows, t.rows_disallowed))
            .collect();
        let scopes: Vec<String> = a
            .scopes
            .iter()
            .map(|s| format!("{}:{}:{}", s.scope, s.rows, hex(&s.digest)))
            .collect();
        out.insert(id, format!("{} | {}", tables.join(","), scopes.join(",")));
    }
    Ok(out)
}

/// Writes one small profile under each of `keys`, as the frontend.
async fn write_rows(fe: &pangea_client::Client, keys: impl Iterator<Item = String>) -> Result<()> {
    for key in keys {
        let m = common::profile_set(key, &b"v"[..])?;
        fe.mutate(m, &common::setup_writes()).await?;
    }
    Ok(())
}

/// Waits until every replica holds what it may — `eu` rows in the EU, `elsewhere`
/// rows anywhere else, none it may not — and returns what each holds.
async fn replicated(
    c: &Cluster,
    op: &pangea_client::Client,
    eu: usize,
    elsewhere: usize,
) -> Result<BTreeMap<String, String>> {
    eventually(
        Duration::from_secs(20),
        Duration::from_millis(200),
        "rows replicated",
        || async {
            let h = holdings(c, op).await?;
            let full = h.iter().all(|(id, s)| {
                let want = if c.region_of(id) == Some(common::EU) {
                    eu
                } else {
                    elsewhere
                };
                s.starts_with(&format!("{TABLE}={want}/0"))
            });
            Ok(full.then_some(h))
        },
    )
    .await
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn every_identity_against_every_request_then_the_attacks_replayed() -> Result<()> {
    let c = Cluster::up(false)?;
    let rt = common::runtime()?;
    rt.block_on(async {
        // Rows to lose: 200 global, 100 EU-resident.
        let fe = c.client(common::US, "frontend").await?;
        let op = c.operator(common::US).await?;
        write_rows(
            &fe,
            (0..300).map(|i| {
                if i < 200 {
                    format!("us/{i:04}")
                } else {
                    format!("eu/{i:04}")
                }
            }),
        )
        .await?;
        // Replicated everywhere it may be: EU replicas hold the EU-resident rows too.
        let before = replicated(&c, &op, 300, 200).await?;

        // ---- The matrix, at a replica of both global and eu-resident (where a
        // placement move into eu-resident may run) ----
        let (at, addr) = ("euw1-a", c.addr("euw1-a")?);
        let client = raw(&c, &Credential::Client("client-frontend".into()))?
            .connect(addr, at)
            .await?;
        let loader = raw(&c, &Credential::Loader("loader-frontend".into()))?
            .connect(addr, at)
            .await?;
        let operator = raw(&c, &Credential::Operator("operator".into()))?
            .connect(addr, at)
            .await?;
        let now = now_ms();
        let requests: Vec<(&str, pb::client_request::Request)> = vec![
            ("get", common::get_request(TABLE, b"us/0001", None)),
            (
                "set",
                set_cell(TABLE, b"us/0001", "profile", b"p", b"w".to_vec()),
            ),
            (
                "increment",
                common::increment(TABLE, b"us/0001", "impressions", b"c1", 1),
            ),
            (
                "increment _jobs",
                common::increment("_jobs", b"x", "j", b"s", 1),
            ),
            ("set _location", forged_entry(b"", "nope")),
            (
                "set _jobs",
                set_cell("_jobs", b"x", "j", b"s", b"job".to_vec()),
            ),
            ("merge", merge(TABLE, b"us/0002", b"us/0002", now, "euw1-a")),
            (
                "batch",
                batch(
                    TABLE,
                    vec![
                        set_cell(TABLE, b"us/0001", "profile", b"p", b"b".to_vec()),
                        common::increment(TABLE, b"us/0002", "impressions", b"c1", 1),
                    ],
                ),
            ),
            (
                "batch _location",
                batch("_location", vec![forged_entry(b"", "nope")]),
            ),
            (
                "batch merge",
                batch(
                    TABLE,
                    vec![merge(TABLE, b"us/0002", b"us/0002", now, "euw1-a")],
                ),
            ),
            (
                "merge _location",
                merge(
                    "_location",
                    &location_key(TABLE, b""),
                    &location_key(TABLE, b""),
                    now,
                    "euw1-a",
                ),
            ),
            (
                "watermarks",
                pb::client_request::Request::Watermarks(pb::WatermarkRequest {
                    scope: String::new(),
                }),
            ),
            (
                "deployment",
                pb::client_request::Request::Deployment(pb::DeploymentRequest {}),
            ),
            (
                "location changes",
                pb::client_request::Request::LocationChanges(pb::LocationChangesRequest {
                    cursor: Default::default(),
                    limit: 10,
                }),
            ),
            (
                "changes",
                pb::client_request::Request::Changes(pb::ChangesRequest {
                    table: TABLE.into(),
                    from_earliest: true,
                    limit: 10,
                    ..Default::default()
                }),
            ),
            (
                "changes as a registered reader",
                pb::client_request::Request::Changes(pb::ChangesRequest {
                    table: TABLE.into(),
                    limit: 10,
                    reader: "auth-test".into(),
                    ..Default::default()
                }),
            ),
            (
                "changes _jobs",
                pb::client_request::Request::Changes(pb::ChangesRequest {
                    table: "_jobs".into(),
                    from_earliest: true,
                    limit: 10,
                    ..Default::default()
                }),
            ),
            (
                "scan _jobs",
                pb::client_request::Request::ScanPrefix(pb::ScanPrefixRequest {
                    table: "_jobs".into(),
                    limit: 10,
                    ..Default::default()
                }),
            ),
            (
                "audit",
                pb::client_request::Request::Audit(pb::AuditRequest {}),
            ),
            (
                "reload",
                pb::client_request::Request::Reload(pb::ReloadRequest {}),
            ),
            (
                "placement move",
                pb::client_request::Request::PlacementMove(pb::PlacementMoveRequest {
                    table: TABLE.into(),
                    prefix: b"mv/".to_vec().into(),
                    to_policy: "eu-resident".into(),
                    home_region: String::new(),
                }),
            ),
        ];
        use Answer::*;
        // Rows as `requests`; columns: client, loader, operator (docs/operations.md).
        #[rustfmt::skip]
        let expected = [
            /* get             */ [Served,     Served,     Denied],
            /* set             */ [Served,     Served,     Denied],
            /* increment       */ [Served,     Served,     Denied],
            /* increment _jobs */ [Denied, Denied, Denied],
            /* set _location   */ [Denied, Denied, Denied],
            /* set _jobs       */ [Denied, Denied, Denied],
            /* merge           */ [Denied, Served,     Denied],
            /* batch           */ [Served,     Served,     Denied],
            /* batch _location */ [Denied, Denied, Denied],
            /* batch merge     */ [Denied, Served,     Denied],
            /* merge _location */ [Denied, Denied, Denied],
            /* watermarks      */ [Served,     Served,     Served],
            /* deployment      */ [Served,     Served,     Served],
            /* location changes*/ [Served,     Served,     Served],
            /* changes         */ [Served,     Served,     Denied],
            /* changes reader  */ [Denied, Served,     Denied],
            /* changes _jobs   */ [Denied, Denied, Invalid],
            /* scan _jobs      */ [Denied, Denied, Served],
            /* audit           */ [Denied, Denied, Served],
            /* reload          */ [Denied, Denied, Served],
            /* placement move  */ [Denied, Denied, Served],
        ];
        for ((what, r), want) in requests.iter().zip(expected) {
            for (conn, who, want) in [
                (&client, "client", want[0]),
                (&loader, "loader", want[1]),
                (&operator, "operator", want[2]),
            ] {
                let got = ask(conn, r.clone()).await;
                ensure!(got == want, "{who} / {what}: {got:?}, expected {want:?}");
            }
        }
        // A replica certificate making a client request: the connection is closed,
        // and the reason says why.
        let rogue = raw_replica(&c, "use1-a")?.connect(addr, at).await?;
        ensure!(ask(&rogue, common::get_request(TABLE, b"us/0001", None)).await == Closed);
        let reason = format!("{:?}", rogue.close_reason());
        ensure!(
            reason.contains("replica certificates carry replication only"),
            "{reason}"
        );
        // Nor may it read the deployment's files (the topology names every
        // replica's address): a peer has its own.
        let rogue = raw_replica(&c, "use1-a")?.connect(addr, at).await?;
        let files = pb::client_request::Request::Deployment(pb::DeploymentRequest {});
        ensure!(ask(&rogue, files).await == Closed);
        // Nor the location metadata (a client request like any other).
        let rogue = raw_replica(&c, "use1-a")?.connect(addr, at).await?;
        let changes = pb::client_request::Request::LocationChanges(pb::LocationChangesRequest {
            cursor: Default::default(),
            limit: 10,
        });
        ensure!(ask(&rogue, changes).await == Closed);
        // A client certificate opening a replication link (a Hello on a
        // unidirectional stream, as replicas do): closed too.
        let intruder = raw(&c, &Credential::Client("client-frontend".into()))?
            .connect(addr, at)
            .await?;
        let mut uni = intruder.open_uni().await?;
        let hello = pb::ReplicationFrame {
            frame: Some(pb::replication_frame::Frame::Hello(pb::Hello {
                replica_id: "use1-a".into(),
                region: common::US.into(),
                protocol_version: pangea_proto::PROTOCOL_VERSION,
            })),
        };
        pangea_net::write_frame(&mut uni, &hello).await?;
        let closed = tokio::time::timeout(Duration::from_secs(5), intruder.closed())
            .await
            .context("not closed")?;
        ensure!(
            format!("{closed:?}").contains("may not open a replication link"),
            "{closed:?}"
        );

        // ---- Attack 1: a forged location entry purging every row ----
        // (refused above for every identity; here through every replica too)
        for id in c.ids().into_iter().filter(|id| !id.contains("batch")) {
            let conn = raw(&c, &Credential::Client("client-frontend".into()))?
                .connect(c.addr(&id)?, &id)
                .await?;
            ensure!(
                ask(&conn, forged_entry(b"", "nope")).await == Denied,
                "{id}"
            );
            ensure!(
                ask(&conn, forged_entry(b"eu/", "global")).await == Denied,
                "{id}"
            );
            // Nor smuggled into a batch of a user table: that row alone is refused.
            let smuggled = batch(TABLE, vec![forged_entry(b"", "nope")]);
            ensure!(ask(&conn, smuggled).await == Invalid, "{id}");
        }

        // ---- Attack 2: placement moves ----
        let cluster = c.cluster_path();
        let cluster = cluster.to_str().context("path")?;
        let mv = |credential: Option<&str>, prefix: &str, to: &str| {
            let mut args = vec![
                "placement",
                "move",
                "--cluster",
                cluster,
                "--region",
                common::EU,
                "--prefix",
                prefix,
                "--to",
                to,
            ];
            if let Some(cred) = credential {
                args.extend(["--credential", cred]);
            }
            pangea(&args, Duration::from_secs(30))
        };
        let out = mv(Some("client/client-frontend"), "eu/", "global")?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("an operator certificate is needed"),
            "{err}"
        );
        // As the operator: widening residency is a placement-file change, not a move.
        let out = mv(None, "eu/", "global")?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("widen residency"),
            "{err}"
        );
        // The operator's typo (refused by the client library already, and by the
        // replica: the matrix's raw requests above reach it directly).
        let out = mv(None, "", "nope")?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && err.contains("\"nope\""), "{err}");
        let typo = pb::client_request::Request::PlacementMove(pb::PlacementMoveRequest {
            table: TABLE.into(),
            prefix: Default::default(),
            to_policy: "nope".into(),
            home_region: String::new(),
        });
        ensure!(ask(&operator, typo).await == Invalid);

        // ---- Attack 3: a version from 2100, attributed to another replica ----
        // First let the matrix's two writes reach everyone: every replica shows the
        // same digest of the global scope.
        let settled = eventually(
            Duration::from_secs(20),
            Duration::from_millis(200),
            "the matrix's writes replicated",
            || async {
                let h = holdings(&c, &op).await?;
                let global: std::collections::BTreeSet<&str> = h
                    .values()
                    .filter_map(|s| {
                        s.split([',', '|'])
                            .map(str::trim)
                            .find(|p| p.starts_with("global:"))
                    })
                    .collect();
                Ok((global.len() == 1).then_some(h.clone()))
            },
        )
        .await?;
        let in_2100 = 4_102_444_800_000;
        ensure!(
            ask(
                &loader,
                merge(TABLE, b"us/0003", b"us/0003", in_2100, "euw1-a")
            )
            .await
                == Invalid
        );
        ensure!(
            ask(
                &loader,
                merge(TABLE, b"us/0003", b"us/0003", u64::MAX >> 16, "euw1-a")
            )
            .await
                == Invalid
        );
        ensure!(
            ask(
                &loader,
                merge(TABLE, b"us/0003", b"us/9999", now_ms(), "euw1-a")
            )
            .await
                == Invalid
        );
        ensure!(
            ask(
                &loader,
                merge(TABLE, b"us/0003", b"us/0003", now_ms(), "mallory")
            )
            .await
                == Invalid
        );
        ensure!(
            ask(
                &client,
                merge(TABLE, b"us/0003", b"us/0003", in_2100, "euw1-a")
            )
            .await
                == Denied
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let unchanged = holdings(&c, &op).await?;
        ensure!(
            unchanged == settled,
            "a refused merge changed a replica: {settled:?} -> {unchanged:?}"
        );

        // No replica lost a row or changed a byte, except the two rows the matrix
        // wrote (us/0001 set, us/0002 merged and counted) — compare without them.
        let after = holdings(&c, &op).await?;
        for (id, b) in &before {
            let a = &after[id];
            let rows = |s: &str| s.split(" | ").next().unwrap_or_default().to_owned();
            ensure!(rows(a) == rows(b), "{id}: rows {b} -> {a}");
        }
        // The residency audit agrees.
        let out = pangea(
            &[
                "placement",
                "audit",
                "--cluster",
                cluster,
                "--region",
                common::US,
            ],
            Duration::from_secs(30),
        )?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );

        // ---- The audit log ----
        let log = std::fs::read_to_string(c.replica(at)?.data_dir.join("audit.log"))?;
        let lines: Vec<serde_json::Value> = log
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        let has = |kind: &str, action: &str, outcome: &str| {
            lines.iter().any(|l| {
                l["principal"]["kind"] == kind && l["action"] == action && l["outcome"] == outcome
            })
        };
        ensure!(has("operator", "placement_move", "ok"), "{log}");
        ensure!(has("client", "placement_move", "denied"), "{log}");
        ensure!(has("operator", "reload", "ok"), "{log}");
        ensure!(has("client", "write", "denied"), "{log}");
        ensure!(
            has("loader", "merge", "ok") && has("loader", "merge", "denied"),
            "{log}"
        );
        ensure!(!log.contains("us/0"), "the audit log carries no keys");
        anyhow::Ok(())
    })?;
    c.down(common::CLEANUP_GRACE_MS)?;
    Ok(())
}

/// A replica refuses to start with a certificate that is not its own: a client's,
/// or another replica's.
#[test]
fn a_replica_refuses_a_certificate_that_is_not_its_own() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let certs_dir = dir.path().join("certs");
    certs::init_ca(&certs_dir)?;
    certs::issue_client(&certs_dir, "client-frontend", "frontend")?;
    certs::issue_replica(&certs_dir, "other", "local")?;
    let topology = common::repo_file("topology/single-replica.toml");
    let own = certs::replica_cert_path(&certs_dir, "solo");
    std::fs::create_dir_all(own.parent().context("parent")?)?;
    for (from, holds) in [
        (
            certs::client_cert_path(&certs_dir, "client-frontend"),
            "client client-frontend",
        ),
        (
            certs::replica_cert_path(&certs_dir, "other"),
            "replica other",
        ),
    ] {
        std::fs::copy(&from, &own)?;
        std::fs::copy(from.with_extension("key"), own.with_extension("key"))?;
        let out = pangea(
            &[
                "start",
                "--topology",
                topology.to_str().context("path")?,
                "--replica",
                "solo",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                dir.path().join("data").to_str().context("path")?,
                "--certs",
                certs_dir.to_str().context("path")?,
            ],
            Duration::from_secs(20),
        )?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success(),
            "started with the certificate of {holds}"
        );
        ensure!(
            err.contains(&format!("holds the identity of {holds}"))
                && err.contains("not of replica solo"),
            "{err}"
        );
    }
    Ok(())
}

/// An operator's routine apply cannot strand rows: a placement file that drops a
/// policy rows are in is refused by the replicas and the running files are put
/// back; an empty placement file is refused before anything; applying the running
/// files themselves changes nothing and truncates nothing; widening residency or
/// dropping a family needs a flag naming it; rollback restores the previous files.
/// Every row stays.
#[test]
fn applies_that_would_strand_rows_are_refused_and_change_nothing() -> Result<()> {
    let c = Cluster::up(false)?;
    let rt = common::runtime()?;
    rt.block_on(async {
        let fe = c.client(common::EU, "frontend").await?;
        let op = c.operator(common::EU).await?;
        write_rows(
            &fe,
            (0..50).map(|i| {
                if i % 2 == 0 {
                    format!("eu/{i:03}")
                } else {
                    format!("us/{i:03}")
                }
            }),
        )
        .await?;
        let before = replicated(&c, &op, 50, 25).await?;
        let dir = c.dir.path();
        let cluster = c.cluster_path();
        let cluster = cluster.to_str().context("path")?;
        let topology = dir.join("topology.toml");
        let placement = dir.join("placement.toml");
        let running = std::fs::read(&placement)?;
        let apply = |placement_file: &std::path::Path| {
            pangea(
                &[
                    "topology",
                    "apply",
                    "--cluster",
                    cluster,
                    topology.to_str().unwrap_or_default(),
                    "--placement",
                    placement_file.to_str().unwrap_or_default(),
                ],
                Duration::from_secs(60),
            )
        };
        // 1. The running files themselves: no change, nothing truncated.
        let out = apply(&placement)?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(
            std::fs::read(&placement)? == running,
            "the running placement file changed"
        );
        // 2. An empty placement file: invalid (the app profiles grant a table it
        // does not define), refused before any replica hears of it.
        let empty = dir.join("empty.placement.toml");
        std::fs::write(&empty, "")?;
        let out = apply(&empty)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("nothing changed"),
            "{err}"
        );
        ensure!(std::fs::read(&placement)? == running);
        // 3. A valid file that drops the policy the eu/ rows are in.
        let text = String::from_utf8(running.clone())?;
        let dropped = dir.join("dropped.placement.toml");
        let kept: String = text
            .split("\n[[")
            .filter(|block| !block.contains("eu-resident") && !block.starts_with("home_rules"))
            .collect::<Vec<_>>()
            .join("\n[[");
        std::fs::write(&dropped, kept)?;
        // Dropping the rule widens eu/ rows' residency: without the flag the CLI
        // refuses; with it, the replicas refuse, as the policy still holds rows.
        let out = apply(&dropped)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && err.contains("--widen-residency ad_profiles:eu/"), "{err}");
        let out = pangea(
            &[
                "topology", "apply", "--cluster", cluster,
                topology.to_str().unwrap_or_default(),
                "--placement", dropped.to_str().unwrap_or_default(),
                "--widen-residency", "ad_profiles:eu/",
            ],
            Duration::from_secs(60),
        )?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("drops policy eu-resident"),
            "{err}"
        );
        ensure!(
            std::fs::read(&placement)? == running,
            "the running placement was not put back"
        );
        // 4. Widening residency (eu/ rows to global) and dropping a column family
        // are refused unless a flag names them; a dry run changes nothing.
        let widened = dir.join("widened.placement.toml");
        std::fs::write(
            &widened,
            text.replace("prefix = \"eu/\"\npolicy = \"eu-resident\"", "prefix = \"eu/\"\npolicy = \"global\""),
        )?;
        ensure!(std::fs::read(&widened)? != running, "the test's edit did not apply");
        let out = apply(&widened)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("--widen-residency ad_profiles:eu/"),
            "{err}"
        );
        let out = pangea(
            &[
                "topology", "apply", "--cluster", cluster,
                topology.to_str().unwrap_or_default(),
                "--placement", widened.to_str().unwrap_or_default(),
                "--widen-residency", "ad_profiles:eu/", "--dry-run",
            ],
            Duration::from_secs(60),
        )?;
        let said = String::from_utf8_lossy(&out.stdout);
        ensure!(out.status.success() && said.contains("dry run: nothing changed"), "{said}");
        let no_events = dir.join("no-events.placement.toml");
        let events =
            "  [[tables.families]]\n  name = \"events\"\n  max_versions = 10\n  ttl = \"30d\"\n";
        ensure!(text.contains(events), "the placement file's events family moved");
        let kept = text.replace(events, "");
        std::fs::write(&no_events, kept)?;
        let out = apply(&no_events)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success()
                && err.contains("--drop-family ad_profiles:events")
                && !err.contains("--widen"),
            "{err}"
        );
        ensure!(std::fs::read(&placement)? == running);
        // 5. A benign change applies, and `topology rollback` puts the file back.
        let homed = dir.join("homed.placement.toml");
        std::fs::write(
            &homed,
            format!("{text}\n[[home_rules]]\ntable = \"ad_profiles\"\nprefix = \"jp/\"\nhome = \"ap-northeast-1\"\n"),
        )?;
        let out = apply(&homed)?;
        ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        ensure!(std::fs::read(&placement)? == std::fs::read(&homed)?);
        let out = pangea(&["topology", "rollback", "--cluster", cluster], Duration::from_secs(60))?;
        ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        ensure!(std::fs::read(&placement)? == running, "rollback did not restore the file");

        // Every replica still runs the old placement and holds every row.
        let after = holdings(&c, &op).await?;
        for (id, b) in &before {
            ensure!(after[id] == *b, "{id}: {b} -> {}", after[id]);
        }
        let r = fe
            .get(
                TABLE,
                bytes::Bytes::from_static(b"eu/000"),
                &pangea_client::ReadOptions::default(),
            )
            .await?;
        ensure!(
            r.value.is_some() && r.region == common::EU,
            "eu/000 from {}",
            r.region
        );
        anyhow::Ok(())
    })?;
    c.down(common::CLEANUP_GRACE_MS)?;
    Ok(())
}
