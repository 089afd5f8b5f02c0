//! Spanning trees: who forwards replication traffic to whom.
//!
//! A scope's tree is the minimum spanning tree of its replicas, where a candidate edge
//! joins two replicas of one region (weight: the region's intra-region round trip) or
//! two replicas of regions joined by a link (weight: the link's round trip). Ties
//! break by replica ids, so every replica computes the same tree from the same view.
//! Computing a tree over a subset of live replicas is a cheap pure function (a few
//! hundred edges for the reference topology): the replication core calls it whenever
//! its view of live replicas changes. A tree is an optimization, never a correctness
//! assumption (docs/invariants.md).

use crate::ids::{ReplicaId, ScopeId};
use crate::topology::{Role, Topology};
use petgraph::data::Element;
use petgraph::graph::UnGraph;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// An undirected edge between two replicas (`a < b`), with its round trip.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Edge {
    pub a: ReplicaId,
    pub b: ReplicaId,
    pub latency_ms: f64,
}

impl Edge {
    fn new(x: &ReplicaId, y: &ReplicaId, latency_ms: f64) -> Edge {
        let (a, b) = if x < y {
            (x.clone(), y.clone())
        } else {
            (y.clone(), x.clone())
        };
        Edge { a, b, latency_ms }
    }
}

/// Edge weight with the deterministic tie-break: (round trip, the endpoints'
/// [`crate::Replica::hub_rank`] summed, a, b). Among equally long edges, those
/// touching relays win, then serving replicas, then batch replicas (`hub = true |
/// false` in the file overrides): relays become the hubs that carry traffic
/// between regions, and a batch-loaded host is a leaf of its region, on no other
/// replica's path, whenever the tree allows.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
struct Weight(f64, u8, ReplicaId, ReplicaId);

/// A scope's spanning tree (a spanning forest if its live replicas are cut apart).
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    pub scope: ScopeId,
    pub replicas: BTreeSet<ReplicaId>,
    /// Sorted by (a, b).
    pub edges: Vec<Edge>,
    adjacency: BTreeMap<ReplicaId, Vec<ReplicaId>>,
}

impl Tree {
    /// Hangs `leaf` under `parent`, a member, by an edge of `latency_ms` (a
    /// resize's follower under the process serving its group).
    pub fn attach_leaf(&mut self, leaf: &ReplicaId, parent: &ReplicaId, latency_ms: f64) {
        debug_assert!(self.replicas.contains(parent) && !self.replicas.contains(leaf));
        let edge = Edge::new(leaf, parent, latency_ms);
        let at = self
            .edges
            .partition_point(|e| (&e.a, &e.b) < (&edge.a, &edge.b));
        self.edges.insert(at, edge);
        self.replicas.insert(leaf.clone());
        self.adjacency
            .entry(leaf.clone())
            .or_default()
            .push(parent.clone());
        let up = self.adjacency.entry(parent.clone()).or_default();
        up.push(leaf.clone());
        up.sort();
    }

    /// Tree neighbours of `replica`, in id order (empty if it is not in the tree).
    pub fn neighbours(&self, replica: &ReplicaId) -> &[ReplicaId] {
        self.adjacency.get(replica).map_or(&[], Vec::as_slice)
    }

    pub fn contains(&self, replica: &ReplicaId) -> bool {
        self.replicas.contains(replica)
    }

    pub fn total_latency_ms(&self) -> f64 {
        self.edges.iter().map(|e| e.latency_ms).sum()
    }

    /// True when the edges connect every replica (n - 1 edges, no cycles by
    /// construction).
    pub fn is_spanning(&self) -> bool {
        self.edges.len() + 1 == self.replicas.len() || self.replicas.is_empty()
    }

    /// The tree path from `from` to `to`, both included.
    pub fn path(&self, from: &ReplicaId, to: &ReplicaId) -> Option<Vec<ReplicaId>> {
        let mut parent: BTreeMap<&ReplicaId, &ReplicaId> = BTreeMap::new();
        let mut queue = VecDeque::from([from]);
        parent.insert(from, from);
        while let Some(r) = queue.pop_front() {
            if r == to {
                let mut path = vec![to.clone()];
                let mut at = to;
                while at != from {
                    at = parent[at];
                    path.push(at.clone());
                }
                path.reverse();
                return Some(path);
            }
            for n in self.neighbours(r) {
                if !parent.contains_key(n) {
                    parent.insert(n, r);
                    queue.push_back(n);
                }
            }
        }
        None
    }
}

