//! Who may do what: the authorization of every client-facing request (DESIGN.md
//! principle 8). Mutual TLS says who is calling (a [`Principal`], read from the
//! certificate by the network layer); this module says whether that principal may
//! take an [`Action`], with a refusal that names the principal, the action and the
//! missing permission. The matrix, as docs/operations.md "Who may do what" shows it:
//!
//! | action | replica | client (profile P) | loader (profile P) | operator |
//! |---|---|---|---|---|
//! | read an ordinary table | no | if P grants read | if P grants read | no |
//! | read `_location` | no | yes (routing) | yes (routing) | yes |
//! | read `_jobs` | no | no | no | yes |
//! | write cells or increment counters of an ordinary table | no | if P grants read-write | if P grants read-write | no |
//! | write any system table (`_*`) | no | no | no | no |
//! | merge pre-versioned rows (`MergeRow`) | no | no | if P grants read-write | no |
//! | read a change stream as a registered reader (the replica keeps its log) | no | no | if P grants read (checked by the node: `serve::register_reader`) | no |
//! | read this replica's watermarks | no | scopes P may read | scopes P may read | yes |
//! | placement move, placement audit, reload | no | no | no | yes |
//!
//! Rows are further limited by the profile's `policies` ([`authorize_rows`]).
//! Replicas speak only the replication protocol: their certificates are refused for
//! every request here. Nobody writes a system table through the data API: location
//! entries are written by migration jobs, which operators start and the replica
//! checks ([`crate::location::check_location_write`]).
//!
//! Pure functions of the deployment and the request: the node calls them, and any
//! other driver (a simulator, a test) gets the same answers.

use crate::RowState;
use pangea_proto::v1 as pb;
use pangea_topology::{Access, AppProfile, Deployment, ScopeId};
use std::fmt;

/// An authenticated caller, as its certificate names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// Another replica: replication only.
    Replica { id: String },
    /// An ad-serving frontend acting for an app profile.
    Client { name: String, app_profile: String },
    /// A person or tool running the cluster: placement, audits, reloads.
    Operator { name: String },
    /// A batch pipeline acting for an app profile; may also merge pre-versioned rows.
    Loader { name: String, app_profile: String },
}

impl Principal {
    /// The app profile a data principal acts for.
    pub fn app_profile(&self) -> Option<&str> {
        match self {
            Principal::Client { app_profile, .. } | Principal::Loader { app_profile, .. } => {
                Some(app_profile)
            }
            Principal::Replica { .. } | Principal::Operator { .. } => None,
        }
    }

    /// The principal's name (replica id, client, operator or loader name).
    pub fn name(&self) -> &str {
        match self {
            Principal::Replica { id } => id,
            Principal::Client { name, .. }
            | Principal::Operator { name }
            | Principal::Loader { name, .. } => name,
        }
    }

    /// `replica`, `client`, `operator` or `loader`.
    pub fn kind(&self) -> &'static str {
        match self {
            Principal::Replica { .. } => "replica",
            Principal::Client { .. } => "client",
            Principal::Operator { .. } => "operator",
            Principal::Loader { .. } => "loader",
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Replica { id } => write!(f, "replica {id}"),
            Principal::Client { name, app_profile } => {
                write!(f, "client {name} (app profile {app_profile})")
            }
            Principal::Operator { name } => write!(f, "operator {name}"),
            Principal::Loader { name, app_profile } => {
                write!(f, "loader {name} (app profile {app_profile})")
            }
        }
    }
}

/// What a request asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'a> {
    /// Get, get-many or scan rows of a table.
    Read { table: &'a str },
    /// Set, delete or count cells of a row, or of many rows (a batch).
    Write { table: &'a str },
    /// Merge a row state whose versions carry their own timestamps and origins
    /// (`MergeRow`: backfills, restores). Checked further by [`check_merge`].
    Merge { table: &'a str },
    /// This replica's watermarks (clients probe them to route reads).
    Watermarks,
    /// The topology and placement files this replica runs (clients follow
    /// deployment changes with them).
    Deployment,
    /// Start a placement migration.
    PlacementMove,
    /// Audit this replica's store against placement.
    PlacementAudit,
    /// Re-read the topology, placement and certificate files.
    Reload,
}

impl Action<'_> {
    /// Operator-only actions.
    pub fn is_operator(&self) -> bool {
        matches!(
            self,
            Action::PlacementMove | Action::PlacementAudit | Action::Reload
        )
    }

    /// The name operators see in audit logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Action::Read { .. } => "read",
            Action::Write { .. } => "write",
            Action::Merge { .. } => "merge",
            Action::Watermarks => "watermarks",
            Action::Deployment => "deployment",
            Action::PlacementMove => "placement_move",
            Action::PlacementAudit => "placement_audit",
            Action::Reload => "reload",
        }
    }
}

