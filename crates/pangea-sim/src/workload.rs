//! Drawing client operations: arrival times, operation kinds, consistency modes,
//! keys (uniform or Zipf via `rand_distr`) and values (fixed, uniform or
//! log-normal sizes up to 1 MB).
//!
//! Values are slices of one seeded random buffer (`Bytes::slice`: no copy), so a
//! 1 MB write costs a reference count, not a megabyte of random draws, and every
//! replica's copy of it shares the same memory as the real node's `Bytes` would.

use crate::rng::SimRng;
use crate::scenario::{KeyDistribution, ModeMix, ValueSize, Workload};
use crate::time::SimDuration;
use bytes::Bytes;
use rand::distr::Distribution;
use rand_distr::{Exp, LogNormal, Zipf};
use std::collections::HashMap;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

/// A read's consistency mode, as reports name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    Eventual,
    Affinity,
    Watermark,
    Bounded,
    /// As of a time `Workload::as_of_ms` before the read.
    AsOf,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Eventual,
        Mode::Affinity,
        Mode::Watermark,
        Mode::Bounded,
        Mode::AsOf,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Eventual => "eventual",
            Mode::Affinity => "affinity",
            Mode::Watermark => "watermark",
            Mode::Bounded => "bounded",
            Mode::AsOf => "as_of",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What one operation does.
#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    Read(Mode),
    /// Set one cell of the row to `value`.
    Write {
        column: u32,
        value: Bytes,
    },
    /// Delete the whole row.
    Delete,
    /// Add 1 to counter `c{column}` of the workload's counter family.
    Increment {
        column: u32,
    },
    /// Cell writes of several rows in one request (`MutateRows`): the drawn
    /// key's row first, then rows of the same key prefix, each row atomic, the
    /// batch not.
    Batch(Vec<BatchRow>),
}

/// One row of a batch write: its key, and the cell `c{column}` set to `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRow {
    pub key: Bytes,
    pub column: u32,
    pub value: Bytes,
}

/// One drawn operation.
#[derive(Debug, Clone, PartialEq)]
pub struct DrawnOp {
    pub kind: OpKind,
    pub key: Bytes,
}

/// Longest value the pool serves (the brief's 1 MB p99 bound).
pub const VALUE_BYTES_MAX: usize = 1 << 20;

/// The rate per second (of one region's frontends) above which arrivals are
/// drawn finer than a microsecond apart ([`Generator::interarrival`]): a capacity
/// search's rates, far above any drill's.
pub const FINE_ARRIVALS_RATE: f64 = 100_000.0;

/// Draws operations for a workload; one per run, seeded.
#[derive(Debug)]
pub struct Generator {
    rng: SimRng,
    zipf: Option<Zipf<f64>>,
    lognormal: Option<LogNormal<f64>>,
    /// Cumulative operation fractions: read, write, increment, batch (delete =
    /// rest).
    op_cdf: [f64; 4],
    /// Rows of a batch write.
    batch_rows: usize,
    /// Cumulative mode fractions.
    mode_cdf: [f64; 4],
    /// Some reads are as of a time (without, the draws are those of the other
    /// four modes alone).
    as_of: bool,
    keys: u64,
    value_size: ValueSize,
    columns: u32,
    local_fraction: f64,
    pool: Bytes,
    /// Keys drawn before, by (prefix, rank): formatting a key was a fair part of
    /// drawing an operation, and skewed draws repeat keys. At most
    /// [`KEY_CACHE_MAX`] keys; drawing does not depend on it.
    key_cache: HashMap<(usize, u64), Bytes, Xxh3DefaultBuilder>,
    /// The prefixes seen, their positions the first half of `key_cache`'s keys.
    key_prefixes: Vec<String>,
}

/// Most keys [`Generator`] keeps formatted.
const KEY_CACHE_MAX: usize = 1 << 16;

fn cdf<const N: usize>(parts: [f64; N]) -> Vec<f64> {
    let total: f64 = parts.iter().sum();
    let mut acc = 0.0;
    parts
        .iter()
        .map(|p| {
            acc += if total > 0.0 { p / total } else { 0.0 };
            acc
        })
        .collect()
}