impl Topology {
    /// Every candidate edge among `members`: same-region pairs and pairs across a link.
    pub fn candidate_edges(&self, members: &BTreeSet<ReplicaId>) -> Vec<Edge> {
        let reps: Vec<_> = self
            .replicas
            .values()
            .filter(|r| members.contains(&r.id))
            .collect();
        let mut edges = Vec::new();
        for (i, x) in reps.iter().enumerate() {
            for y in &reps[i + 1..] {
                let rtt = if x.region == y.region {
                    Some(self.regions[&x.region].intra_rtt_ms)
                } else {
                    self.link(&x.region, &y.region).map(|l| l.rtt_ms)
                };
                if let Some(rtt) = rtt {
                    edges.push(Edge::new(&x.id, &y.id, rtt));
                }
            }
        }
        edges
    }

    /// The minimum spanning tree (forest, if cut apart) of `members`.
    pub fn spanning_tree(&self, scope: ScopeId, members: &BTreeSet<ReplicaId>) -> Tree {
        let ids: Vec<&ReplicaId> = members
            .iter()
            .filter(|m| self.replicas.contains_key(*m))
            .collect();
        let mut g = UnGraph::<ReplicaId, Weight>::new_undirected();
        let nodes: BTreeMap<&ReplicaId, _> = ids
            .iter()
            .map(|id| (*id, g.add_node((*id).clone())))
            .collect();
        let rank = |id: &ReplicaId| self.replicas[id].hub_rank();
        for e in self.candidate_edges(members) {
            let w = Weight(
                e.latency_ms,
                rank(&e.a) + rank(&e.b),
                e.a.clone(),
                e.b.clone(),
            );
            g.add_edge(nodes[&e.a], nodes[&e.b], w);
        }
        let mut edges: Vec<Edge> = petgraph::algo::min_spanning_tree(&g)
            .filter_map(|el| match el {
                Element::Edge {
                    weight: Weight(rtt, _, a, b),
                    ..
                } => Some(Edge {
                    a,
                    b,
                    latency_ms: rtt,
                }),
                Element::Node { .. } => None,
            })
            .collect();
        // A relay at a leaf forwards nothing: drop it (repeatedly).
        loop {
            let mut degree: BTreeMap<&ReplicaId, usize> = BTreeMap::new();
            for e in &edges {
                *degree.entry(&e.a).or_default() += 1;
                *degree.entry(&e.b).or_default() += 1;
            }
            let leaf = |id: &ReplicaId| {
                degree.get(id) == Some(&1) && self.replicas[id].role == Role::Relay
            };
            let before = edges.len();
            let keep: Vec<bool> = edges.iter().map(|e| !leaf(&e.a) && !leaf(&e.b)).collect();
            let mut keep = keep.into_iter();
            edges.retain(|_| keep.next().unwrap_or(true));
            if edges.len() == before {
                break;
            }
        }
        edges.sort_by(|x, y| (&x.a, &x.b).cmp(&(&y.a, &y.b)));
        let mut adjacency: BTreeMap<ReplicaId, Vec<ReplicaId>> = BTreeMap::new();
        for e in &edges {
            adjacency.entry(e.a.clone()).or_default().push(e.b.clone());
            adjacency.entry(e.b.clone()).or_default().push(e.a.clone());
        }
        for n in adjacency.values_mut() {
            n.sort();
        }
        // Members are the replicas the tree reaches (pruned relays are not members);
        // isolated replicas stay members with no edges.
        let replicas = ids
            .into_iter()
            .filter(|id| adjacency.contains_key(*id) || self.replicas[*id].role != Role::Relay)
            .cloned()
            .collect();
        Tree {
            scope,
            replicas,
            edges,
            adjacency,
        }
    }
}