impl fmt::Display for Action<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Read { table } => write!(f, "read table {table}"),
            Action::Write { table } => write!(f, "write table {table}"),
            Action::Merge { table } => write!(f, "merge pre-versioned rows into table {table}"),
            Action::Watermarks => f.write_str("read watermarks"),
            Action::Deployment => f.write_str("read the deployment's files"),
            Action::PlacementMove => f.write_str("move placement"),
            Action::PlacementAudit => f.write_str("audit placement"),
            Action::Reload => f.write_str("reload the deployment's files"),
        }
    }
}

/// What a client request asks to do (`None`: an empty request).
pub fn action_of(req: &pb::ClientRequest) -> Option<Action<'_>> {
    use pb::client_request::Request as R;
    Some(match req.request.as_ref()? {
        R::Get(g) => Action::Read { table: &g.table },
        R::GetMany(g) => Action::Read { table: &g.table },
        R::ScanPrefix(s) => Action::Read { table: &s.table },
        // A change stream shows what reads of the table would.
        R::Changes(c) => Action::Read { table: &c.table },
        // The location metadata a replica holds: exactly what a scan of it reads.
        R::LocationChanges(_) => Action::Read {
            table: crate::location::LOCATION_TABLE,
        },
        R::Mutate(m) => {
            let table = m.mutation.as_ref().map_or("", |m| m.table.as_str());
            write_or_merge(table, m.mutation.iter())
        }
        // A batch writes one table (a row naming another is refused alone).
        R::MutateRows(b) => write_or_merge(&b.table, b.rows.iter()),
        R::Watermarks(_) => Action::Watermarks,
        R::Deployment(_) => Action::Deployment,
        R::PlacementMove(_) => Action::PlacementMove,
        R::Audit(_) => Action::PlacementAudit,
        R::Reload(_) => Action::Reload,
    })
}

/// A write of `table`, or a merge when any of `rows` carries a `MergeRow`.
fn write_or_merge<'a>(
    table: &'a str,
    mut rows: impl Iterator<Item = &'a pb::RowMutation>,
) -> Action<'a> {
    let merges = rows.any(|m| {
        m.mutations
            .iter()
            .any(|x| matches!(x.kind, Some(pb::mutation::Kind::MergeRow(_))))
    });
    if merges {
        Action::Merge { table }
    } else {
        Action::Write { table }
    }
}

/// For a loader's `MergeRow`: each state names the row it is merged into (its key
/// is the mutation's row key). Checked on the wire form, before parsing drops it.
pub fn check_merge_keys(m: &pb::RowMutation) -> Result<(), String> {
    for x in &m.mutations {
        if let Some(pb::mutation::Kind::MergeRow(merge)) = &x.kind
            && merge.state.as_ref().map(|s| &s.key) != Some(&m.row_key)
        {
            return Err("MergeRow state's key is not the mutation's row key".into());
        }
    }
    Ok(())
}

/// A refused request: who, what, and the missing permission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{principal} may not {action}: {missing}")]
pub struct Denied {
    pub principal: String,
    pub action: String,
    /// The permission the principal lacks, in words an operator can act on.
    pub missing: String,
}

fn deny(who: &Principal, action: impl fmt::Display, missing: impl Into<String>) -> Denied {
    Denied {
        principal: who.to_string(),
        action: action.to_string(),
        missing: missing.into(),
    }
}

/// The system table clients read to route (location metadata).
fn routing_table(table: &str) -> bool {
    table == crate::location::LOCATION_TABLE
}

fn is_system(table: &str) -> bool {
    table.starts_with('_')
}

