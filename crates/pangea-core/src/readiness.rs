//! The readiness gate: a replica that just started (a new replica bootstrapping, or
//! one restarting after downtime) serves reads only once it has caught up with what
//! its neighbours told it exists.
//!
//! Without the gate, a replica added to a running cluster answers "no such row" for
//! rows it has not received yet: allowed by the letter of eventual consistency, but a
//! failed read to the frontend that asked. Writes are accepted throughout (a write
//! starts a stream of this replica's own and needs nothing from others).
//!
//! An empty store is not evidence that nothing exists. A replica **trusts** its
//! store only once it is known to hold the cluster's data: it caught up with its
//! peers once (recorded), or it was created with a new cluster (`--new-cluster`,
//! recorded; `pangea cluster up` passes it on a fresh directory). The record is the
//! file `DATA_DIR/readiness` ([`Record`]).
//!
//! The gate ([`Gate`], sans-IO: time is the driver's monotonic clock as a
//! `Duration` since its zero), driven after every flush by the node's replication
//! driver and by the simulator's replicas alike:
//! 0. **Waiting for peers** (an untrusted replica only): until it has heard a peer
//!    of every scope it holds. A new replica of an existing cluster that is cut off
//!    stays here, visibly (`/health` 503 naming the scopes), and clients go
//!    elsewhere; it never serves emptiness.
//! 1. **Listening** until a frame from some peer arrived and a few heartbeat
//!    intervals passed, so heartbeats of every live origin, relayed along the tree,
//!    have told the replica how far each stream goes (`known_last`). A trusted
//!    replica that hears nobody within [`LISTEN_ALONE`] (alone in its topology, or
//!    cut off) has nothing to catch up with that it can learn of, and opens.
//! 2. **Catching up** to the targets captured at that moment: the highest sequence
//!    known per (scope, origin). Targets do not move, so steady writes elsewhere cannot
//!    keep a replica closed; gap repair and snapshots fill the streams.
//! 3. **Ready**, for good (until the process restarts); the driver records that this
//!    replica caught up, so it trusts its store from then on.
//!
//! While closed, `/health` answers 503 with the progress, and reads answer
//! `unavailable`, which clients retry at the next candidate.

use crate::ScopeId;
use crate::replica::StreamProgress;
use std::time::Duration;

/// Longest wait for a first frame from any peer.
pub const LISTEN_ALONE: Duration = Duration::from_secs(3);
/// After the first frame, heartbeat intervals to wait so relayed heartbeats arrive.
const LISTEN_HEARTBEATS: u32 = 6;
/// ... and at least this long (cross-continent one-way latency).
const LISTEN_MIN: Duration = Duration::from_millis(300);
/// Catching up that makes no progress for this long opens the gate anyway (with a
/// warning): an entry no reachable peer holds would otherwise keep the replica
/// closed for good, and a stale replica still answers within eventual consistency.
pub const STALL_MAX: Duration = Duration::from_secs(60);

/// Where the gate stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// A replica that does not trust its store yet, waiting to hear a peer of
    /// these scopes.
    WaitingForPeers {
        scopes: Vec<String>,
    },
    /// A replica that does not trust its store, learning from its peers how far
    /// its own stream went in these scopes (`Replica::relearn_own_streams`).
    Relearning {
        scopes: Vec<String>,
    },
    Listening,
    /// Entries still to apply to reach the targets, over how many streams.
    CatchingUp {
        streams_behind: usize,
        entries_behind: u64,
    },
    Ready,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Phase::WaitingForPeers { scopes } => write!(
                f,
                "a replica that never caught up, waiting to hear a peer of {} (an empty \
                 store is served only by a replica created with a new cluster)",
                scopes.join(", ")
            ),
            Phase::Relearning { scopes } => write!(
                f,
                "a replica that never caught up, learning from its peers how far its own \
                 stream went in {} (its store is new; it writes there once it knows)",
                scopes.join(", ")
            ),
            Phase::Listening => write!(f, "listening for peers' heartbeats"),
            Phase::CatchingUp {
                streams_behind,
                entries_behind,
            } => write!(
                f,
                "catching up: {entries_behind} entries behind on {streams_behind} streams"
            ),
            Phase::Ready => write!(f, "ready"),
        }
    }
}

