//! The same picture as Graphviz source (`pangea topology plan --dot`), for operators'
//! own tools: continents and regions as nested clusters, replicas as nodes coloured
//! by role, and every scope's tree edges in the scope's colour with their round trip
//! as label. Each edge carries `class="scope-NAME"`, so one scope can be picked out
//! (`gvpr`, or any DOT reader); nodes and edges carry tooltips.

use super::{PALETTE, class_name, class_width, ms, role_fill, role_name};
use crate::Deployment;
use crate::tree::Tree;
use std::fmt::Write;

/// A DOT string literal.
fn q(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Graphviz source for `trees` (one per scope) over the deployment's topology.
pub fn dot(d: &Deployment, trees: &[Tree]) -> String {
    let t = &d.topology;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// topology {}: continents and regions as clusters, replicas by role, each\n\
         // scope's tree edges in its colour with their round trip (class=\"scope-NAME\").\n\
         // Render: dot -Tsvg FILE > plan.svg",
        t.name
    );
    let _ = writeln!(out, "graph {} {{", q(&t.name));
    let _ = writeln!(
        out,
        "  graph [label={}, labelloc=t, fontname=\"Helvetica\", nodesep=0.25];",
        q(&format!("topology {}", t.name))
    );
    let _ = writeln!(
        out,
        "  node [shape=ellipse, style=filled, fontname=\"Helvetica\", fontsize=10];"
    );
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=9];");
    for continent in &t.continents {
        let regions: Vec<_> = t
            .regions
            .values()
            .filter(|r| &r.continent == continent)
            .collect();
        if regions.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "  subgraph {} {{\n    label={}; style=\"rounded,dashed\"; color=\"#57606a\";",
            q(&format!("cluster_continent_{continent}")),
            q(continent)
        );
        for region in regions {
            let _ = writeln!(
                out,
                "    subgraph {} {{\n      label={}; style=\"rounded,filled\"; fillcolor=\"#f6f8fa\"; color=\"#8c959f\";",
                q(&format!("cluster_region_{}", region.name)),
                q(region.name.as_str())
            );
            for id in &region.replicas {
                let r = &t.replicas[id];
                let _ = writeln!(
                    out,
                    "      {} [fillcolor=\"{}\", tooltip={}];",
                    q(id.as_str()),
                    role_fill(r.role),
                    q(&format!(
                        "{id}: {} replica in {} ({})",
                        role_name(r.role),
                        r.region,
                        r.continent
                    ))
                );
            }
            let _ = writeln!(out, "    }}");
        }
        let _ = writeln!(out, "  }}");
    }
    for (i, tree) in trees.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()].0;
        let regions = d
            .placement
            .policy(&tree.scope)
            .map(|p| {
                p.regions
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  // scope {}: {} edges, {} in all; policy regions: {regions}",
            tree.scope,
            tree.edges.len(),
            ms((tree.total_latency_ms() * 10.0).round() / 10.0),
        );
        for e in &tree.edges {
            let class = t.link_class(&e.a, &e.b);
            let _ = writeln!(
                out,
                "  {} -- {} [label={}, color=\"{colour}\", fontcolor=\"{colour}\", penwidth={}, class={}, tooltip={}];",
                q(e.a.as_str()),
                q(e.b.as_str()),
                q(&ms(e.latency_ms)),
                class_width(class),
                q(&format!("scope-{}", tree.scope)),
                q(&format!(
                    "scope {}: {} — {}, {} round trip, {}",
                    tree.scope,
                    e.a,
                    e.b,
                    ms(e.latency_ms),
                    class_name(class)
                ))
            );
        }
    }
    out.push_str("}\n");
    out
}