/// Whether `who` may take `action` at all (before the rows it touches are known).
pub fn authorize(d: &Deployment, who: &Principal, action: &Action<'_>) -> Result<(), Denied> {
    let profile = match who {
        Principal::Replica { .. } => {
            return Err(deny(
                who,
                action,
                "replica certificates carry replication only; requests need a client, \
                 loader or operator certificate",
            ));
        }
        Principal::Operator { .. } => {
            return match action {
                Action::PlacementMove
                | Action::PlacementAudit
                | Action::Reload
                | Action::Watermarks
                | Action::Deployment => Ok(()),
                Action::Read { table } if is_system(table) => Ok(()),
                Action::Read { .. } => Err(deny(
                    who,
                    action,
                    "operators run the cluster; reading user rows needs a client or loader \
                     certificate of an app profile that grants the table",
                )),
                Action::Write { table } | Action::Merge { table } if is_system(table) => {
                    Err(deny(who, action, system_table_reason()))
                }
                Action::Write { .. } | Action::Merge { .. } => Err(deny(
                    who,
                    action,
                    "operators run the cluster; writing user rows needs a client or loader \
                     certificate of an app profile that grants the table read-write",
                )),
            };
        }
        Principal::Client { app_profile, .. } | Principal::Loader { app_profile, .. } => {
            d.topology.app_profiles.get(app_profile).ok_or_else(|| {
                deny(
                    who,
                    action,
                    format!("the topology defines no app profile {app_profile:?}"),
                )
            })?
        }
    };
    match action {
        Action::PlacementMove | Action::PlacementAudit | Action::Reload => {
            Err(deny(who, action, "an operator certificate is needed"))
        }
        // What a client needs to route: every client of the deployment may ask.
        Action::Watermarks | Action::Deployment => Ok(()),
        Action::Read { table } if routing_table(table) => Ok(()),
        Action::Read { table } if is_system(table) => Err(deny(
            who,
            action,
            "system tables other than _location are for operators",
        )),
        Action::Read { table } => need(who, action, profile, table, Access::Read),
        Action::Write { table } | Action::Merge { table } if is_system(table) => {
            Err(deny(who, action, system_table_reason()))
        }
        Action::Write { table } => need(who, action, profile, table, Access::ReadWrite),
        Action::Merge { table } => {
            if !matches!(who, Principal::Loader { .. }) {
                return Err(deny(
                    who,
                    action,
                    "pre-versioned merges need a loader certificate",
                ));
            }
            need(who, action, profile, table, Access::ReadWrite)
        }
    }
}

fn system_table_reason() -> &'static str {
    "system tables (_*) are written only by the replicas themselves (location entries by \
     migration jobs: pangea placement move)"
}

fn need(
    who: &Principal,
    action: &Action<'_>,
    profile: &AppProfile,
    table: &str,
    needed: Access,
) -> Result<(), Denied> {
    match profile.access(table) {
        Some(a) if a.allows(needed) => Ok(()),
        Some(a) => Err(deny(
            who,
            action,
            format!(
                "app profile {} grants {} on table {table}, not {}",
                profile.name,
                a.as_str(),
                needed.as_str()
            ),
        )),
        None => Err(deny(
            who,
            action,
            format!(
                "app profile {} grants no access to table {table} (needs {})",
                profile.name,
                needed.as_str()
            ),
        )),
    }
}

/// Whether `who` may touch rows of placement policy `scope` (an app profile's
/// `policies`). Operators reach only system tables, which are global.
pub fn authorize_rows(d: &Deployment, who: &Principal, scope: &ScopeId) -> Result<(), Denied> {
    let Some(name) = who.app_profile() else {
        return Ok(());
    };
    match d.topology.app_profiles.get(name) {
        Some(p) if p.may_touch_policy(scope) => Ok(()),
        Some(p) => Err(deny(
            who,
            format!("touch rows of placement policy {scope}"),
            format!("app profile {} does not list policy {scope}", p.name),
        )),
        None => Err(deny(
            who,
            format!("touch rows of placement policy {scope}"),
            format!("the topology defines no app profile {name:?}"),
        )),
    }
}

/// How far from the replica's clock a merged version may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergeWindow {
    /// At most this far ahead of the replica's clock (its clock-offset bound): a
    /// version from the future would win over every write until then.
    pub ahead_ms: u64,
    /// At most this far behind it: older versions belong to a restore with fresh
    /// versions, not a merge.
    pub behind_ms: u64,
}

impl MergeWindow {
    /// Thirty days behind, the HLC's 500 ms ahead.
    pub const DEFAULT: MergeWindow = MergeWindow {
        ahead_ms: crate::hlc::MAX_OFFSET_MS_DEFAULT,
        behind_ms: 30 * 24 * 3600 * 1000,
    };
}

