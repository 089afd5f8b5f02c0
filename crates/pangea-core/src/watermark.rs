//! A replica's watermarks for one scope, as reads and clients see them.

use crate::hlc::Timestamp;
use crate::ids::{ReplicaId, ScopeId};
use crate::storage::Watermark;
use crate::token::Token;
use pangea_proto::v1 as pb;
use std::collections::BTreeMap;

/// How far a replica has durably applied each origin's stream in one scope.
/// `origins` lists every origin of the scope (replicas that store rows), those
/// never heard from at zero, so the low watermark is honest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeWatermarks {
    pub scope: ScopeId,
    pub origins: BTreeMap<ReplicaId, Watermark>,
}

impl ScopeWatermarks {
    pub fn new(scope: ScopeId) -> Self {
        ScopeWatermarks {
            scope,
            origins: BTreeMap::new(),
        }
    }

    /// Minimum timestamp over origins: every write at or below it, from every origin,
    /// has been applied (I3, I7). Zero when the scope has no origin yet.
    pub fn low_watermark(&self) -> Timestamp {
        self.origins
            .values()
            .map(|w| w.timestamp)
            .min()
            .unwrap_or(Timestamp::ZERO)
    }

    /// Whether the write a token names has been applied here: a sequence comparison,
    /// never a clock comparison (I3).
    pub fn covers(&self, token: &Token) -> bool {
        token.scope == self.scope
            && self
                .origins
                .get(&token.origin)
                .is_some_and(|w| w.sequence >= token.sequence)
    }

    pub fn get(&self, origin: &ReplicaId) -> Watermark {
        self.origins.get(origin).copied().unwrap_or_default()
    }

    pub fn to_proto(&self) -> pb::ScopeWatermarks {
        pb::ScopeWatermarks {
            scope: self.scope.to_string(),
            origins: self
                .origins
                .iter()
                .map(|(o, w)| pb::OriginWatermark {
                    origin: o.to_string(),
                    sequence: w.sequence,
                    timestamp: w.timestamp.as_u64(),
                })
                .collect(),
            low_watermark: self.low_watermark().as_u64(),
        }
    }

    /// Parses watermarks a replica sent; entries with invalid names are skipped (they
    /// can only make the view less complete, never unsafe: missing origins count as
    /// zero).
    pub fn from_proto(p: &pb::ScopeWatermarks) -> ScopeWatermarks {
        let origins = p
            .origins
            .iter()
            .filter(|w| pangea_topology::schema::validate_name("replica", &w.origin).is_ok())
            .map(|w| {
                (
                    ReplicaId::from(w.origin.as_str()),
                    Watermark {
                        sequence: w.sequence,
                        timestamp: Timestamp::from_u64(w.timestamp),
                    },
                )
            })
            .collect();
        ScopeWatermarks {
            scope: p.scope.as_str().into(),
            origins,
        }
    }
}