impl Generator {
    pub fn new(w: &Workload, seed: u64) -> anyhow::Result<Generator> {
        let mut rng = SimRng::new(seed);
        let zipf = match w.key_distribution {
            KeyDistribution::Uniform => None,
            KeyDistribution::Zipf { theta } => Some(
                Zipf::new(w.keys.max(1) as f64, theta)
                    .map_err(|e| anyhow::anyhow!("zipf(keys {}, theta {theta}): {e}", w.keys))?,
            ),
        };
        let lognormal = match w.value_size {
            ValueSize::LogNormal { median, sigma, .. } => Some(
                LogNormal::new((median.max(1) as f64).ln(), sigma)
                    .map_err(|e| anyhow::anyhow!("log-normal value size: {e}"))?,
            ),
            _ => None,
        };
        // Increments and batches before deletes: without them the boundaries are
        // those of read, write, delete alone (and so are the draws).
        let ops = cdf([w.read, w.write, w.increment, w.batch, w.delete]);
        let ModeMix {
            eventual,
            affinity,
            watermark,
            bounded,
            as_of,
        } = w.modes;
        let modes = cdf([eventual, affinity, watermark, bounded, as_of]);
        let pool_len = w.value_size.max_bytes().clamp(1, VALUE_BYTES_MAX) * 2;
        let mut pool = vec![0u8; pool_len];
        for chunk in pool.chunks_mut(8) {
            let b = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        Ok(Generator {
            rng,
            zipf,
            lognormal,
            op_cdf: [ops[0], ops[1], ops[2], ops[3]],
            batch_rows: w.batch_rows.max(1) as usize,
            mode_cdf: [modes[0], modes[1], modes[2], modes[3]],
            as_of: as_of > 0.0,
            keys: w.keys.max(1),
            value_size: w.value_size,
            columns: w.columns.max(1),
            local_fraction: w.local_fraction,
            pool: Bytes::from(pool),
            key_cache: HashMap::default(),
            key_prefixes: Vec::new(),
        })
    }

    /// Time to the next arrival of a Poisson process of `rate` per second, in
    /// whole microseconds (the clock's unit). Up to [`FINE_ARRIVALS_RATE`] a
    /// gap is at least 1 µs; above it gaps are mostly under a microsecond, so a
    /// gap of x µs becomes ⌊x⌋ or ⌈x⌉ at random with mean x (0: arrivals at the
    /// same microsecond), which keeps the rate asked for instead of capping it
    /// near 1,000,000 a second.
    pub fn interarrival(&mut self, rate: f64) -> SimDuration {
        if rate <= 0.0 {
            return SimDuration::MAX;
        }
        let exp = Exp::new(rate).expect("a positive rate is a valid exponential");
        let s: f64 = exp.sample(&mut self.rng);
        let us = s * 1e6;
        if rate <= FINE_ARRIVALS_RATE {
            return SimDuration::from_us((us as u64).max(1));
        }
        let whole = us.floor();
        let up = self.rng.next_f64() < us - whole;
        SimDuration::from_us(whole as u64 + u64::from(up))
    }

    fn key_rank(&mut self) -> u64 {
        match &self.zipf {
            // Ranks are 1-based; the hottest key is rank 1.
            Some(z) => (z.sample(&mut self.rng) as u64).clamp(1, self.keys) - 1,
            None => self.rng.next_below(self.keys as usize) as u64,
        }
    }

    fn value_len(&mut self) -> usize {
        let n = match self.value_size {
            ValueSize::Fixed(n) => n,
            ValueSize::Uniform { min, max } => {
                min + self.rng.next_u64_inclusive((max - min) as u64) as usize
            }
            ValueSize::LogNormal { max, .. } => {
                let x: f64 = self
                    .lognormal
                    .as_ref()
                    .map_or(1.0, |d| d.sample(&mut self.rng));
                (x.round() as usize).min(max)
            }
        };
        n.clamp(1, VALUE_BYTES_MAX)
    }

    /// Draws one operation for a client whose own keys start with `local_prefix`;
    /// `global_prefix` keys are everyone's.
    pub fn draw(&mut self, local_prefix: &str, global_prefix: &str) -> DrawnOp {
        let u = self.rng.next_f64();
        let prefix = if self.rng.chance(self.local_fraction) {
            local_prefix
        } else {
            global_prefix
        };
        let rank = self.key_rank();
        let key = self.key(prefix, rank);
        let kind = if u < self.op_cdf[0] {
            let m = self.rng.next_f64();
            let mode = if m < self.mode_cdf[0] {
                Mode::Eventual
            } else if m < self.mode_cdf[1] {
                Mode::Affinity
            } else if m < self.mode_cdf[2] {
                Mode::Watermark
            } else if !self.as_of || m < self.mode_cdf[3] {
                Mode::Bounded
            } else {
                Mode::AsOf
            };
            OpKind::Read(mode)
        } else if u < self.op_cdf[1] {
            let (column, value) = self.cell();
            OpKind::Write { column, value }
        } else if u < self.op_cdf[2] {
            OpKind::Increment {
                column: self.rng.next_below(self.columns as usize) as u32,
            }
        } else if u < self.op_cdf[3] {
            let mut rows = Vec::with_capacity(self.batch_rows);
            let (column, value) = self.cell();
            rows.push(BatchRow {
                key: key.clone(),
                column,
                value,
            });
            for _ in 1..self.batch_rows {
                let rank = self.key_rank();
                let key = self.key(prefix, rank);
                let (column, value) = self.cell();
                rows.push(BatchRow { key, column, value });
            }
            OpKind::Batch(rows)
        } else {
            OpKind::Delete
        };
        DrawnOp { kind, key }
    }

    /// A cell write's column and value.
    fn cell(&mut self) -> (u32, Bytes) {
        let len = self.value_len();
        let start = self.rng.next_below(self.pool.len() - len + 1);
        let column = self.rng.next_below(self.columns as usize) as u32;
        (column, self.pool.slice(start..start + len))
    }

    /// Distinct rows per key prefix.
    pub fn keys(&self) -> u64 {
        self.keys
    }

    /// A write of row `rank` under `prefix`, its column and value drawn as any
    /// write's (a region's fill, [`crate::scenario::RegionLoad::fill`]).
    pub fn write_of(&mut self, prefix: &str, rank: u64) -> DrawnOp {
        let (column, value) = self.cell();
        DrawnOp {
            kind: OpKind::Write { column, value },
            key: self.key(prefix, rank),
        }
    }

    /// The key of `rank` under `prefix`: `{prefix}{rank:08}`.
    fn key(&mut self, prefix: &str, rank: u64) -> Bytes {
        let p = match self.key_prefixes.iter().position(|p| p == prefix) {
            Some(p) => p,
            None => {
                self.key_prefixes.push(prefix.to_owned());
                self.key_prefixes.len() - 1
            }
        };
        if let Some(k) = self.key_cache.get(&(p, rank)) {
            return k.clone();
        }
        let key = Bytes::from(format!("{prefix}{rank:08}"));
        if self.key_cache.len() < KEY_CACHE_MAX {
            self.key_cache.insert((p, rank), key.clone());
        }
        key
    }

    /// True with probability `p`, from the workload's stream (drawn only when a
    /// caller has a `p` to draw, so runs without it keep their trace).
    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.chance(p)
    }

