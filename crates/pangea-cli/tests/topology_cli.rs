//! `pangea topology check | plan | diff` on the reference files and on broken copies.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology")
}

fn pangea(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pangea"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn check_accepts_the_reference_files() {
    let t = root().join("four-continents.toml");
    let p = root().join("placement.toml");
    let (ok, out, err) = pangea(
        &[
            "topology",
            "check",
            t.to_str().unwrap(),
            "--placement",
            p.to_str().unwrap(),
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("27 replicas in 13 regions on 4 continents"),
        "{out}"
    );
}

#[test]
fn check_lists_every_problem_with_file_line_and_key_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("local-3-regions.toml")).unwrap();
    let broken = text.replacen("\nrtt_ms = ", "\nrtt_ms = -", 1).replacen(
        "role = \"serving\"",
        "role = \"servnig\"",
        1,
    );
    let f = dir.path().join("broken.toml");
    std::fs::write(&f, &broken).unwrap();
    let (ok, _, err) = pangea(&["topology", "check", f.to_str().unwrap()], &[]);
    assert!(!ok);
    assert!(err.contains("2 problems"), "{err}");
    let line = |needle: &str| broken.lines().position(|l| l.contains(needle)).unwrap() + 1;
    assert!(
        err.contains(&format!(
            "broken.toml:{}: continents[0].regions[0].replicas[0].role",
            line("servnig")
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "broken.toml:{}: links[0].rtt_ms",
            line("rtt_ms = -")
        )),
        "{err}"
    );
}

