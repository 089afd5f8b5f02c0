//! Spanning trees: minimal, deterministic, spanning, restricted to their scope, and
//! cheap to recompute over any subset of live replicas.

use pangea_topology::{Deployment, Placement, ReplicaId, Role, ScopeId, Topology};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::path::Path;

/// A random connected topology as TOML: `regions` regions on 2 continents, a chain of
/// links plus `extra` random ones, optional relays.
fn topology_text(sizes: &[usize], rtts: &[u32], extra: &[(usize, usize)], relays: bool) -> String {
    let mut t = String::from("name = \"r\"\nintra_region_rtt_ms = 1.0\n");
    for (c, chunk) in sizes.chunks(sizes.len().div_ceil(2)).enumerate() {
        t += &format!("[[continents]]\nname = \"c{c}\"\n");
        for (i, n) in chunk.iter().enumerate() {
            let r = c * sizes.len().div_ceil(2) + i;
            t += &format!("[[continents.regions]]\nname = \"r{r}\"\n");
            for k in 0..*n {
                let role = if relays && k == 1 { "relay" } else { "serving" };
                t += &format!(
                    "[[continents.regions.replicas]]\nid = \"r{r}-{k}\"\nrole = \"{role}\"\n"
                );
            }
        }
    }
    let mut links = BTreeSet::new();
    for r in 1..sizes.len() {
        links.insert((r - 1, r));
    }
    for &(a, b) in extra {
        let (a, b) = (a % sizes.len(), b % sizes.len());
        if a != b {
            links.insert((a.min(b), a.max(b)));
        }
    }
    for (i, (a, b)) in links.iter().enumerate() {
        t += &format!(
            "[[links]]\na = \"r{a}\"\nb = \"r{b}\"\nrtt_ms = {}\n",
            rtts[i % rtts.len()]
        );
    }
    t
}

/// Prim's algorithm over the candidate edges, for comparison.
fn prim_total(t: &Topology, members: &BTreeSet<ReplicaId>) -> f64 {
    let edges = t.candidate_edges(members);
    let mut inside: BTreeSet<&ReplicaId> = members.iter().take(1).collect();
    let mut total = 0.0;
    while inside.len() < members.len() {
        let best = edges
            .iter()
            .filter(|e| inside.contains(&e.a) != inside.contains(&e.b))
            .min_by(|x, y| x.latency_ms.total_cmp(&y.latency_ms));
        let Some(e) = best else { break };
        total += e.latency_ms;
        inside.insert(&e.a);
        inside.insert(&e.b);
    }
    total
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn trees_are_minimal_spanning_and_deterministic(
        sizes in prop::collection::vec(1usize..4, 2..8),
        rtts in prop::collection::vec(1u32..300, 30),
        extra in prop::collection::vec((0usize..8, 0usize..8), 0..10),
        relays: bool,
        dead in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
    ) {
        let text = topology_text(&sizes, &rtts, &extra, relays);
        let t = Topology::parse(Path::new("r.toml"), &text).unwrap();
        let d = Deployment { placement: Placement::global_only(&t), topology: t };
        let tree = d.tree(&ScopeId::global(), None);
        prop_assert_eq!(&tree, &d.tree(&ScopeId::global(), None));
        // Every row-storing replica is reached, by a tree (n - 1 edges, connected).
        for r in d.topology.replicas.values().filter(|r| r.role != Role::Relay) {
            prop_assert!(tree.contains(&r.id));
        }
        prop_assert!(tree.is_spanning());
        let first = tree.replicas.iter().next().unwrap();
        for r in &tree.replicas {
            prop_assert!(tree.path(first, r).is_some());
        }
        if !relays {
            let all: BTreeSet<_> = d.topology.replicas.keys().cloned().collect();
            prop_assert!((tree.total_latency_ms() - prim_total(&d.topology, &all)).abs() < 1e-9);
        }
        // Over a live subset: only live replicas, still a forest of the candidate graph.
        let mut live: BTreeSet<ReplicaId> = d.topology.replicas.keys().cloned().collect();
        let ids: Vec<_> = live.iter().cloned().collect();
        for i in dead {
            live.remove(i.get(&ids));
        }
        let sub = d.tree(&ScopeId::global(), Some(&live));
        prop_assert!(sub.replicas.iter().all(|r| live.contains(r)));
        prop_assert!(sub.edges.iter().all(|e| live.contains(&e.a) && live.contains(&e.b)));
    }
}

