//! A replica's watermarks for one scope, as reads and clients see them.

use crate::hlc::Timestamp;
use crate::ids::{ReplicaId, ScopeId};
use crate::storage::Watermark;
use crate::token::Token;
use pangea_proto::v1 as pb;
use std::sync::Arc;

/// How far a replica has durably applied each origin's stream in one scope.
/// The origins are every origin of the scope (replicas that store rows), those
/// never heard from at zero, so the low watermark is honest.
///
/// Held as vectors in origin order rather than a map: a replica builds one per read
/// it answers and a client keeps the last one per replica, and a lookup is a binary
/// search. The origins' ids are shared (`Arc`) with the replica that built it: a
/// scope's origins change only with the deployment, so a snapshot copies the
/// watermarks alone, not an id per origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeWatermarks {
    pub scope: ScopeId,
    /// Sorted, each origin once.
    origins: Arc<[ReplicaId]>,
    /// `marks[i]` is the watermark of `origins[i]`.
    marks: Vec<Watermark>,
    /// `vouched[i]`, for an origin suspected down: the time up to which every
    /// replica this one still hears had applied no more of `origins[i]`'s stream
    /// than this one holds ([`ScopeWatermarks::freshness`]). `None` (the common
    /// case) when no origin is vouched for.
    vouched: Option<Arc<[Timestamp]>>,
}

impl ScopeWatermarks {
    pub fn new(scope: ScopeId) -> Self {
        ScopeWatermarks {
            scope,
            origins: Arc::from([]),
            marks: Vec::new(),
            vouched: None,
        }
    }

    /// From `(origin, watermark)` pairs in strictly increasing origin order.
    pub fn from_sorted(
        scope: ScopeId,
        origins: impl IntoIterator<Item = (ReplicaId, Watermark)>,
    ) -> Self {
        let (ids, marks): (Vec<ReplicaId>, Vec<Watermark>) = origins.into_iter().unzip();
        ScopeWatermarks::from_shared(scope, ids.into(), marks)
    }

    /// From the origins (strictly increasing) and their watermarks, in that order.
    pub fn from_shared(scope: ScopeId, origins: Arc<[ReplicaId]>, marks: Vec<Watermark>) -> Self {
        assert_eq!(origins.len(), marks.len(), "one watermark per origin");
        debug_assert!(
            origins.windows(2).all(|w| w[0] < w[1]),
            "origins out of order"
        );
        ScopeWatermarks {
            scope,
            origins,
            marks,
            vouched: None,
        }
    }

    /// With the vouched times of the origins suspected down, in origin order (zero:
    /// not vouched for); see [`ScopeWatermarks::freshness`].
    pub fn with_vouched(mut self, vouched: Option<Arc<[Timestamp]>>) -> Self {
        assert!(
            vouched.as_ref().is_none_or(|v| v.len() == self.marks.len()),
            "one vouched time per origin"
        );
        self.vouched = vouched;
        self
    }

    /// Sets `origin`'s watermark (the last setting counts).
    pub fn insert(&mut self, origin: ReplicaId, wm: Watermark) {
        match self.origins.binary_search(&origin) {
            Ok(i) => self.marks[i] = wm,
            Err(i) => {
                let mut ids = self.origins.to_vec();
                ids.insert(i, origin);
                self.origins = ids.into();
                self.marks.insert(i, wm);
                if let Some(v) = &self.vouched {
                    let mut v = v.to_vec();
                    v.insert(i, Timestamp::ZERO);
                    self.vouched = Some(v.into());
                }
            }
        }
    }

    /// Every origin and its watermark, in origin order.
    pub fn iter(&self) -> impl Iterator<Item = (&ReplicaId, &Watermark)> {
        self.origins.iter().zip(&self.marks)
    }

