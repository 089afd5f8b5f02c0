//! Issue 36 point 3, on the reference workload's key set: with G = 64 groups over
//! P processes, how evenly rows and requests spread over the processes of one
//! replica (`pangea_topology::shard`). Rows are every key the workload can
//! draw; requests are 1,000,000 operations drawn as the simulator's frontends
//! draw them (zipf 0.99). A zipf head cannot be balanced by any placement of
//! whole keys — the hottest key alone carries several percent of the requests —
//! so requests are compared with the hot keys set aside, and those are reported.
//! `--nocapture` prints the table docs/sharding.md quotes.

use pangea_sim::drill::Drill;
use pangea_sim::workload::Generator;
use pangea_topology::shard::{GroupId, group_of, process_of};
use std::collections::HashMap;
use std::path::Path;

const GROUPS: u32 = 64;
const DRAWS: usize = 1_000_000;
/// A key is hot when it alone carries more than this share of the requests.
const HOT_SHARE: f64 = 0.001;

struct Spread {
    rows: Vec<u64>,
    /// Requests per process, hot keys aside…
    requests: Vec<u64>,
    /// …and all of them.
    all_requests: Vec<u64>,
    hot_keys: usize,
    hot_share: f64,
}

fn worst_deviation(v: &[u64]) -> f64 {
    let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
    v.iter()
        .map(|&x| (x as f64 / mean - 1.0).abs())
        .fold(0.0, f64::max)
}

fn spread(keys: &[Vec<u8>], drawn: &HashMap<Vec<u8>, u64>, processes: u32) -> Spread {
    let process = |k: &[u8]| process_of(GROUPS, processes, group_of(GROUPS, k)) as usize;
    let mut rows = vec![0u64; processes as usize];
    for k in keys {
        rows[process(k)] += 1;
    }
    let mut requests = vec![0u64; processes as usize];
    let mut all_requests = vec![0u64; processes as usize];
    let (mut hot_keys, mut hot) = (0, 0u64);
    for (k, &n) in drawn {
        all_requests[process(k)] += n;
        if n as f64 > HOT_SHARE * DRAWS as f64 {
            hot_keys += 1;
            hot += n;
        } else {
            requests[process(k)] += n;
        }
    }
    Spread {
        rows,
        requests,
        all_requests,
        hot_keys,
        hot_share: hot as f64 / DRAWS as f64,
    }
}

#[test]
fn rows_and_requests_spread_evenly_over_processes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sc = Drill::load(&root.join("sim/reference.toml"))
        .expect("the reference file loads")
        .scenario;
    let w = &sc.workload;
    let mut prefixes: Vec<&str> = w.prefixes.values().map(String::as_str).collect();
    prefixes.push(&w.global_prefix);
    prefixes.sort_unstable();
    prefixes.dedup();
    // Every key the workload can draw: `{prefix}{rank:08}`.
    let keys: Vec<Vec<u8>> = prefixes
        .iter()
        .flat_map(|p| (0..w.keys).map(move |r| format!("{p}{r:08}").into_bytes()))
        .collect();
    let mut g = Generator::new(w, 7).expect("the reference workload is valid");
    let mut drawn: HashMap<Vec<u8>, u64> = HashMap::new();
    for i in 0..DRAWS {
        let local = prefixes[i % prefixes.len()];
        *drawn
            .entry(g.draw(local, &w.global_prefix).key.to_vec())
            .or_default() += 1;
    }
    println!(
        "{} keys ({} prefixes × {}), {DRAWS} requests, G = {GROUPS}; hot: a key with > {:.1} % of requests",
        keys.len(),
        prefixes.len(),
        w.keys,
        HOT_SHARE * 100.0
    );
    println!(
        "processes | rows: worst deviation | requests, hot keys aside | all requests | hot keys (their share)"
    );
    for processes in [2, 4, 8, 16] {
        let s = spread(&keys, &drawn, processes);
        let (rows, requests) = (worst_deviation(&s.rows), worst_deviation(&s.requests));
        println!(
            "{processes:>9} | {:>6.1} % | {:>6.1} % | {:>6.1} % | {} ({:.1} %)",
            rows * 100.0,
            requests * 100.0,
            worst_deviation(&s.all_requests) * 100.0,
            s.hot_keys,
            s.hot_share * 100.0
        );
        assert!(
            rows <= 0.10,
            "P = {processes}: rows {:?} deviate {:.1} %",
            s.rows,
            rows * 100.0
        );
        // The bound, at 4 processes (G/P = 16 groups each).
        if processes == 4 {
            assert!(
                requests <= 0.10,
                "P = 4: requests {:?} deviate {:.1} %",
                s.requests,
                requests * 100.0
            );
            assert!(s.hot_keys > 0, "a zipf 0.99 head has hot keys to report");
        }
    }
    // Groups themselves: every one of the 64 holds rows.
    let mut per_group = vec![0u32; GROUPS as usize];
    for k in &keys {
        let GroupId(g) = group_of(GROUPS, k);
        per_group[g as usize] += 1;
    }
    assert!(per_group.iter().all(|&n| n > 0), "{per_group:?}");
}
