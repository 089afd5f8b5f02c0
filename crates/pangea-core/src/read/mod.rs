//! Read and routing decisions: pure functions the client library and the simulator
//! share, so both make exactly the same choices (docs/consistency.md).
//!
//! Here, the replica's side — [`vouching_scope`] and [`decide`]: given a
//! consistency request and a replica's watermarks, may this replica answer?
//! (serve / not covered / too stale). In `route`, re-exported here, the client's side:
//! - [`plan_read`]: given a client's region, app profile, the deployment and what the
//!   client knows of replicas (RTTs, health, last-known watermarks), which replicas to
//!   ask, in which order, and which to race as fallbacks.
//! - [`OrderCache`] with [`order_read_cached`]: the same order, with each scope's
//!   route keys kept between reads, for a caller that reports every change to its
//!   view (the simulator's frontends).

use crate::hlc::Timestamp;
use crate::ids::{ReplicaId, ScopeId};
use crate::token::Token;
use crate::watermark::ScopeWatermarks;
use std::fmt;

mod route;
pub use route::*;

/// How fresh a read must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Consistency {
    /// The nearest healthy replica; may lag.
    Eventual,
    /// The row's rendezvous replica in the caller's region: read-your-writes inside
    /// a region while that replica is up.
    RowAffinity,
    /// Only a replica that has applied the write `Token` names.
    Watermark(Token),
    /// Only a replica whose low watermark is at most `max_ms` behind now.
    BoundedStaleness { max_ms: u64 },
    /// The row as of wall time `ms` (Unix ms): only a replica fresh as of `ms`
    /// for the row's scope (it holds every write of every origin stamped at or
    /// before it) answers, with the newest versions stamped at or before `ms`
    /// ([`ReadFilter::as_of`](crate::ReadFilter::as_of)). docs/consistency.md.
    AsOf { ms: u64 },
}

impl Consistency {
    pub fn mode(&self) -> &'static str {
        match self {
            Consistency::Eventual => "eventual",
            Consistency::RowAffinity => "affinity",
            Consistency::Watermark(_) => "watermark",
            Consistency::BoundedStaleness { .. } => "bounded",
            Consistency::AsOf { .. } => "as_of",
        }
    }

    /// How far behind `now_ms` a replica's freshness may be for it to answer:
    /// a bounded read's bound; for a read as of `ms`, `now_ms - ms`. `None`
    /// for the other modes.
    pub fn staleness_bound_ms(&self, now_ms: u64) -> Option<u64> {
        match self {
            Consistency::BoundedStaleness { max_ms } => Some(*max_ms),
            Consistency::AsOf { ms } => Some(now_ms.saturating_sub(*ms)),
            _ => None,
        }
    }

    /// Whether a slow read may be hedged to the plan's next replica. Not a
    /// row-affinity read: its promise (read-your-writes in the region, no token)
    /// holds only at the row's affinity replica, and a hedge answered elsewhere could
    /// miss the caller's write without anyone knowing. It still fails over when the
    /// affinity replica cannot be reached or refuses. Every other mode may: any
    /// replica its plan holds answers within its promise (a watermark or bounded
    /// read is refused where it would not be).
    pub fn may_hedge(&self) -> bool {
        !matches!(self, Consistency::RowAffinity)
    }
}

/// Whether a replica may answer a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Serve,
    /// A watermark read this replica has not caught up with.
    NotCovered {
        origin: ReplicaId,
        have: u64,
        need: u64,
    },
    /// A bounded-staleness read this replica is too far behind for.
    TooStale {
        lag_ms: u64,
        max_ms: u64,
    },
}

/// May a replica whose durable watermarks for the row's scope are `wm` serve a read
/// with `consistency` at wall time `now_ms`?
pub fn decide(consistency: &Consistency, wm: &ScopeWatermarks, now_ms: u64) -> Decision {
    match consistency {
        Consistency::Eventual | Consistency::RowAffinity => Decision::Serve,
        Consistency::Watermark(token) => {
            if wm.covers(token) {
                Decision::Serve
            } else {
                let have = if token.scope == wm.scope {
                    wm.get(&token.origin).sequence
                } else {
                    0
                };
                Decision::NotCovered {
                    origin: token.origin.clone(),
                    have,
                    need: token.sequence,
                }
            }
        }
        Consistency::BoundedStaleness { max_ms } => {
            let lag_ms = staleness_ms(wm.freshness(), now_ms);
            if lag_ms <= *max_ms {
                Decision::Serve
            } else {
                Decision::TooStale {
                    lag_ms,
                    max_ms: *max_ms,
                }
            }
        }
        // Fresh as of `ms`: the bound that is `now - ms` at this replica's clock.
        Consistency::AsOf { ms } => {
            let fresh = wm.freshness().wall_ms();
            if fresh >= *ms {
                Decision::Serve
            } else {
                Decision::TooStale {
                    lag_ms: now_ms.saturating_sub(fresh),
                    max_ms: now_ms.saturating_sub(*ms),
                }
            }
        }
    }
}

