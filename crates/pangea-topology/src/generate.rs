//! Random deployments for seeded tests: the core's cluster harness and the
//! simulator's swarm draw theirs here, so both explore the same space of shapes.
//!
//! A deployment has 2 continents splitting the regions, 1 to `replicas_per_region_max`
//! replicas per region (at least 3 in all; with `relays`, the second of three or
//! more is a relay), a chain of links (so every policy over consecutive regions is
//! connected) plus random extra links, round trips of 5–204 ms, one table `t` of
//! three families (f: 2 versions; g; h: 3 versions, 1 h TTL), and with `restricted`
//! a policy over a random run of consecutive regions for rows under `r/`.

use crate::{Deployment, Placement, Topology};
use std::collections::BTreeSet;
use std::path::Path;

/// What to draw.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    /// The topology's name, and its files' stem in problems (`NAME.toml`).
    pub name: &'a str,
    pub regions: usize,
    pub replicas_per_region_max: usize,
    pub relays: bool,
    pub restricted: bool,
    /// `shard_groups` of the topology (1: one group, the key left out).
    pub shard_groups: u32,
    /// Most processes a replica runs (≤ `shard_groups`; 1: the key left out).
    /// Replicas run 1 ..= this many, by their place in the file (drawing
    /// nothing, so the rest of the deployment is as with one).
    pub processes_max: u32,
}

/// A deployment of `shape`; `below(n)` draws uniformly from `[0, n)` (n ≥ 1), and
/// `rtt_scale`, if given, draws the factor (`1 + below(4)`, halved) each link's
/// round trip is scaled by — from a stream of its own, so that the rest of the
/// deployment stays as without it.
pub fn random_deployment(
    shape: &Shape<'_>,
    below: &mut dyn FnMut(u64) -> u64,
    mut rtt_scale: Option<&mut dyn FnMut(u64) -> u64>,
) -> Deployment {
    let regions = shape.regions.max(2);
    let mut t = format!("name = \"{}\"\nintra_region_rtt_ms = 1.0\n", shape.name);
    if shape.shard_groups > 1 {
        t += &format!("shard_groups = {}\n", shape.shard_groups);
    }
    let half = regions.div_ceil(2);
    let mut total = 0;
    for c in 0..2 {
        t += &format!("[[continents]]\nname = \"c{c}\"\n");
        for region in (c * half)..((c + 1) * half).min(regions) {
            t += &format!("[[continents.regions]]\nname = \"r{region}\"\n");
            let n = 1 + below(shape.replicas_per_region_max.max(1) as u64) as usize;
            for k in 0..n {
                let role = if shape.relays && k == 1 && n > 2 {
                    "relay"
                } else {
                    "serving"
                };
                t += &format!(
                    "[[continents.regions.replicas]]\nid = \"r{region}-{k}\"\nrole = \"{role}\"\n"
                );
                if shape.processes_max > 1 {
                    let processes = 1 + (total as u32 * 3 + region as u32) % shape.processes_max;
                    t += &format!("processes = {processes}\n");
                }
                total += 1;
            }
            if region == 0 && total < 3 {
                // At least three replicas overall.
                for k in n..3 {
                    t += &format!(
                        "[[continents.regions.replicas]]\nid = \"r0-{k}\"\nrole = \"serving\"\n"
                    );
                    total += 1;
                }
            }
        }
    }
    let mut links = BTreeSet::new();
    for i in 1..regions {
        links.insert((i - 1, i));
    }
    for _ in 0..below(regions as u64) {
        let (a, b) = (
            below(regions as u64) as usize,
            below(regions as u64) as usize,
        );
        if a != b {
            links.insert((a.min(b), a.max(b)));
        }
    }
    for (a, b) in links {
        let mut rtt = 5 + below(200);
        if let Some(scale) = rtt_scale.as_deref_mut() {
            rtt = rtt * (1 + scale(4)) / 2 + 1;
        }
        t += &format!("[[links]]\na = \"r{a}\"\nb = \"r{b}\"\nrtt_ms = {rtt}\n");
    }
    let file = format!("{}.toml", shape.name);
    let topology = Topology::parse(Path::new(&file), &t).expect("generated topology is valid");
    let mut p = String::from(
        "[[tables]]\nname = \"t\"\n[[tables.families]]\nname = \"f\"\nmax_versions = 2\n[[tables.families]]\nname = \"g\"\n[[tables.families]]\nname = \"h\"\nmax_versions = 3\nttl = \"1h\"\n[[tables.families]]\nname = \"n\"\ntype = \"counter\"\n",
    );
    if shape.restricted {
        let start = below(regions as u64 - 1) as usize;
        let len = 1 + below((regions - start) as u64) as usize;
        let rs: Vec<String> = (start..start + len).map(|i| format!("\"r{i}\"")).collect();
        p += &format!(
            "[[policies]]\nname = \"restricted\"\nregions = [{}]\n[[rules]]\ntable = \"t\"\nprefix = \"r/\"\npolicy = \"restricted\"\n",
            rs.join(", ")
        );
    }
    let file = format!("{}-placement.toml", shape.name);
    let placement =
        Placement::parse(Path::new(&file), &p, &topology).expect("generated placement is valid");
    Deployment {
        topology,
        placement,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape the harnesses draw validates, whatever the draws (a generator
    /// that always answers the largest value, then the smallest, then cycles).
    #[test]
    fn every_shape_validates() {
        for regions in 2..=8 {
            for per_region in 1..=4 {
                for (relays, restricted) in [(false, false), (true, true)] {
                    for pick in [0u64, 1, 7] {
                        let shape = Shape {
                            name: "gen",
                            regions,
                            replicas_per_region_max: per_region,
                            relays,
                            restricted,
                            shard_groups: 1,
                            processes_max: 1,
                        };
                        let mut i = pick;
                        let mut below = |n: u64| {
                            i = i.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                            (i >> 33) % n
                        };
                        let d = random_deployment(&shape, &mut below, None);
                        assert!(d.topology.replicas.len() >= 3);
                        let has = d
                            .placement
                            .policies
                            .keys()
                            .any(|k| k.as_str() == "restricted");
                        assert_eq!(has, restricted);
                    }
                }
            }
        }
    }
}