/// The gate's state, owned by the driver.
#[derive(Debug)]
pub struct Gate {
    started: Duration,
    /// Whether the store is known to hold the cluster's data (see the module).
    trusted: bool,
    first_heard: Option<Duration>,
    heartbeat: Duration,
    /// (scope, origin) -> the sequence to reach.
    targets: Option<Vec<(String, String, u64)>>,
    phase: Phase,
    /// The fewest entries behind so far, and when that was reached.
    best: Option<(u64, Duration)>,
    /// Opened after catching up stalled for [`STALL_MAX`]: streams and entries
    /// still behind then.
    opened_stalled: Option<(usize, u64)>,
}

impl Gate {
    /// A gate closed at `now`; `trusted`: the store is known to hold the
    /// cluster's data (see the module).
    pub fn new(now: Duration, heartbeat: Duration, trusted: bool) -> Self {
        Gate {
            started: now,
            trusted,
            first_heard: None,
            heartbeat,
            targets: None,
            phase: Phase::Listening,
            best: None,
            opened_stalled: None,
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Whether the gate opened only because catching up stalled for
    /// [`STALL_MAX`] (streams and entries still behind then): worth a warning, the
    /// replica serves what it has.
    pub fn opened_stalled(&self) -> Option<(usize, u64)> {
        self.opened_stalled
    }

    /// A replica with no peers in its deployment has nobody to catch up with.
    pub fn open(&mut self) -> Option<Phase> {
        if self.phase == Phase::Ready {
            return None;
        }
        self.phase = Phase::Ready;
        Some(Phase::Ready)
    }

    /// Advances the gate at `now`; returns the new phase when it changed.
    /// `unheard` are the scopes shared with peers none of which was heard yet
    /// (`Replica::unheard_scopes`); `relearning` those whose own stream the replica
    /// is still relearning (`Replica::relearning_scopes`).
    pub fn update<'a>(
        &mut self,
        now: Duration,
        frames_received: u64,
        progress: impl Iterator<Item = StreamProgress<'a>>,
        unheard: &[ScopeId],
        relearning: &[ScopeId],
    ) -> Option<Phase> {
        if self.phase == Phase::Ready {
            return None;
        }
        if !self.trusted && self.targets.is_none() && !unheard.is_empty() {
            let phase = Phase::WaitingForPeers {
                scopes: unheard.iter().map(|s| s.to_string()).collect(),
            };
            let changed = phase != self.phase;
            self.phase = phase;
            return changed.then(|| self.phase.clone());
        }
        if frames_received > 0 && self.first_heard.is_none() {
            self.first_heard = Some(now);
        }
        // Its own stream first: what this replica wrote before its store was lost
        // is among what it must hold before it serves.
        if !self.trusted && self.targets.is_none() && !relearning.is_empty() {
            let phase = Phase::Relearning {
                scopes: relearning.iter().map(|s| s.to_string()).collect(),
            };
            let changed = phase != self.phase;
            self.phase = phase;
            return changed.then(|| self.phase.clone());
        }
        let progress: Vec<StreamProgress<'a>> = progress.collect();
        if self.targets.is_none() {
            let listened = match self.first_heard {
                Some(t) => {
                    now.saturating_sub(t) >= (self.heartbeat * LISTEN_HEARTBEATS).max(LISTEN_MIN)
                }
                None => self.trusted && now.saturating_sub(self.started) >= LISTEN_ALONE,
            };
            if !listened && self.phase != Phase::Listening {
                self.phase = Phase::Listening;
                return Some(Phase::Listening);
            }
            if !listened {
                return None;
            }
            self.targets = Some(
                progress
                    .iter()
                    .filter(|p| p.known_last > p.durable)
                    .map(|p| (p.scope.to_string(), p.origin.to_string(), p.known_last))
                    .collect(),
            );
        }
        let targets = self.targets.as_ref().expect("set above");
        let (mut streams_behind, mut entries_behind) = (0, 0);
        for (scope, origin, target) in targets {
            let durable = progress
                .iter()
                .find(|p| p.scope.as_str() == scope && p.origin.as_str() == origin)
                .map_or(0, |p| p.durable);
            // A stream that left the deployment (a reload) has nothing to catch up.
            let still_here = progress
                .iter()
                .any(|p| p.scope.as_str() == scope && p.origin.as_str() == origin);
            if still_here && durable < *target {
                streams_behind += 1;
                entries_behind += target - durable;
            }
        }
        match self.best {
            Some((b, _)) if entries_behind >= b => {}
            _ => self.best = Some((entries_behind, now)),
        }
        let stalled = self
            .best
            .is_some_and(|(_, at)| now.saturating_sub(at) >= STALL_MAX);
        if stalled && streams_behind > 0 {
            self.opened_stalled = Some((streams_behind, entries_behind));
        }
        let phase = if streams_behind == 0 || stalled {
            Phase::Ready
        } else {
            Phase::CatchingUp {
                streams_behind,
                entries_behind,
            }
        };
        let changed = phase != self.phase;
        self.phase = phase;
        changed.then(|| self.phase.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ReplicaId, ScopeId};

    fn p<'a>(
        s: &'a ScopeId,
        o: &'a ReplicaId,
        durable: u64,
        known_last: u64,
    ) -> StreamProgress<'a> {
        StreamProgress {
            scope: s,
            origin: o,
            durable,
            known_last,
        }
    }