    /// The origins' ids, to replace each by an equal id (order is kept). Shared ids
    /// are copied first.
    pub fn ids_mut(&mut self) -> impl Iterator<Item = &mut ReplicaId> {
        if Arc::get_mut(&mut self.origins).is_none() {
            self.origins = self.origins.iter().cloned().collect();
        }
        Arc::get_mut(&mut self.origins)
            .expect("copied above if shared")
            .iter_mut()
    }

    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }

    /// Minimum timestamp over origins: every write at or below it, from every origin,
    /// has been applied (I3, I7). Zero when the scope has no origin yet.
    pub fn low_watermark(&self) -> Timestamp {
        self.marks
            .iter()
            .map(|w| w.timestamp)
            .min()
            .unwrap_or(Timestamp::ZERO)
    }

    /// Up to when this replica holds `origin`'s writes as far as anyone it can
    /// reach knows: the later of its watermark's timestamp (every write of the
    /// origin stamped at or below it is applied here) and, for an origin suspected
    /// down, its vouched time (every replica this one still hears had applied no
    /// more of the origin's stream, as of then, than this one holds).
    pub fn fresh_as_of(&self, origin: &ReplicaId) -> Timestamp {
        match self.origins.binary_search(origin) {
            Ok(i) => self.fresh_at(i),
            Err(_) => Timestamp::ZERO,
        }
    }

    fn fresh_at(&self, i: usize) -> Timestamp {
        let vouched = self.vouched.as_ref().map_or(Timestamp::ZERO, |v| v[i]);
        self.marks[i].timestamp.max(vouched)
    }

    /// What bounded-staleness reads compare with their bound: the earliest
    /// [`ScopeWatermarks::fresh_as_of`] over the origins. With every origin up it is
    /// the low watermark; an origin lost for good stops holding it back once this
    /// replica has all of its writes that the replicas it hears have
    /// (docs/consistency.md, "Bounded staleness"). Zero when the scope has no
    /// origin yet.
    pub fn freshness(&self) -> Timestamp {
        (0..self.marks.len())
            .map(|i| self.fresh_at(i))
            .min()
            .unwrap_or(Timestamp::ZERO)
    }

    /// Whether the write a token names has been applied here: a sequence comparison,
    /// never a clock comparison (I3).
    pub fn covers(&self, token: &Token) -> bool {
        token.scope == self.scope
            && self
                .find(&token.origin)
                .is_some_and(|w| w.sequence >= token.sequence)
    }

    fn find(&self, origin: &ReplicaId) -> Option<&Watermark> {
        self.origins
            .binary_search(origin)
            .ok()
            .map(|i| &self.marks[i])
    }

    pub fn get(&self, origin: &ReplicaId) -> Watermark {
        self.find(origin).copied().unwrap_or_default()
    }

    pub fn to_proto(&self) -> pb::ScopeWatermarks {
        pb::ScopeWatermarks {
            scope: self.scope.to_string(),
            origins: self
                .iter()
                .enumerate()
                .map(|(i, (o, w))| pb::OriginWatermark {
                    origin: o.to_string(),
                    sequence: w.sequence,
                    timestamp: w.timestamp.as_u64(),
                    vouched: self.vouched.as_ref().map_or(0, |v| v[i].as_u64()),
                })
                .collect(),
            low_watermark: self.low_watermark().as_u64(),
            freshness: self.freshness().as_u64(),
        }
    }

    /// Parses watermarks a replica sent; entries with invalid names are skipped (they
    /// can only make the view less complete, never unsafe: missing origins count as
    /// zero). An origin listed twice takes its last watermark.
    pub fn from_proto(p: &pb::ScopeWatermarks) -> ScopeWatermarks {
        let mut pairs: Vec<(ReplicaId, Watermark, Timestamp)> = p
            .origins
            .iter()
            .filter(|w| pangea_topology::schema::validate_name("replica", &w.origin).is_ok())
            .map(|w| {
                let watermark = Watermark {
                    sequence: w.sequence,
                    timestamp: Timestamp::from_u64(w.timestamp),
                };
                let vouched = Timestamp::from_u64(w.vouched);
                (ReplicaId::from(w.origin.as_str()), watermark, vouched)
            })
            .collect();
        // Stable, so of an origin's repeats the last sent is last; keep that one.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(ReplicaId, Watermark, Timestamp)> = Vec::with_capacity(pairs.len());
        for (o, w, v) in pairs {
            match kept.last_mut() {
                Some(last) if last.0 == o => (last.1, last.2) = (w, v),
                _ => kept.push((o, w, v)),
            }
        }
        let vouched: Option<Arc<[Timestamp]>> = kept
            .iter()
            .any(|(_, _, v)| *v > Timestamp::ZERO)
            .then(|| kept.iter().map(|(_, _, v)| *v).collect());
        ScopeWatermarks::from_sorted(
            p.scope.as_str().into(),
            kept.into_iter().map(|(o, w, _)| (o, w)),
        )
        .with_vouched(vouched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wm(sequence: u64) -> Watermark {
        Watermark {
            sequence,
            timestamp: Timestamp::from_u64(sequence * 10),
        }
    }

    /// Peers may send origins in any order and more than once: the parsed
    /// watermarks are in origin order, the last of each origin counting, and
    /// lookups find them.
    #[test]
    fn from_proto_sorts_origins_and_keeps_the_last_of_each() {
        let o = |origin: &str, sequence: u64| pb::OriginWatermark {
            origin: origin.into(),
            sequence,
            timestamp: sequence * 10,
            vouched: 0,
        };
        let p = pb::ScopeWatermarks {
            scope: "global".into(),
            origins: vec![
                o("c", 3),
                o("a", 1),
                o("b", 2),
                o("a", 7),
                o("bad name!", 9),
            ],
            low_watermark: 0,
            freshness: 0,
        };
        let got = ScopeWatermarks::from_proto(&p);
        let listed: Vec<(&str, u64)> = got.iter().map(|(o, w)| (o.as_str(), w.sequence)).collect();
        assert_eq!(listed, [("a", 7), ("b", 2), ("c", 3)]);
        assert_eq!(got.get(&"a".into()), wm(7));
        assert_eq!(got.get(&"z".into()), Watermark::default());
        assert_eq!(got.low_watermark(), Timestamp::from_u64(20));
        let token = |sequence| Token {
            scope: ScopeId::global(),
            origin: "b".into(),
            sequence,
            timestamp: Timestamp::ZERO,
        };
        assert!(got.covers(&token(2)) && !got.covers(&token(3)));
        assert_eq!(ScopeWatermarks::from_proto(&got.to_proto()), got);
    }

    /// An origin suspected down and vouched for stops holding freshness back; the
    /// low watermark (what is applied from everyone) does not move; the vouched
    /// times travel in the proto.
    #[test]
    fn freshness_takes_vouched_times_of_origins_down() {
        let w = ScopeWatermarks::from_sorted(
            ScopeId::global(),
            [
                ("a".into(), wm(5)),
                ("b".into(), wm(9)),
                ("c".into(), wm(7)),
            ],
        );
        assert_eq!(w.freshness(), Timestamp::from_u64(50));
        let at = |t: u64| Timestamp::from_u64(t);
        let v = w.with_vouched(Some(vec![at(120), at(0), at(0)].into()));
        assert_eq!(v.low_watermark(), at(50), "nothing more is applied");
        assert_eq!(v.fresh_as_of(&"a".into()), at(120));
        assert_eq!(v.fresh_as_of(&"b".into()), at(90));
        assert_eq!(v.freshness(), at(70), "now c holds it back");
        assert_eq!(ScopeWatermarks::from_proto(&v.to_proto()), v);
        let mut grown = v;
        grown.insert("b2".into(), wm(1));
        assert_eq!(grown.fresh_as_of(&"b2".into()), at(10));
        assert_eq!(grown.fresh_as_of(&"a".into()), at(120));
    }
}