/// Whether `token`'s origin has retired from the token's scope: a process of a
/// replica of the scope's policy that no longer hosts the scope's group, or no
/// longer exists — a resize moved the group to another process of its replica.
/// A resize finishes only once every member of the scope has applied all of the
/// retiring process's stream there (`pangea cluster resize`, docs/sharding.md),
/// so every member covers such a token: [`decide`] is asked as for an eventual
/// read. A token of a replica the topology dropped is not retired (nothing
/// waited for its stream).
pub fn retired_origin(d: &pangea_topology::Deployment, token: &Token) -> bool {
    retired_from(d, &token.scope, &token.origin)
}

/// Whether `origin` is a process that has retired from `scope` (see
/// [`retired_origin`]): a stream of it there is complete and ended.
pub fn retired_from(d: &pangea_topology::Deployment, scope: &ScopeId, origin: &ReplicaId) -> bool {
    let Some(policy) = d.placement.policy(scope) else {
        return false;
    };
    let origin = origin.as_str();
    let (replica, index) = match origin.rsplit_once(".p") {
        Some((base, i)) => match i.parse::<u32>() {
            Ok(i) if i >= 1 && pangea_topology::process_id(base, i).as_str() == origin => (base, i),
            _ => (origin, 0),
        },
        None => (origin, 0),
    };
    let Some(first) = d.topology.replica(replica).filter(|r| r.index == 0) else {
        return false;
    };
    if !policy.regions.contains(&first.region) {
        return false;
    }
    match d.topology.replica(origin) {
        Some(r) => r.of == first.id && !d.hosts(r, scope),
        None => index >= first.process_count(),
    }
}

/// Which scope's watermarks vouch for a read at a replica that holds the row's
/// scope, `row_scope` — one rule for the node and the simulator. A watermark read's
/// token is checked against its own scope's stream when the replica `holds` that
/// scope too: after a row changed placement, a token from its old scope is still a
/// valid promise wherever that stream is applied. Every other read, against the
/// row's scope. [`decide`] then runs against that scope's watermarks.
pub fn vouching_scope<'a>(
    row_scope: &'a ScopeId,
    consistency: &'a Consistency,
    holds: impl FnOnce(&ScopeId) -> bool,
) -> &'a ScopeId {
    match consistency {
        Consistency::Watermark(t) if t.scope != *row_scope && holds(&t.scope) => &t.scope,
        _ => row_scope,
    }
}

/// How far behind `now_ms` a watermark's (or a freshness's) timestamp is.
pub fn staleness_ms(fresh_as_of: Timestamp, now_ms: u64) -> u64 {
    now_ms.saturating_sub(fresh_as_of.wall_ms())
}

/// A replica's freshness as a client can judge it at `now_ms`, from an answer
/// that said `fresh` and reached the client at `learned_ms` (both on the
/// client's clock): the lag the answer showed, carried forward, never older
/// than the answer itself. Replication keeps flowing between two answers, so a
/// replica's lag is what persists, not its freshness as of the last answer:
/// judged by the aged freshness, the nearest replica of a scope the client had
/// not read from for a second looked too stale for a 2 s bound, and bounded reads
/// went to a farther replica answered from more lately, past their deadline
/// (seen with many shard groups, where each scope hears fewer answers). A replica
/// that did fall behind says so in its refusal, and the client learns it then.
pub fn freshness_now(fresh: Timestamp, learned_ms: u64, now_ms: u64) -> Timestamp {
    if fresh == Timestamp::ZERO {
        return fresh; // nothing known of it: no lag to carry
    }
    let lag_ms = learned_ms.saturating_sub(fresh.wall_ms());
    let now = Timestamp::new(now_ms.saturating_sub(lag_ms), 0);
    now.max(fresh)
}

