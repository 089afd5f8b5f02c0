//! The simulator's seeded generator: the project's one generator
//! ([`pangea_core::rng::Rng`], splitmix64), adapted to `rand` so that `rand_distr`
//! distributions (Zipf, log-normal, exponential) draw from the seeded stream. (A
//! newtype with forwarding methods: `rand` implements its traits for every
//! `DerefMut`, so `Deref` to the core's generator would collide.)

use pangea_core::rng::Rng;

#[derive(Debug, Clone)]
pub struct SimRng(Rng);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng(Rng::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// See [`Rng::next_f64`].
    pub fn next_f64(&mut self) -> f64 {
        self.0.next_f64()
    }

    /// See [`Rng::next_u64_inclusive`].
    pub fn next_u64_inclusive(&mut self, bound: u64) -> u64 {
        self.0.next_u64_inclusive(bound)
    }

    /// See [`Rng::next_below`].
    pub fn next_below(&mut self, n: usize) -> usize {
        self.0.next_below(n)
    }

    /// See [`Rng::chance`].
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.chance(p)
    }

    /// An independent generator for one consumer (a client, the workload, the
    /// faults), so that adding draws in one place does not shift every other stream.
    pub fn fork(&mut self, salt: u64) -> SimRng {
        SimRng(self.0.fork(salt))
    }
}

/// Infallible: the blanket impl makes it a `rand::Rng`.
impl rand::TryRng for SimRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        // The high half of a splitmix64 output is as good as the whole.
        Ok((self.0.next_u64() >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.0.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.0.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}