    #[test]
    fn alone_opens_after_the_listen_window() {
        let t0 = Duration::ZERO;
        let mut g = Gate::new(t0, Duration::from_millis(50), true);
        assert_eq!(
            g.update(t0 + Duration::from_secs(1), 0, std::iter::empty(), &[], &[]),
            None
        );
        assert_eq!(g.phase(), &Phase::Listening);
        assert_eq!(
            g.update(t0 + LISTEN_ALONE, 0, std::iter::empty(), &[], &[]),
            Some(Phase::Ready)
        );
    }

    #[test]
    fn catches_up_to_targets_captured_once() {
        let s = ScopeId::new("global");
        let a = ReplicaId::new("a");
        let t0 = Duration::ZERO;
        let mut g = Gate::new(t0, Duration::from_millis(50), true);
        // Heard a peer: still listening for relayed heartbeats.
        assert_eq!(
            g.update(t0, 1, [p(&s, &a, 0, 10)].into_iter(), &[], &[]),
            None
        );
        let t1 = t0 + LISTEN_MIN;
        assert_eq!(
            g.update(t1, 5, [p(&s, &a, 2, 10)].into_iter(), &[], &[]),
            Some(Phase::CatchingUp {
                streams_behind: 1,
                entries_behind: 8
            })
        );
        // New writes elsewhere do not move the target.
        assert_eq!(
            g.update(t1, 9, [p(&s, &a, 9, 50)].into_iter(), &[], &[]),
            Some(Phase::CatchingUp {
                streams_behind: 1,
                entries_behind: 1
            })
        );
        assert_eq!(
            g.update(t1, 9, [p(&s, &a, 10, 60)].into_iter(), &[], &[]),
            Some(Phase::Ready)
        );
        // Ready for good.
        assert_eq!(
            g.update(t1, 9, [p(&s, &a, 10, 90)].into_iter(), &[], &[]),
            None
        );
        assert_eq!(g.phase(), &Phase::Ready);
    }

    #[test]
    fn a_stalled_catch_up_opens_after_stall_max() {
        let s = ScopeId::new("global");
        let a = ReplicaId::new("a");
        let t0 = Duration::ZERO;
        let mut g = Gate::new(t0, Duration::from_millis(50), true);
        g.update(t0, 1, [p(&s, &a, 0, 10)].into_iter(), &[], &[]);
        let t1 = t0 + LISTEN_MIN;
        assert!(
            g.update(t1, 1, [p(&s, &a, 3, 10)].into_iter(), &[], &[])
                .is_some()
        );
        assert_eq!(
            g.update(
                t1 + STALL_MAX / 2,
                1,
                [p(&s, &a, 3, 10)].into_iter(),
                &[],
                &[]
            ),
            None
        );
        assert_eq!(
            g.update(t1 + STALL_MAX, 1, [p(&s, &a, 3, 10)].into_iter(), &[], &[]),
            Some(Phase::Ready)
        );
    }