/// Why a replica was chosen; every response reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The nearest healthy replica.
    Nearest,
    /// A replica of the row's home region.
    Home,
    /// The row's rendezvous replica in the region.
    Affinity,
    /// Last known to have applied the token (watermark reads).
    Covered,
    /// The token's origin, which always covers its own writes.
    OriginFallback,
    /// A hedged second request.
    Hedge,
    /// Last known to be within the staleness bound.
    Fresh,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Nearest => "nearest",
            Reason::Home => "home",
            Reason::Affinity => "affinity",
            Reason::Covered => "covered",
            Reason::OriginFallback => "origin-fallback",
            Reason::Hedge => "hedge",
            Reason::Fresh => "fresh",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a resize, a token of a process that left its group (or is gone) is
    /// retired there; one of a process that still hosts it, of another replica,
    /// or of a replica outside the scope's policy is not.
    #[test]
    fn tokens_of_processes_that_left_their_group_are_retired() {
        let topology = r#"name = "t"
intra_region_rtt_ms = 1.0
shard_groups = 8
[[continents]]
name = "c"
  [[continents.regions]]
  name = "r1"
    [[continents.regions.replicas]]
    id = "one"
    role = "serving"
    processes = 3
  [[continents.regions]]
  name = "r2"
    [[continents.regions.replicas]]
    id = "two"
    role = "serving"
[[links]]
a = "r1"
b = "r2"
rtt_ms = 2.0
"#;
        let d = pangea_topology::Deployment::parse(std::path::Path::new("t.toml"), topology, None)
            .unwrap();
        let scope = |g| {
            let global = d.policies().next().unwrap().clone();
            ScopeId::of_group(&global, 8, pangea_topology::shard::GroupId(g))
        };
        // Three processes: 0–2, 3–5, 6–7.
        let retired = |origin: &str, g| retired_from(&d, &scope(g), &origin.into());
        assert!(retired("one", 4), "process 0 does not host group 4");
        assert!(!retired("one.p1", 4), "process 1 does");
        assert!(retired("one.p3", 4), "no process 3: drained");
        assert!(!retired("two", 4), "a replica of one process hosts all");
        assert!(!retired("three", 4), "not a replica of the topology");
        assert!(!retired("one.p01", 4), "not a process id");
    }

    /// A client judges a replica by the lag its last answer showed, not by how
    /// fresh it was when that answer came.
    #[test]
    fn freshness_carries_the_last_answers_lag_forward() {
        let fresh = Timestamp::new(10_000, 7);
        // Answered at 10,700 ms: 700 ms behind. At 12,000 it is judged 700 ms
        // behind still (fresh as of 11,300), not 2,000.
        let now = freshness_now(fresh, 10_700, 12_000);
        assert_eq!(now.wall_ms(), 11_300);
        assert_eq!(staleness_ms(now, 12_000), 700);
        // Never older than the answer said, whatever the clocks did.
        assert_eq!(freshness_now(fresh, 10_700, 10_000), fresh);
        assert_eq!(freshness_now(fresh, 9_000, 12_000).wall_ms(), 12_000);
        // Nothing known: nothing to carry.
        assert_eq!(
            freshness_now(Timestamp::ZERO, 10_700, 12_000),
            Timestamp::ZERO
        );
    }

    #[test]
    fn a_token_is_vouched_for_by_its_own_scope_where_that_scope_is_held() {
        let row: ScopeId = "eu-resident".into();
        let token = Token {
            scope: "global".into(),
            origin: "use1-a".into(),
            sequence: 3,
            timestamp: Timestamp::ZERO,
        };
        let watermark = Consistency::Watermark(token);
        // The row moved from `global` to `eu-resident`: an EU replica holds both.
        assert_eq!(
            vouching_scope(&row, &watermark, |_| true).as_str(),
            "global"
        );
        // A replica without the token's scope checks the row's (and will not cover).
        assert_eq!(vouching_scope(&row, &watermark, |_| false), &row);
        // Other modes: always the row's scope.
        for c in [
            Consistency::Eventual,
            Consistency::BoundedStaleness { max_ms: 5 },
        ] {
            assert_eq!(vouching_scope(&row, &c, |_| true), &row);
        }
    }
}