#[test]
fn environment_overrides_apply_and_are_validated() {
    let t = root().join("local-3-regions.toml");
    let (ok, out, err) = pangea(
        &["topology", "plan", t.to_str().unwrap(), "--json"],
        &[("PANGEA_TOPOLOGY_INTRA_REGION_RTT_MS", "4")],
    );
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    let intra: Vec<f64> = plan["graph"]["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["a"].as_str().unwrap()[..4] == l["b"].as_str().unwrap()[..4])
        .map(|l| l["latency_ms"].as_f64().unwrap())
        .collect();
    assert!(
        !intra.is_empty() && intra.iter().all(|&l| l == 4.0),
        "{intra:?}"
    );

    let (ok, _, err) = pangea(
        &["topology", "check", t.to_str().unwrap()],
        &[("PANGEA_TOPOLOGY_INTRA_REGION_RTT_MS", "-2")],
    );
    assert!(!ok);
    assert!(
        err.contains("intra_region_rtt_ms") && err.contains("-2"),
        "{err}"
    );
}

/// Kruskal over `graph.links` restricted to a scope's replicas: the JSON carries
/// everything needed to recompute each tree's weight.
fn kruskal_total(links: &[serde_json::Value], members: &[String]) -> f64 {
    let idx = |r: &str| members.iter().position(|m| m == r);
    let mut edges: Vec<(f64, usize, usize)> = links
        .iter()
        .filter_map(|l| {
            Some((
                l["latency_ms"].as_f64()?,
                idx(l["a"].as_str()?)?,
                idx(l["b"].as_str()?)?,
            ))
        })
        .collect();
    edges.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut parent: Vec<usize> = (0..members.len()).collect();
    fn find(p: &mut Vec<usize>, x: usize) -> usize {
        if p[x] != x {
            let r = find(p, p[x]);
            p[x] = r;
        }
        p[x]
    }
    let mut total = 0.0;
    for (w, a, b) in edges {
        let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
        if ra != rb {
            parent[ra] = rb;
            total += w;
        }
    }
    total
}

#[test]
fn plan_json_lets_anyone_recompute_the_trees() {
    let t = root().join("four-continents.toml");
    let p = root().join("placement.toml");
    let svg = tempfile::NamedTempFile::new().unwrap();
    let dot = tempfile::NamedTempFile::new().unwrap();
    let (ok, out, err) = pangea(
        &[
            "topology",
            "plan",
            t.to_str().unwrap(),
            "--placement",
            p.to_str().unwrap(),
            "--json",
            "--svg",
            svg.path().to_str().unwrap(),
            "--dot",
            dot.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    let links = plan["graph"]["links"].as_array().unwrap();
    let scopes = plan["scopes"].as_array().unwrap();
    assert_eq!(
        scopes
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["global", "apac", "eu-resident"]
    );
    for s in scopes {
        let members: Vec<String> = s["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap().to_owned())
            .collect();
        let edges = s["edges"].as_array().unwrap();
        assert_eq!(
            edges.len() + 1,
            members.len(),
            "scope {} is a spanning tree",
            s["name"]
        );
        for e in edges {
            assert!(e["a"].is_string() && e["b"].is_string() && e["latency_ms"].is_f64());
        }
        let total = s["total_latency_ms"].as_f64().unwrap();
        assert!(
            (total - kruskal_total(links, &members)).abs() < 1e-6,
            "scope {}: {total}",
            s["name"]
        );
        let tree = &s["wan_bytes_tree"];
        let mesh = &s["wan_bytes_mesh"];
        assert!(
            tree["inter_continent"].as_f64().unwrap() <= mesh["inter_continent"].as_f64().unwrap()
        );
    }
    // The drawings: a panel per scope in the SVG (pangea-topology's
    // tests/svg_geometry.rs checks its geometry), and in the Graphviz source a
    // cluster per continent and region, and every tree edge tagged with its scope
    // and labelled with its round trip.
    let drawing = std::fs::read_to_string(svg.path()).unwrap();
    assert!(drawing.starts_with("<svg") && drawing.contains("eu-central-1"));
    let graph = std::fs::read_to_string(dot.path()).unwrap();
    assert!(graph.contains("graph \"four-continents\" {"), "{graph}");
    assert!(graph.contains("subgraph \"cluster_continent_oceania\""));
    assert!(graph.contains("subgraph \"cluster_region_eu-central-1\""));
    for s in scopes {
        let name = s["name"].as_str().unwrap();
        assert!(
            drawing.contains(&format!("<g data-scope=\"{name}\">"))
                && drawing.contains(&format!("scope {name}: ")),
            "no panel for scope {name}"
        );
        let tagged = format!("class=\"scope-{name}\"");
        for e in s["edges"].as_array().unwrap() {
            let (a, b) = (e["a"].as_str().unwrap(), e["b"].as_str().unwrap());
            let ms = e["latency_ms"].as_f64().unwrap();
            let label = if ms.fract() == 0.0 {
                format!("{ms:.0} ms")
            } else {
                format!("{ms:.1} ms")
            };
            assert!(
                drawing.contains(&format!("data-edge=\"{a} {b}\"")),
                "{name}: {a}-{b} not drawn"
            );
            let line = format!("\"{a}\" -- \"{b}\" [label=\"{label}\"");
            assert!(
                graph
                    .lines()
                    .any(|l| l.contains(&line) && l.contains(&tagged)),
                "{name}: no {line} in the DOT"
            );
        }
        assert_eq!(
            graph.matches(&tagged).count(),
            s["edges"].as_array().unwrap().len(),
            "{name}: edges in the DOT"
        );
    }
}

#[test]
fn diff_names_replicas_edges_policies_and_moved_rows() {
    let dir = tempfile::tempdir().unwrap();
    let old_t = root().join("local-3-regions.toml");
    let old_p = root().join("local-3-regions.placement.toml");
    let new_t = dir.path().join("t.toml");
    let new_p = dir.path().join("p.toml");
    let t = std::fs::read_to_string(&old_t).unwrap().replace(
        "    [[continents.regions.replicas]]\n    id = \"euw1-b\"",
        "    [[continents.regions.replicas]]\n    id = \"euw1-c\"\n    role = \"serving\"\n\n    [[continents.regions.replicas]]\n    id = \"euw1-b\"",
    );
    std::fs::write(&new_t, t).unwrap();
    let p = std::fs::read_to_string(&old_p).unwrap().replace(
        "prefix = \"eu/\"\npolicy = \"eu-resident\"",
        "prefix = \"eu/\"\npolicy = \"global\"",
    );
    std::fs::write(&new_p, p).unwrap();
    let (ok, out, err) = pangea(
        &[
            "topology",
            "diff",
            old_t.to_str().unwrap(),
            new_t.to_str().unwrap(),
            "--placement-old",
            old_p.to_str().unwrap(),
            "--placement-new",
            new_p.to_str().unwrap(),
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert!(out.contains("+ replica euw1-c"), "{out}");
    assert!(out.contains("+ edge"), "{out}");
    assert!(
        out.contains("rows of ad_profiles under \"eu/\" move: policy eu-resident -> global"),
        "{out}"
    );
}

/// Shard groups are planned in the files and shown by `plan`, each replica
/// once with the groups of each of its processes (docs/sharding.md).
#[test]
fn plan_shows_the_groups_of_each_process() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("local-3-regions.toml")).unwrap();
    let sharded = text
        .replacen(
            "intra_region_rtt_ms = 1.0\n",
            "intra_region_rtt_ms = 1.0\nshard_groups = 8\n",
            1,
        )
        .replacen(
            "id = \"use1-a\"\n",
            "id = \"use1-a\"\n    processes = 2\n",
            1,
        );
    assert_ne!(sharded, text);
    let f = dir.path().join("sharded.toml");
    std::fs::write(&f, &sharded).unwrap();
    let (ok, out, err) = pangea(&["topology", "plan", f.to_str().unwrap()], &[]);
    assert!(ok, "{err}");
    assert!(out.contains("shard groups: 8"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.contains("use1-a") && l.contains("2 processes: groups 0–3 | 4–7")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("euw1-a") && l.contains("1 process: groups 0–7")),
        "{out}"
    );
    // Each replica once in the plan, not once per process.
    assert_eq!(
        out.lines().filter(|l| l.contains("use1-a.p1")).count(),
        0,
        "{out}"
    );
}

/// `topology diff` names a layout change that `apply` would refuse.
#[test]
fn diff_names_a_layout_change_apply_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let old = root().join("local-3-regions.toml");
    let text = std::fs::read_to_string(&old).unwrap();
    let grown = text.replacen(
        "intra_region_rtt_ms = 1.0\n",
        "intra_region_rtt_ms = 1.0\nshard_groups = 16\n",
        1,
    );
    let f = dir.path().join("grown.toml");
    std::fs::write(&f, &grown).unwrap();
    let (ok, out, err) = pangea(
        &[
            "topology",
            "diff",
            old.to_str().unwrap(),
            f.to_str().unwrap(),
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("! shard_groups would change from 1 to 16")
            && out.contains("`topology apply` refuses it"),
        "{out}"
    );
    assert!(!out.contains("no changes"), "{out}");
}
