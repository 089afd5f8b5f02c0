//! A tiny seeded PRNG (splitmix64) for loss, jitter and backoff.
//!
//! Why our own: the draws must replay from a seed (a failing WAN test prints its
//! seed), we need a few dozen lines rather than a dependency, and nothing here is
//! security-sensitive. splitmix64 passes BigCrush and every seed, zero included,
//! gives a full-period stream.

/// splitmix64 (Steele, Lea, Flood 2014), as in `java.util.SplittableRandom`.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in `[0, 1)` with 53 bits of precision.
    pub(crate) fn next_f64(&mut self) -> f64 {
        // The top 53 bits fit an f64 mantissa exactly; the cast is lossless.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform draw in `[0, bound]` (inclusive). Uses a 128-bit multiply, whose
    /// bias is below 2^-64 and irrelevant here.
    pub(crate) fn next_u64_inclusive(&mut self, bound: u64) -> u64 {
        if bound == u64::MAX {
            return self.next_u64();
        }
        let range = u128::from(bound) + 1;
        // The product of a u64 and a value <= 2^64 shifted right by 64 fits in u64.
        ((u128::from(self.next_u64()) * range) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vector() {
        // First outputs for seed 1234567 from the reference implementation.
        let mut rng = SplitMix64::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn bounded_draws_stay_in_range() {
        let mut rng = SplitMix64::new(7);
        for bound in [0, 1, 2, 10, 1_000_000] {
            for _ in 0..1000 {
                assert!(rng.next_u64_inclusive(bound) <= bound);
            }
        }
        for _ in 0..1000 {
            let x = rng.next_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