    /// A uniform index below `n` from the workload's stream (client choice).
    pub fn pick(&mut self, n: usize) -> usize {
        self.rng.next_below(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::RegionLoad;
    use std::collections::BTreeMap;

    fn workload() -> Workload {
        Workload {
            table: "t".into(),
            family: "f".into(),
            columns: 2,
            keys: 1000,
            key_distribution: KeyDistribution::Zipf { theta: 0.99 },
            value_size: ValueSize::LogNormal {
                median: 1000,
                sigma: 1.0,
                max: 4096,
            },
            read: 0.75,
            write: 0.15,
            delete: 0.05,
            increment: 0.05,
            batch: 0.0,
            batch_rows: 1,
            counter_family: "n".into(),
            modes: ModeMix {
                eventual: 1.0,
                affinity: 1.0,
                watermark: 1.0,
                bounded: 1.0,
                as_of: 1.0,
            },
            bounded_ms: 1000,
            as_of_ms: 1000,
            read_back: 0.0,
            write_ack: crate::scenario::WriteAck::Origin,
            deadline: SimDuration::from_ms(20),
            write_deadline: SimDuration::from_ms(200),
            hedge: true,
            record_reads: 0,
            app_profile: "frontend".into(),
            prefixes: BTreeMap::new(),
            global_prefix: "g/".into(),
            local_fraction: 0.5,
            regions: vec![RegionLoad {
                fill: false,
                region: "r".into(),
                clients: 1,
                rate: 10.0,
            }],
        }
    }

    #[test]
    fn draws_follow_the_mix_and_the_bounds() {
        let mut g = Generator::new(&workload(), 3).unwrap();
        let (mut reads, mut writes, mut deletes, mut local) = (0, 0, 0, 0);
        let mut increments = 0;
        let mut hot = 0;
        let mut by_mode = [0; Mode::ALL.len()];
        for _ in 0..20_000 {
            let op = g.draw("l/", "g/");
            if op.key.starts_with(b"l/") {
                local += 1;
            }
            if &op.key[2..] == b"00000000" {
                hot += 1;
            }
            match op.kind {
                OpKind::Read(m) => {
                    reads += 1;
                    by_mode[m.index()] += 1;
                }
                OpKind::Write { value, column } => {
                    assert!((1..=4096).contains(&value.len()));
                    assert!(column < 2);
                    writes += 1;
                }
                OpKind::Delete => deletes += 1,
                OpKind::Increment { column } => {
                    assert!(column < 2);
                    increments += 1;
                }
                OpKind::Batch(_) => panic!("no batches in the mix"),
            }
        }
        assert!((14_000..16_000).contains(&reads), "{reads}");
        // Five modes, equally likely.
        assert!(
            by_mode.iter().all(|n| (2_500..3_500).contains(n)),
            "{by_mode:?}"
        );
        assert!((700..1_300).contains(&increments), "{increments}");
        assert!((2_500..3_500).contains(&writes), "{writes}");
        assert!((700..1_300).contains(&deletes), "{deletes}");
        assert!((9_000..11_000).contains(&local), "{local}");
        // Zipf(0.99) over 1000 keys puts ~13 % of draws on the hottest key.
        assert!(hot > 1_500, "{hot}");
    }

    #[test]
    fn batches_write_rows_of_one_prefix() {
        let mut w = workload();
        (w.read, w.write, w.delete, w.increment, w.batch) = (0.5, 0.0, 0.0, 0.0, 0.5);
        w.batch_rows = 8;
        let mut g = Generator::new(&w, 5).unwrap();
        let (mut batches, mut local, mut distinct) = (0, 0, 0);
        for _ in 0..2_000 {
            let op = g.draw("l/", "g/");
            let OpKind::Batch(rows) = op.kind else {
                continue;
            };
            batches += 1;
            assert_eq!(rows.len(), 8);
            assert_eq!(rows[0].key, op.key, "the drawn key's row goes first");
            let prefix = &op.key[..2];
            assert!(rows.iter().all(|r| r.key.starts_with(prefix)), "{rows:?}");
            assert!(rows.iter().all(|r| r.column < 2 && !r.value.is_empty()));
            local += usize::from(prefix == b"l/");
            let mut keys: Vec<_> = rows.iter().map(|r| &r.key).collect();
            keys.sort();
            keys.dedup();
            distinct += keys.len();
        }
        assert!((900..1_100).contains(&batches), "{batches}");
        assert!((400..600).contains(&local), "{local}");
        // Zipf(0.99) over 1000 keys repeats the hottest rows within a batch
        // now and then, as a real batch of hot users would.
        assert!(
            distinct > batches * 6,
            "{distinct} distinct rows in {batches} batches"
        );
    }

    #[test]
    fn same_seed_same_draws() {
        let mut a = Generator::new(&workload(), 9).unwrap();
        let mut b = Generator::new(&workload(), 9).unwrap();
        for _ in 0..100 {
            assert_eq!(a.draw("l/", "g/"), b.draw("l/", "g/"));
            assert_eq!(a.interarrival(5.0), b.interarrival(5.0));
        }
    }

    /// Gaps are whole microseconds, yet the rate holds: at 1,000 a second the
    /// mean gap is 1 ms, and at 3,000,000 a second (most gaps under 1 µs,
    /// which a floor of 1 µs would cap at about 1,000,000) a third of a µs.
    #[test]
    fn arrivals_keep_their_rate_below_and_above_a_microsecond_apart() {
        let mut g = Generator::new(&workload(), 4).unwrap();
        for rate in [1_000.0, 3_000_000.0] {
            let n = 200_000;
            let total: u64 = (0..n).map(|_| g.interarrival(rate).as_us()).sum();
            let mean_us = total as f64 / n as f64;
            let expected = 1e6 / rate;
            assert!(
                (mean_us / expected - 1.0).abs() < 0.02,
                "rate {rate}: mean gap {mean_us} µs, expected {expected}"
            );
        }
    }
}
