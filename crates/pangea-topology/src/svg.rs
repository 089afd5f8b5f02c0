//! A drawing of the topology and its trees, as a standalone SVG: continents as
//! columns, regions as boxes, replicas as circles coloured by role, and each scope's
//! tree as lines in its own colour (the global tree solid, restricted scopes dashed).

use crate::Deployment;
use crate::topology::Role;
use crate::tree::Tree;
use std::collections::BTreeMap;
use std::fmt::Write;

const PER_ROW: usize = 4;
const CELL: f64 = 64.0;
const PAD: f64 = 20.0;
const HEADER: f64 = 28.0;
const PALETTE: [&str; 6] = [
    "#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0a7b83",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders `trees` (one per scope) over the deployment's topology.
pub fn render(d: &Deployment, trees: &[Tree]) -> String {
    let t = &d.topology;
    let mut pos: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let mut boxes = String::new();
    let mut x = PAD;
    let mut height: f64 = 0.0;
    for continent in &t.continents {
        let regions: Vec<_> = t
            .regions
            .values()
            .filter(|r| &r.continent == continent)
            .collect();
        let width = regions
            .iter()
            .map(|r| r.replicas.len().clamp(1, PER_ROW) as f64 * CELL)
            .fold(CELL, f64::max)
            + 2.0 * PAD;
        let mut y = PAD + HEADER;
        let mut inner = String::new();
        for region in regions {
            let rows = region.replicas.len().div_ceil(PER_ROW).max(1) as f64;
            let h = HEADER + rows * CELL;
            let _ = write!(
                inner,
                r##"<rect x="{:.0}" y="{y:.0}" width="{:.0}" height="{h:.0}" rx="6" fill="#f6f8fa" stroke="#8c959f"/><text x="{:.0}" y="{:.0}" font-size="12" font-weight="bold">{}</text>"##,
                x + PAD / 2.0,
                width - PAD,
                x + PAD,
                y + 17.0,
                esc(region.name.as_str())
            );
            for (i, id) in region.replicas.iter().enumerate() {
                let cx = x + PAD + CELL / 2.0 + (i % PER_ROW) as f64 * CELL - 4.0;
                let cy = y + HEADER + CELL / 2.0 - 8.0 + (i / PER_ROW) as f64 * CELL;
                pos.insert(id.as_str(), (cx, cy));
            }
            y += h + PAD / 2.0;
        }
        let _ = write!(
            boxes,
            r##"<rect x="{x:.0}" y="{PAD:.0}" width="{width:.0}" height="{:.0}" rx="10" fill="none" stroke="#57606a" stroke-dasharray="2 3"/><text x="{:.0}" y="{:.0}" font-size="14" font-weight="bold">{}</text>{inner}"##,
            y - PAD,
            x + PAD / 2.0,
            PAD + 19.0,
            esc(continent)
        );
        height = height.max(y);
        x += width + PAD;
    }
    let width = x;

    let mut edges = String::new();
    let mut legend = String::new();
    let legend_y = height + PAD;
    for (i, tree) in trees.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let global = tree.scope.as_str() == crate::GLOBAL_POLICY;
        let (w, dash) = if global {
            (2.5, "")
        } else {
            (1.8, r#" stroke-dasharray="6 4""#)
        };
        let offset = i as f64 * 3.0;
        for e in &tree.edges {
            if let (Some(a), Some(b)) = (pos.get(e.a.as_str()), pos.get(e.b.as_str())) {
                let _ = write!(
                    edges,
                    r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="{w}"{dash} opacity="0.8"><title>{} – {} ({} ms)</title></line>"#,
                    a.0 + offset,
                    a.1 + offset,
                    b.0 + offset,
                    b.1 + offset,
                    e.a,
                    e.b,
                    e.latency_ms
                );
            }
        }
        let ly = legend_y + 18.0 * i as f64;
        let _ = write!(
            legend,
            r#"<line x1="{PAD}" y1="{ly:.0}" x2="{:.0}" y2="{ly:.0}" stroke="{colour}" stroke-width="{w}"{dash}/><text x="{:.0}" y="{:.0}" font-size="12">scope {} — {} edges, {:.0} ms total</text>"#,
            PAD + 30.0,
            PAD + 38.0,
            ly + 4.0,
            esc(tree.scope.as_str()),
            tree.edges.len(),
            tree.total_latency_ms()
        );
    }
    let mut nodes = String::new();
    for (id, (cx, cy)) in &pos {
        let role = t.replicas[*id].role;
        let fill = match role {
            Role::Serving => "#54aeff",
            Role::Batch => "#f0a030",
            Role::Relay => "#afb8c1",
        };
        let _ = write!(
            nodes,
            r##"<circle cx="{cx:.1}" cy="{cy:.1}" r="13" fill="{fill}" stroke="#24292f"><title>{id} ({role:?})</title></circle><text x="{cx:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"##,
            cy + 24.0,
            esc(id)
        );
    }
    let roles_y = legend_y + 18.0 * trees.len() as f64 + 10.0;
    let total_h = roles_y + 30.0;
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{total_h:.0}" viewBox="0 0 {width:.0} {total_h:.0}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="{PAD}" y="14" font-size="13">{}</text>{boxes}{edges}{nodes}{legend}<circle cx="{:.0}" cy="{roles_y:.0}" r="7" fill="#54aeff"/><text x="{:.0}" y="{:.0}" font-size="12">serving</text><circle cx="{:.0}" cy="{roles_y:.0}" r="7" fill="#f0a030"/><text x="{:.0}" y="{:.0}" font-size="12">batch</text><circle cx="{:.0}" cy="{roles_y:.0}" r="7" fill="#afb8c1"/><text x="{:.0}" y="{:.0}" font-size="12">relay</text></svg>"##,
        esc(&format!("topology {}", t.name)),
        PAD + 7.0,
        PAD + 18.0,
        roles_y + 4.0,
        PAD + 90.0,
        PAD + 101.0,
        roles_y + 4.0,
        PAD + 160.0,
        PAD + 171.0,
        roles_y + 4.0,
    )
}
