//! Fuzz harnesses for Pangea's untrusted inputs (issue 10, point 1).
//!
//! Each harness is a plain function of arbitrary bytes, so the same code runs under
//! libFuzzer (`fuzz_targets/*.rs`, `cargo +nightly fuzz run <target>`) and as a
//! regression test over the committed corpus plus a bounded run of seeded mutations
//! of it (`cargo test` in this crate, which `.ci/run` runs on stable):
//!
//! - [`client_frame`]: a stream of length-prefixed `ClientRequest` frames through the
//!   real decoder (`pangea_net::decode_frame`) and what a replica does with each
//!   request (token, filter and mutation parsing, placement checks, reads and writes
//!   on an in-memory replica);
//! - [`replication_frame`]: a stream of `ReplicationFrame` frames from one peer
//!   through the decoder, `Frame::from_proto` and `Replica::handle_frame` of an
//!   in-memory replica;
//! - [`token`]: `Token::decode` (and re-encoding);
//! - [`filter`]: a read's `RowFilter` (cell filter trees, regular expressions)
//!   through `ReadFilter::from_proto`, re-encoding, and a read of a wide row;
//! - [`topology`]: topology and placement TOML, and the combined deployment;
//! - [`merge`]: sequences of row mutations through the merge rule, against a model.
//!
//! A harness panics only when Pangea misbehaves: a panic inside Pangea, or a broken
//! promise the harness checks (a round trip, the merge model, monotonic watermarks).

mod client;
mod filter;
mod merge;
mod replication;
pub mod seeds;
mod token;
mod topology;

pub use client::client_frame;
pub use filter::filter;
pub use merge::merge;
pub use replication::replication_frame;
pub use token::token;
pub use topology::topology;

use pangea_core::replica::Now;
use pangea_topology::{Deployment, Placement, Topology};
use std::path::Path;
use std::sync::{Arc, LazyLock};

/// The names of every target, as in `fuzz_targets/` and `corpus/`.
pub const TARGETS: [&str; 6] = [
    "client_frame",
    "filter",
    "replication_frame",
    "token",
    "topology",
    "merge",
];

/// Runs the harness of `target` on `data`.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "client_frame" => client_frame(data),
        "filter" => filter(data),
        "replication_frame" => replication_frame(data),
        "token" => token(data),
        "topology" => topology(data),
        "merge" => merge(data),
        other => panic!("no fuzz target {other:?}"),
    }
}

pub(crate) const LOCAL_TOPOLOGY: &str = include_str!("../../topology/local-3-regions.toml");
pub(crate) const LOCAL_PLACEMENT: &str =
    include_str!("../../topology/local-3-regions.placement.toml");

/// The deployment the frame harnesses' replica belongs to: the repository's
/// `topology/local-3-regions.toml` with its placement (two scopes: `global` and
/// `eu-resident`).
pub(crate) fn deployment() -> Arc<Deployment> {
    static D: LazyLock<Arc<Deployment>> = LazyLock::new(|| {
        let topology = Topology::parse(Path::new("local-3-regions.toml"), LOCAL_TOPOLOGY)
            .expect("reference topology");
        let placement = Placement::parse(
            Path::new("local-3-regions.placement.toml"),
            LOCAL_PLACEMENT,
            &topology,
        )
        .expect("reference placement");
        Arc::new(Deployment {
            topology,
            placement,
        })
    });
    D.clone()
}

/// The replica under test in the frame harnesses: serving, in eu-west-1, so it
/// belongs to both scopes.
pub(crate) const REPLICA: &str = "euw1-a";

/// Wall-clock origin of the harnesses' time (seeds carry timestamps near it).
pub const T0_MS: u64 = 1_700_000_000_000;

pub(crate) fn at(ms: u64) -> Now {
    Now {
        mono_us: ms * 1_000,
        wall_ms: T0_MS + ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn corpus(target: &str) -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        files
    }

    /// Every committed corpus input (seeds, inputs libFuzzer kept, and regression
    /// inputs of fixed bugs) still runs through its harness without a failure.
    #[test]
    fn committed_corpus_passes() {
        let mut total = 0;
        for target in TARGETS {
            let files = corpus(target);
            assert!(!files.is_empty(), "no corpus for {target}");
            for f in &files {
                let data = std::fs::read(f).unwrap();
                eprintln!("{target}: {}", f.display());
                run(target, &data);
            }
            total += files.len();
        }
        eprintln!("{total} corpus inputs passed");
    }

    /// A bounded smoke run on the stable toolchain (what CI can always run): each
    /// target for `PANGEA_FUZZ_SECS` seconds (default 2) on seeded mutations of its
    /// corpus — bit flips, byte changes, insertions, deletions, truncations,
    /// splices — through the same harness. Not coverage-guided (that is libFuzzer's
    /// job, fuzz/run.sh); it catches what a small change to a known-good input breaks.
    /// A failing input is written to `artifacts/<target>/smoke-<n>` before the panic
    /// goes on, so it can be replayed and committed as a regression input.
    #[test]
    fn seeded_mutations_of_the_corpus_pass() {
        let secs: u64 = std::env::var("PANGEA_FUZZ_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2);
        let mut rng = 0x5eed_f00d_cafe_d00du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for target in TARGETS {
            let inputs: Vec<Vec<u8>> = corpus(target)
                .iter()
                .map(|f| std::fs::read(f).unwrap())
                .collect();
            let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
            let mut n = 0u64;
            while std::time::Instant::now() < until {
                let mut data = inputs[next() as usize % inputs.len()].clone();
                for _ in 0..1 + next() % 4 {
                    mutate(&mut data, &inputs, &mut next);
                }
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(target, &data)));
                if let Err(panic) = result {
                    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("artifacts")
                        .join(target);
                    let _ = std::fs::create_dir_all(&dir);
                    let file = dir.join(format!("smoke-{n}"));
                    let _ = std::fs::write(&file, &data);
                    eprintln!("{target}: input {n} failed; saved to {}", file.display());
                    std::panic::resume_unwind(panic);
                }
                n += 1;
            }
            eprintln!("{target}: {n} mutated inputs in {secs} s");
        }
    }

    /// One random change to `data` (another corpus input may be spliced in).
    fn mutate(data: &mut Vec<u8>, inputs: &[Vec<u8>], next: &mut impl FnMut() -> u64) {
        let at = |len: usize, r: u64| if len == 0 { 0 } else { r as usize % len };
        match next() % 6 {
            0 if !data.is_empty() => {
                let i = at(data.len(), next());
                data[i] ^= 1 << (next() % 8);
            }
            1 if !data.is_empty() => {
                let i = at(data.len(), next());
                // Boundary values find length and count bugs more often than noise.
                data[i] = [0, 1, 0x7f, 0x80, 0xff, next() as u8][next() as usize % 6];
            }
            2 => {
                let i = at(data.len() + 1, next());
                let n = 1 + next() as usize % 8;
                for _ in 0..n {
                    data.insert(i.min(data.len()), next() as u8);
                }
            }
            3 if !data.is_empty() => {
                let i = at(data.len(), next());
                let n = (1 + next() as usize % 16).min(data.len() - i);
                data.drain(i..i + n);
            }
            4 => data.truncate(at(data.len() + 1, next())),
            _ => {
                let other = &inputs[next() as usize % inputs.len()];
                let i = at(data.len() + 1, next());
                let j = at(other.len() + 1, next());
                data.truncate(i);
                data.extend_from_slice(&other[j..]);
            }
        }
    }
}