    #[test]
    fn nothing_behind_opens_at_once_after_listening() {
        let s = ScopeId::new("global");
        let a = ReplicaId::new("a");
        let t0 = Duration::ZERO;
        let mut g = Gate::new(t0, Duration::from_millis(50), true);
        g.update(t0, 1, [p(&s, &a, 4, 4)].into_iter(), &[], &[]);
        assert_eq!(
            g.update(t0 + LISTEN_MIN, 1, [p(&s, &a, 4, 4)].into_iter(), &[], &[]),
            Some(Phase::Ready)
        );
    }

    #[test]
    fn an_untrusted_replica_never_opens_alone() {
        let t0 = Duration::ZERO;
        let global = ScopeId::global();
        let mut g = Gate::new(t0, Duration::from_millis(50), false);
        let unheard = [global];
        assert_eq!(
            g.update(t0, 0, std::iter::empty(), &unheard, &[]),
            Some(Phase::WaitingForPeers {
                scopes: vec!["global".into()]
            })
        );
        // Hours later, still nobody heard: still closed.
        let later = t0 + Duration::from_secs(3_600);
        assert_eq!(g.update(later, 0, std::iter::empty(), &unheard, &[]), None);
        assert!(matches!(g.phase(), Phase::WaitingForPeers { .. }));
        // Alone with every scope "heard" but no frame (cannot happen in a
        // replica, but the gate must not open on silence): listening, not ready.
        assert_eq!(
            g.update(later, 0, std::iter::empty(), &[], &[]),
            Some(Phase::Listening)
        );
        assert_eq!(
            g.update(later + LISTEN_ALONE, 0, std::iter::empty(), &[], &[]),
            None
        );
    }

    #[test]
    fn an_untrusted_replica_opens_once_it_caught_up_with_its_peers() {
        let s = ScopeId::new("global");
        let a = ReplicaId::new("a");
        let t0 = Duration::ZERO;
        let mut g = Gate::new(t0, Duration::from_millis(50), false);
        assert!(
            g.update(t0, 0, std::iter::empty(), std::slice::from_ref(&s), &[])
                .is_some()
        );
        // A peer heard: listen, then catch up to what it said exists.
        assert_eq!(
            g.update(t0, 1, [p(&s, &a, 0, 10)].into_iter(), &[], &[]),
            Some(Phase::Listening)
        );
        let t1 = t0 + LISTEN_MIN;
        assert_eq!(
            g.update(t1, 2, [p(&s, &a, 4, 10)].into_iter(), &[], &[]),
            Some(Phase::CatchingUp {
                streams_behind: 1,
                entries_behind: 6
            })
        );
        assert_eq!(
            g.update(t1, 3, [p(&s, &a, 10, 10)].into_iter(), &[], &[]),
            Some(Phase::Ready)
        );
    }

    #[test]
    fn an_untrusted_replica_relearns_its_own_stream_before_it_listens() {
        let s = ScopeId::new("global");
        let (a, me) = (ReplicaId::new("a"), ReplicaId::new("me"));
        let t0 = Duration::ZERO;
        let mut g = Gate::new(t0, Duration::from_millis(50), false);
        let relearning = std::slice::from_ref(&s);
        // A peer heard, but its report of our own stream not in yet: closed, saying
        // why, however long the listening window has run.
        assert_eq!(
            g.update(t0, 1, [p(&s, &a, 0, 10)].into_iter(), &[], relearning),
            Some(Phase::Relearning {
                scopes: vec!["global".into()]
            })
        );
        let t1 = t0 + LISTEN_MIN * 10;
        assert_eq!(
            g.update(t1, 5, [p(&s, &a, 0, 10)].into_iter(), &[], relearning),
            None
        );
        // Relearned (our stream holds what peers had): catch up with the others.
        assert_eq!(
            g.update(
                t1,
                6,
                [p(&s, &a, 4, 10), p(&s, &me, 7, 7)].into_iter(),
                &[],
                &[]
            ),
            Some(Phase::CatchingUp {
                streams_behind: 1,
                entries_behind: 6
            })
        );
    }
}