/// Checks a row state a loader asks to merge: every version's timestamp inside
/// `window` around `now_ms` (the replica's wall clock), every origin a replica of the topology. The row key of
/// the state must be the row's (checked by the caller on the wire form).
pub fn check_merge(
    d: &Deployment,
    row: &RowState,
    now_ms: u64,
    window: MergeWindow,
) -> Result<(), String> {
    let earliest = now_ms.saturating_sub(window.behind_ms);
    let latest = now_ms.saturating_add(window.ahead_ms);
    // Folded counts stand for increments a replica had by its purge horizon
    // (the row module's counters): only compaction makes them. A loaded one
    // could claim to count increments it does not, and hide them for ever.
    if row.has_folds() {
        return Err(
            "the merged row carries folded counts, which only replicas make: load \
             counters as increments"
                .into(),
        );
    }
    for v in row.versions() {
        let ms = v.timestamp.wall_ms();
        if ms > latest {
            return Err(format!(
                "a version of {} is dated {ms} ms since the epoch, more than {} ms ahead of \
                 this replica's clock ({now_ms})",
                v.origin, window.ahead_ms
            ));
        }
        if ms < earliest {
            return Err(format!(
                "a version of {} is dated {ms} ms since the epoch, more than {} ms behind \
                 this replica's clock ({now_ms})",
                v.origin, window.behind_ms
            ));
        }
        if d.topology.replica(v.origin.as_str()).is_none() {
            return Err(format!(
                "a version names origin {}, which is not a replica of the topology",
                v.origin
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::Version;
    use crate::{Limits, Mutation, RowMutation};
    use bytes::Bytes;
    use std::path::Path;

    /// local-3-regions with two more profiles: read-only, and global rows only.
    fn deployment() -> Deployment {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
        let topology = std::fs::read_to_string(root.join("local-3-regions.toml")).unwrap()
            + r#"
[[app_profiles]]
name = "reader"
routing = "nearest"
tables = { ad_profiles = "read" }

[[app_profiles]]
name = "global-only"
routing = "nearest"
tables = { ad_profiles = "read-write" }
policies = ["global"]
"#;
        let placement =
            std::fs::read_to_string(root.join("local-3-regions.placement.toml")).unwrap();
        Deployment::parse(
            Path::new("t.toml"),
            &topology,
            Some((Path::new("p.toml"), &placement)),
        )
        .unwrap()
    }

    fn client(profile: &str) -> Principal {
        Principal::Client {
            name: format!("client-{profile}"),
            app_profile: profile.into(),
        }
    }

    fn loader(profile: &str) -> Principal {
        Principal::Loader {
            name: format!("loader-{profile}"),
            app_profile: profile.into(),
        }
    }

    const T: &str = "ad_profiles";

    #[test]
    fn the_matrix() {
        let d = deployment();
        let operator = Principal::Operator { name: "ops".into() };
        let replica = Principal::Replica {
            id: "use1-a".into(),
        };
        let fe = client("frontend");
        let reader = client("reader");
        let ld = loader("frontend");
        let actions = [
            Action::Read { table: T },
            Action::Read { table: "_location" },
            Action::Read { table: "_jobs" },
            Action::Write { table: T },
            Action::Write { table: "_location" },
            Action::Write { table: "_jobs" },
            Action::Merge { table: T },
            Action::Merge { table: "_location" },
            Action::Watermarks,
            Action::Deployment,
            Action::PlacementMove,
            Action::PlacementAudit,
            Action::Reload,
        ];
        // Expected answers, one column per principal, rows as `actions`.
        #[rustfmt::skip]
        let expected: [[bool; 5]; 13] = [
            //  replica operator frontend reader loader
            [false, false, true,  true,  true ], // read ad_profiles
            [false, true,  true,  true,  true ], // read _location
            [false, true,  false, false, false], // read _jobs
            [false, false, true,  false, true ], // write ad_profiles
            [false, false, false, false, false], // write _location
            [false, false, false, false, false], // write _jobs
            [false, false, false, false, true ], // merge ad_profiles
            [false, false, false, false, false], // merge _location
            [false, true,  true,  true,  true ], // watermarks
            [false, true,  true,  true,  true ], // deployment files
            [false, true,  false, false, false], // placement move
            [false, true,  false, false, false], // placement audit
            [false, true,  false, false, false], // reload
        ];
        let who = [&replica, &operator, &fe, &reader, &ld];
        for (a, row) in actions.iter().zip(expected) {
            for (w, want) in who.iter().zip(row) {
                let got = authorize(&d, w, a);
                assert_eq!(got.is_ok(), want, "{w} / {a}: {got:?}");
            }
        }
    }

    /// Asking a replica for its location metadata's changes is authorized as
    /// what it reveals: a read of `_location`.
    #[test]
    fn location_changes_are_a_read_of_the_location_table() {
        let req = pb::ClientRequest {
            request: Some(pb::client_request::Request::LocationChanges(
                pb::LocationChangesRequest::default(),
            )),
            ..Default::default()
        };
        assert_eq!(
            action_of(&req),
            Some(Action::Read {
                table: crate::location::LOCATION_TABLE
            })
        );
    }

    #[test]
    fn refusals_name_the_profile_the_table_and_the_missing_permission() {
        let d = deployment();
        let e = authorize(&d, &client("reader"), &Action::Write { table: T }).unwrap_err();
        assert_eq!(e.principal, "client client-reader (app profile reader)");
        assert_eq!(
            e.missing,
            "app profile reader grants read on table ad_profiles, not read-write"
        );
        let e = authorize(&d, &client("frontend"), &Action::Read { table: "other" }).unwrap_err();
        assert!(e.missing.contains("grants no access to table other"), "{e}");
        let e = authorize(&d, &client("nobody"), &Action::Read { table: T }).unwrap_err();
        assert!(e.missing.contains("no app profile \"nobody\""), "{e}");
        let e = authorize(
            &d,
            &client("frontend"),
            &Action::Write { table: "_location" },
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("may not write table _location"),
            "{e}"
        );
        let e = authorize(&d, &client("frontend"), &Action::Merge { table: T }).unwrap_err();
        assert!(e.missing.contains("loader certificate"), "{e}");
    }

    #[test]
    fn profiles_with_policies_reach_only_their_rows() {
        let d = deployment();
        let eu = ScopeId::from("eu-resident");
        assert!(authorize_rows(&d, &client("global-only"), &ScopeId::global()).is_ok());
        let e = authorize_rows(&d, &client("global-only"), &eu).unwrap_err();
        assert!(
            e.missing.contains("does not list policy eu-resident"),
            "{e}"
        );
        assert!(authorize_rows(&d, &client("frontend"), &eu).is_ok());
        assert!(authorize_rows(&d, &Principal::Operator { name: "o".into() }, &eu).is_ok());
    }

    fn merged(versions: &[(u64, &str)]) -> RowState {
        let mut row = RowState::default();
        for (ms, origin) in versions {
            let m = RowMutation::new(
                T,
                Bytes::from_static(b"k"),
                vec![Mutation::SetCell {
                    family: "profile".into(),
                    column: Bytes::from_static(b"p"),
                    value: Bytes::from_static(b"v"),
                }],
                &Limits::STORED,
            )
            .unwrap();
            let v = Version::new(crate::Timestamp::new(*ms, 0), (*origin).into());
            row.apply(&v, m.mutations(), None);
        }
        row
    }

    #[test]
    fn merges_stay_inside_the_window_and_name_real_origins() {
        let d = deployment();
        let now = 4_102_444_800_000 / 2; // some day in 2034
        let w = MergeWindow::DEFAULT;
        assert!(check_merge(&d, &merged(&[(now - 1_000, "use1-a")]), now, w).is_ok());
        // A version dated 2100 (the forged override) and u64::MAX.
        let e = check_merge(&d, &merged(&[(4_102_444_800_000, "euw1-a")]), now, w).unwrap_err();
        assert!(e.contains("ahead of this replica's clock"), "{e}");
        let e = check_merge(&d, &merged(&[(u64::MAX >> 16, "euw1-a")]), now, w).unwrap_err();
        assert!(e.contains("ahead"), "{e}");
        let e = check_merge(&d, &merged(&[(now - w.behind_ms - 1, "euw1-a")]), now, w).unwrap_err();
        assert!(e.contains("behind"), "{e}");
        let e = check_merge(&d, &merged(&[(now, "mallory")]), now, w).unwrap_err();
        assert!(e.contains("origin mallory"), "{e}");
        // Folded counts only replicas make: one loaded could hide increments for
        // ever (a reach past every delete), so none is accepted.
        let counter = pangea_topology::schema::TableSchema {
            families: [(
                "c".into(),
                pangea_topology::schema::GcPolicy {
                    kind: pangea_topology::schema::FamilyKind::Counter,
                    ..Default::default()
                },
            )]
            .into(),
            partition_key: None,
            event_time: None,
            change_retention_ms: None,
        };
        let mut row = RowState::default();
        let inc = Mutation::Increment {
            family: "c".into(),
            column: Bytes::from_static(b"x"),
            delta: 1,
        };
        let v = Version::new(crate::Timestamp::new(now - 1_000, 0), "use1-a".into());
        row.apply(&v, &[inc], Some(&counter));
        assert!(check_merge(&d, &row, now, w).is_ok(), "increments load");
        row.compact(Some(&counter), crate::Timestamp::new(now, 0), now);
        assert!(row.has_folds());
        let e = check_merge(&d, &row, now, w).unwrap_err();
        assert!(e.contains("folded counts"), "{e}");
    }
}