#[test]
fn restricted_scopes_use_only_their_regions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    let d = Deployment::load(
        &root.join("four-continents.toml"),
        Some(&root.join("placement.toml")),
    )
    .unwrap();
    let eu = ScopeId::new("eu-resident");
    let tree = d.tree(&eu, None);
    assert!(tree.is_spanning());
    for r in &tree.replicas {
        assert!(d.allowed(r, &eu), "{r} is outside eu-resident");
        assert_eq!(d.topology.replicas[r].continent, "europe");
    }
    assert_eq!(tree.replicas.len(), 9);
    // The global tree spans everyone, and uses the relay as a hub, not a leaf.
    let global = d.tree(&ScopeId::global(), None);
    assert_eq!(global.replicas.len(), d.topology.replicas.len());
    assert!(global.neighbours(&"aps1-relay".into()).len() >= 2);
}

#[test]
fn affinity_picks_a_serving_replica_of_the_region() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    let d = Deployment::load(&root.join("four-continents.toml"), None).unwrap();
    let region = "us-east-1".into();
    let mut seen = BTreeSet::new();
    for i in 0..300 {
        let r = d
            .affinity_replica(&region, format!("user:{i}").as_bytes())
            .unwrap();
        assert_eq!(d.topology.replicas[r].role, Role::Serving);
        seen.insert(r.clone());
    }
    // Three serving replicas in us-east-1 (the batch one never wins).
    assert_eq!(seen.len(), 3);
}

/// Batch replicas are not hubs: where edges are equally long (every pair of two
/// regions' replicas shares their link's round trip, every pair inside a region the
/// region's), the tree routes through serving replicas, even when a batch
/// replica's id sorts first, and leaves the batch replica a leaf; `hub = true`
/// makes it a hub again, and `hub = false` keeps a serving replica off the paths.
#[test]
fn batch_replicas_are_leaves_unless_the_file_says_hub() {
    let text = |batch_hub: &str, b_hub: &str| {
        format!(
            "name = \"h\"\nintra_region_rtt_ms = 1.0\n\
             [[continents]]\nname = \"c\"\n\
             [[continents.regions]]\nname = \"east\"\n\
             [[continents.regions.replicas]]\nid = \"a-batch\"\nrole = \"batch\"\n{batch_hub}\n\
             [[continents.regions.replicas]]\nid = \"b-serving\"\nrole = \"serving\"\n{b_hub}\n\
             [[continents.regions.replicas]]\nid = \"c-serving\"\nrole = \"serving\"\n\
             [[continents.regions]]\nname = \"west\"\n\
             [[continents.regions.replicas]]\nid = \"w-serving\"\nrole = \"serving\"\n\
             [[links]]\na = \"east\"\nb = \"west\"\nrtt_ms = 40.0\n"
        )
    };
    let neighbours = |text: String, id: &str| -> Vec<String> {
        let t = Topology::parse(Path::new("h.toml"), &text).unwrap();
        let members: BTreeSet<ReplicaId> = t.replicas.keys().cloned().collect();
        let tree = t.spanning_tree(ScopeId::global(), &members);
        tree.neighbours(&ReplicaId::new(id))
            .iter()
            .map(|r| r.to_string())
            .collect()
    };
    // By role: the batch replica hangs off one serving replica, which is the hub.
    assert_eq!(neighbours(text("", ""), "a-batch"), ["b-serving"]);
    assert_eq!(
        neighbours(text("", ""), "b-serving"),
        ["a-batch", "c-serving", "w-serving"]
    );
    // The file says otherwise: the batch replica is the hub.
    assert_eq!(
        neighbours(text("hub = true", ""), "a-batch"),
        ["b-serving", "c-serving", "w-serving"]
    );
    // A serving replica kept off the paths: the other one is the hub.
    assert_eq!(
        neighbours(text("", "hub = false"), "c-serving"),
        ["a-batch", "b-serving", "w-serving"]
    );
}
