//! Topology and placement files: the TOML an operator edits by hand.
//!
//! The input is UTF-8 text (anything else is refused before parsing, as reading the
//! file would be). Without a NUL byte it is parsed both as a topology and as a
//! placement for the reference topology (`topology/local-3-regions.toml`); with one,
//! the text before it is a topology and the text after it a placement for that
//! topology (the combined validation of `Deployment::load`). A deployment that
//! validates then goes through what `pangea topology check/plan/diff/svg` and every
//! replica do with it: trees per scope, the plan, a diff against the reference,
//! the SVG drawing, and the placement of a few row keys.
//!
//! Problems must be reported (and displayed, with their line numbers), never panic.

use crate::deployment;
use pangea_topology::{Deployment, Placement, Topology};
use std::path::Path;

pub fn topology(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.split_once('\0') {
        Some((topology_text, placement_text)) => {
            if let Some(topology) = parse_topology(topology_text) {
                parse_placement(placement_text, &topology);
            }
        }
        None => {
            parse_topology(text);
            parse_placement(text, &deployment().topology);
        }
    }
}

fn parse_topology(text: &str) -> Option<Topology> {
    match Topology::parse(Path::new("fuzz-topology.toml"), text) {
        Ok(t) => {
            let placement = Placement::global_only(&t);
            exercise(&Deployment {
                topology: t.clone(),
                placement,
            });
            Some(t)
        }
        Err(problems) => {
            assert!(!problems.0.is_empty(), "an error without a problem");
            let _ = problems.to_string();
            None
        }
    }
}

fn parse_placement(text: &str, topology: &Topology) {
    match Placement::parse(Path::new("fuzz-placement.toml"), text, topology) {
        Ok(placement) => exercise(&Deployment {
            topology: topology.clone(),
            placement,
        }),
        Err(problems) => {
            assert!(!problems.0.is_empty(), "an error without a problem");
            let _ = problems.to_string();
        }
    }
}

/// What tools and replicas compute from a valid deployment.
fn exercise(d: &Deployment) {
    let mut trees = Vec::new();
    for scope in d.scopes() {
        let members = d.scope_members(scope);
        let tree = d.tree(scope, None);
        for m in &members {
            let relay = d.topology.replicas[m].role == pangea_topology::Role::Relay;
            assert!(
                relay || tree.contains(m),
                "{m} missing from the tree of {scope}"
            );
        }
        assert!(
            tree.edges.len() < tree.replicas.len().max(1),
            "a cycle in the tree of {scope}"
        );
        trees.push(tree);
    }
    let _ = d.plan();
    let _ = d.diff(&deployment());
    let _ = pangea_topology::svg::render(d, &trees);
    for table in d.placement.schema.tables.keys() {
        for key in [&b""[..], b"eu/1", b"us/1", b"\xff\x00"] {
            let scope = d.scope_of(table, key);
            assert!(
                d.placement.policy(scope).is_some(),
                "a row placed in an unknown policy {scope}"
            );
            let _ = d.placement.home_of(table, key);
        }
    }
    for region in d.topology.regions.keys() {
        let _ = d.affinity_replica(region, b"user/1");
    }
}
