//! Row affinity: weighted rendezvous hashing of row keys onto a region's serving
//! replicas. Specified in docs/row-affinity.md, with test vectors, so a frontend in
//! any language can reproduce it:
//!
//! 1. `seed = xxh3_64(replica_id_bytes)`; `h = xxh3_64_with_seed(row_key, seed)`
//!    (XXH3 64-bit, default secret).
//! 2. With equal weights, the replica with the largest `h` wins (ties: the smaller
//!    id) — integers only.
//! 3. With weights, `u = ((h >> 11) + 0.5) / 2^53` (uniform in (0, 1)) and the score is
//!    `-weight / ln(u)`; the largest score wins (ties: the smaller id).
//!
//! Adding or removing a replica moves only the keys it gains or loses: every other
//! key's winner is unchanged, since each replica's score for a key does not depend on
//! the others.

use crate::ids::ReplicaId;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The 64-bit hash of `row_key` for `replica`.
pub fn affinity_hash(replica: &str, row_key: &[u8]) -> u64 {
    xxh3_64_with_seed(row_key, xxh3_64(replica.as_bytes()))
}

/// The weighted score of a hash (larger wins).
pub fn weighted_score(weight: f64, hash: u64) -> f64 {
    let u = ((hash >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -weight / u.ln()
}

/// The winner among `(replica, weight)` candidates for `row_key`.
pub fn rendezvous<'a>(
    candidates: &[(&'a ReplicaId, f64)],
    row_key: &[u8],
) -> Option<&'a ReplicaId> {
    let equal = candidates.windows(2).all(|w| w[0].1 == w[1].1);
    let better = |a: (&ReplicaId, f64), b: (&ReplicaId, f64)| -> bool {
        // Is candidate `a` better than `b`?
        let (ha, hb) = (
            affinity_hash(a.0.as_str(), row_key),
            affinity_hash(b.0.as_str(), row_key),
        );
        let ord = if equal {
            ha.cmp(&hb)
        } else {
            weighted_score(a.1, ha).total_cmp(&weighted_score(b.1, hb))
        };
        ord.then_with(|| b.0.cmp(a.0)).is_gt()
    };
    let mut best: Option<(&'a ReplicaId, f64)> = None;
    for &(id, w) in candidates {
        if best.is_none_or(|b| better((id, w), b)) {
            best = Some((id, w));
        }
    }
    best.map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: usize) -> Vec<ReplicaId> {
        (0..n).map(|i| ReplicaId::new(format!("r{i}"))).collect()
    }

    /// The vectors published in docs/row-affinity.md (cross-checked with Python's
    /// `xxhash` package).
    #[test]
    fn test_vectors() {
        assert_eq!(
            affinity_hash("us-east-1a", b"user:42"),
            0x3bfb_2340_20e4_2fcb
        );
        assert_eq!(
            affinity_hash("us-east-1b", b"user:42"),
            0x8555_d245_a019_261f
        );
        let reps = [
            ReplicaId::from("us-east-1a"),
            ReplicaId::from("us-east-1b"),
            ReplicaId::from("us-east-1c"),
        ];
        let keys = [
            "user:1",
            "user:2",
            "user:3",
            "user:42",
            "app7,user9,1700000000",
        ];
        let pick = |cands: &[(&ReplicaId, f64)]| -> Vec<String> {
            keys.iter()
                .map(|k| rendezvous(cands, k.as_bytes()).unwrap().to_string())
                .collect()
        };
        let equal: Vec<_> = reps.iter().map(|r| (r, 1.0)).collect();
        assert_eq!(
            pick(&equal),
            [
                "us-east-1c",
                "us-east-1c",
                "us-east-1a",
                "us-east-1b",
                "us-east-1c"
            ]
        );
        let weighted = [(&reps[0], 1.0), (&reps[1], 2.0), (&reps[2], 0.5)];
        assert_eq!(
            pick(&weighted),
            [
                "us-east-1b",
                "us-east-1b",
                "us-east-1a",
                "us-east-1b",
                "us-east-1c"
            ]
        );
    }

    #[test]
    fn weights_shift_share() {
        let reps = ids(2);
        let cands = [(&reps[0], 3.0), (&reps[1], 1.0)];
        let n: u32 = 20_000;
        let heavy = (0..n)
            .filter(|i| rendezvous(&cands, format!("k{i}").as_bytes()) == Some(&reps[0]))
            .count();
        let share = heavy as f64 / f64::from(n);
        assert!(
            (0.72..0.78).contains(&share),
            "weight 3:1 gave share {share}"
        );
    }

    proptest! {
        /// Removing a replica moves only the keys it owned; adding one moves keys only to it.
        #[test]
        fn minimal_movement(n in 2usize..8, removed in 0usize..8, weights in prop::collection::vec(0.5f64..4.0, 8), keys in prop::collection::vec(any::<u64>(), 1..200)) {
            let reps = ids(n);
            let removed = removed % n;
            let all: Vec<_> = reps.iter().zip(&weights).map(|(r, w)| (r, *w)).collect();
            let fewer: Vec<_> = all.iter().copied().filter(|(r, _)| **r != reps[removed]).collect();
            for k in keys {
                let key = k.to_le_bytes();
                let before = rendezvous(&all, &key).unwrap();
                let after = rendezvous(&fewer, &key).unwrap();
                if before != &reps[removed] {
                    prop_assert_eq!(before, after);
                }
                // And the reverse direction: adding `removed` back moves keys only to it.
                if before != after {
                    prop_assert_eq!(before, &reps[removed]);
                }
            }
        }
    }
}
