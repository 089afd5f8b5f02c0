//! A drawing of the deployment and its replication trees, as a standalone SVG
//! (`pangea topology plan --svg`), and as Graphviz ([`dot`], `--dot`).
//!
//! One panel per scope (`global` first, then the policies by name), all with the
//! same layout ([`layout`]): continents as columns in file order, regions as boxes
//! down their continent's column, replicas as discs coloured by role with their ids
//! under them. In a panel, the regions of the scope's policy are tinted in the
//! scope's colour and the others hatched and marked "excluded"; the scope's tree is
//! drawn in its colour, thicker the wider the link (intra-region, inter-region,
//! inter-continent), each edge routed orthogonally along corridors between the
//! boxes ([`route`]) and labelled with its round trip near its middle, where the
//! label covers no disc, no other label and (if possible) no other edge. A legend
//! at the top says all this. The same input gives the same bytes.
//!
//! Text is in a monospace font so its size is known without measuring
//! ([`geom::CHAR_EM`]); tests/svg_geometry.rs checks the drawn geometry.

mod dot;
mod geom;
mod layout;
mod route;
mod scene;

pub use dot::dot;

use crate::Deployment;
use crate::topology::{LinkClass, Role};
use crate::tree::Tree;
use geom::{Anchor, Pt, Rect, baseline_centred, length, point_at, text_box, text_width};
use layout::{FONT_CONTINENT, FONT_EDGE, FONT_REGION, FONT_REPLICA, Geometry, Grid, R, RegionBox};
use route::{Routed, Tracks};
use scene::{Item, esc};
use std::collections::BTreeSet;

/// Scope colours: the line, and the tint of the policy's regions.
const PALETTE: [(&str, &str); 6] = [
    ("#0969da", "#ddf4ff"),
    ("#cf222e", "#ffebe9"),
    ("#1a7f37", "#dafbe1"),
    ("#8250df", "#fbefff"),
    ("#bc4c00", "#fff1e5"),
    ("#0a7b83", "#d8f6f6"),
];
const INK: &str = "#24292f";
const MUTED: &str = "#57606a";
const FAINT: &str = "#8c959f";
const EXCLUDED_DISC: &str = "#eaeef2";
const MARGIN: f64 = 10.0;
/// Between a latency label and any other label.
const LABEL_GAP: f64 = 4.0;
const PANEL_GAP: f64 = 14.0;
const FONT_TITLE: f64 = 15.0;
const FONT_CAPTION: f64 = 12.0;
const FONT_LEGEND: f64 = 11.0;
const FONT: &str = "DejaVu Sans Mono, Menlo, Consolas, monospace";

fn role_fill(role: Role) -> &'static str {
    match role {
        Role::Serving => "#54aeff",
        Role::Batch => "#f0a030",
        Role::Relay => "#b083f0",
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Serving => "serving",
        Role::Batch => "batch",
        Role::Relay => "relay",
    }
}

/// `12 ms`, `4.5 ms`: a round trip as written on an edge.
pub(super) fn ms(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn class_width(class: Option<LinkClass>) -> f64 {
    match class {
        Some(LinkClass::IntraRegion) => 1.3,
        Some(LinkClass::InterRegion) => 2.2,
        Some(LinkClass::InterContinent) | None => 3.2,
    }
}

fn class_name(class: Option<LinkClass>) -> &'static str {
    match class {
        Some(LinkClass::IntraRegion) => "intra-region",
        Some(LinkClass::InterRegion) => "inter-region",
        Some(LinkClass::InterContinent) => "inter-continent",
        None => "no link",
    }
}

fn text(at: Pt, size: f64, anchor: Anchor, bold: bool, fill: &str, s: &str) -> Item {
    Item::Text {
        at,
        size,
        anchor,
        bold,
        fill: fill.to_owned(),
        text: s.to_owned(),
    }
}

fn header_text(region: &RegionBox, excluded: bool) -> String {
    if excluded {
        format!("{} · excluded", region.id)
    } else {
        region.id.to_string()
    }
}

/// Renders `trees` (one per scope) over the deployment's topology.
pub fn render(d: &Deployment, trees: &[Tree]) -> String {
    let t = &d.topology;
    let grid = Grid::new(t);
    let routed: Vec<(Vec<Routed<'_>>, Tracks)> =
        trees.iter().map(|tree| route::route(&grid, tree)).collect();
    let mut tracks = Tracks::new();
    for (_, used) in &routed {
        for (c, n) in used {
            let e = tracks.entry(*c).or_default();
            *e = (*e).max(*n);
        }
    }
    let policies: Vec<BTreeSet<&str>> = trees
        .iter()
        .map(|tree| {
            d.placement
                .policy(&tree.scope)
                .map(|p| p.regions.iter().map(|r| r.as_str()).collect())
                .unwrap_or_default()
        })
        .collect();
    let ever_excluded = |r: &RegionBox| policies.iter().any(|p| !p.contains(r.id.as_str()));
    let header = |r: &RegionBox| text_width(&header_text(r, ever_excluded(r)), FONT_REGION);
    let intra_w = t
        .regions
        .values()
        .map(|r| text_width(&ms(r.intra_rtt_ms), FONT_EDGE) + 6.0)
        .fold(0.0, f64::max);
    let geo = Geometry::new(&grid, &tracks, 0.0, &header, intra_w);

    let mut top_items = Vec::new();
    let title = format!(
        "topology {}: replication trees, one panel per placement scope",
        t.name
    );
    top_items.push(text(
        (MARGIN, 22.0),
        FONT_TITLE,
        Anchor::Start,
        true,
        INK,
        &title,
    ));
    let (legend_w, legend_bottom) = legend(&mut top_items, 34.0);
    let width = geo
        .width
        .max(legend_w + MARGIN)
        .max(text_width(&title, FONT_TITLE) + 2.0 * MARGIN)
        .ceil();

    let mut body = String::new();
    let mut y = legend_bottom + 10.0;
    for (i, tree) in trees.iter().enumerate() {
        let (colour, tint) = PALETTE[i % PALETTE.len()];
        let captions = caption(d, tree, &policies[i], width - 2.0 * MARGIN - 8.0);
        let caption_h = 10.0 + 17.0 * captions.len() as f64;
        let panel_h = caption_h + geo.height + 4.0;
        let mut head = vec![
            Item::Group(format!(r#"data-scope="{}""#, esc(tree.scope.as_str()))),
            Item::Rect {
                r: Rect::new(MARGIN / 2.0, 0.0, width - MARGIN, panel_h),
                rx: 8.0,
                fill: "#ffffff".into(),
                stroke: colour.into(),
                dashed: false,
                data: String::new(),
                title: None,
            },
        ];
        for (k, (line, bold)) in captions.iter().enumerate() {
            head.push(text(
                (MARGIN + 4.0, 18.0 + 17.0 * k as f64),
                FONT_CAPTION,
                Anchor::Start,
                *bold,
                if *bold { colour } else { MUTED },
                line,
            ));
        }
        scene::write(&mut body, &head, y);
        let content = panel(d, &grid, &geo, &routed[i].0, &policies[i], colour, tint);
        scene::write(&mut body, &content, y + caption_h);
        scene::write(&mut body, &[Item::End], 0.0);
        y += panel_h + PANEL_GAP;
    }
    let height = (y - PANEL_GAP + MARGIN).ceil();
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="{FONT}"><defs><pattern id="excluded" width="8" height="8" patternUnits="userSpaceOnUse"><rect width="8" height="8" fill="#f6f8fa"/><path d="M0,8 L8,0" stroke="#d0d7de" stroke-width="1.5"/></pattern></defs><rect width="100%" height="100%" fill="white"/>"##
    );
    scene::write(&mut out, &top_items, 0.0);
    out.push_str(&body);
    out.push_str("</svg>\n");
    out
}

/// The legend: roles, edge widths, what the tint and the hatching mean. Returns its
/// width and bottom.
fn legend(items: &mut Vec<Item>, top: f64) -> (f64, f64) {
    let mut right: f64 = 0.0;
    let row1 = top + 14.0;
    let mut x = MARGIN + 8.0;
    for role in [Role::Serving, Role::Batch, Role::Relay] {
        items.push(Item::Circle {
            c: (x, row1 - 4.0),
            r: 7.0,
            fill: role_fill(role).into(),
            stroke: INK.into(),
            data: String::new(),
            title: None,
        });
        let s = format!("{} replica", role_name(role));
        items.push(text(
            (x + 12.0, row1),
            FONT_LEGEND,
            Anchor::Start,
            false,
            INK,
            &s,
        ));
        x += 12.0 + text_width(&s, FONT_LEGEND) + 22.0;
    }
    for class in [
        LinkClass::IntraRegion,
        LinkClass::InterRegion,
        LinkClass::InterContinent,
    ] {
        items.push(Item::Polyline {
            points: vec![(x, row1 - 4.0), (x + 26.0, row1 - 4.0)],
            stroke: INK.into(),
            width: class_width(Some(class)),
            dashed: false,
            data: String::new(),
            title: None,
        });
        let s = format!("{} edge", class_name(Some(class)));
        items.push(text(
            (x + 32.0, row1),
            FONT_LEGEND,
            Anchor::Start,
            false,
            INK,
            &s,
        ));
        x += 32.0 + text_width(&s, FONT_LEGEND) + 22.0;
    }
    right = right.max(x);
    let row2 = row1 + 22.0;
    x = MARGIN + 2.0;
    let swatches: [(&str, &str, bool, &str); 3] = [
        (
            PALETTE[0].1,
            PALETTE[0].0,
            false,
            "region of the scope's policy: its rows are stored here",
        ),
        (
            "url(#excluded)",
            FAINT,
            true,
            "excluded: no row of the scope is stored or forwarded here",
        ),
        (
            "#ffffff",
            PALETTE[0].0,
            false,
            "72 ms: the edge's round trip",
        ),
    ];
    for (k, (fill, stroke, dashed, s)) in swatches.into_iter().enumerate() {
        if k == 2 {
            // A label as edges carry theirs: on the line.
            items.push(Item::Polyline {
                points: vec![(x, row2 - 4.0), (x + 26.0, row2 - 4.0)],
                stroke: stroke.into(),
                width: 2.2,
                dashed: false,
                data: String::new(),
                title: None,
            });
            x += 34.0;
            items.push(text(
                (x, row2),
                FONT_LEGEND,
                Anchor::Start,
                false,
                stroke,
                s,
            ));
            x += text_width(s, FONT_LEGEND) + 22.0;
            continue;
        }
        items.push(Item::Rect {
            r: Rect::new(x, row2 - 12.0, 26.0, 14.0),
            rx: 3.0,
            fill: fill.into(),
            stroke: stroke.into(),
            dashed,
            data: String::new(),
            title: None,
        });
        items.push(text(
            (x + 32.0, row2),
            FONT_LEGEND,
            Anchor::Start,
            false,
            INK,
            s,
        ));
        x += 32.0 + text_width(s, FONT_LEGEND) + 22.0;
    }
    right = right.max(x);
    (right, row2 + 8.0)
}

/// The caption's lines (bold or not), wrapped to `width`: which regions the scope's
/// rows may be in, and its tree.
fn caption(
    d: &Deployment,
    tree: &Tree,
    policy: &BTreeSet<&str>,
    width: f64,
) -> Vec<(String, bool)> {
    let all = d.topology.regions.len();
    let first = if policy.len() == all {
        format!("scope {}: every region ({all})", tree.scope)
    } else {
        let list: Vec<&str> = policy.iter().copied().collect();
        format!(
            "scope {}: {} of {all} regions: {}",
            tree.scope,
            policy.len(),
            list.join(", ")
        )
    };
    let second = format!(
        "tree: {} edges, {} of round trips in all, over {} replicas; rows stored only in the tinted regions",
        tree.edges.len(),
        ms((tree.total_latency_ms() * 10.0).round() / 10.0),
        tree.replicas.len()
    );
    let mut lines = Vec::new();
    for (s, bold) in [(first, true), (second, false)] {
        let size = FONT_CAPTION;
        let mut line = String::new();
        for word in s.split_inclusive(' ') {
            if !line.is_empty() && text_width(&(line.clone() + word), size) > width {
                lines.push((line.trim_end().to_owned(), bold));
                line = String::from("    ");
            }
            line.push_str(word);
        }
        lines.push((line.trim_end().to_owned(), bold));
    }
    lines
}

/// One scope's panel below its caption, in panel coordinates.
fn panel(
    d: &Deployment,
    grid: &Grid,
    geo: &Geometry,
    routes: &[Routed<'_>],
    policy: &BTreeSet<&str>,
    colour: &str,
    tint: &str,
) -> Vec<Item> {
    let t = &d.topology;
    let mut items = Vec::new();
    // Static labels and discs: what edge labels must keep clear of.
    let mut labels: Vec<Rect> = Vec::new();
    let mut discs: Vec<Pt> = Vec::new();

    for (c, name) in grid.continents.iter().enumerate() {
        let x = geo.col_x[c];
        items.push(Item::Rect {
            r: Rect {
                x0: x - 6.0,
                y0: geo.band_top,
                x1: x + geo.col_w[c] + 6.0,
                y1: geo.height - 2.0,
            },
            rx: 6.0,
            fill: "#f6f8fa".into(),
            stroke: "#d0d7de".into(),
            dashed: false,
            data: String::new(),
            title: None,
        });
        let at = (x, geo.continent_y);
        labels.push(text_box(name, at.0, at.1, FONT_CONTINENT, Anchor::Start));
        items.push(text(at, FONT_CONTINENT, Anchor::Start, true, INK, name));
    }
    for (i, region) in grid.regions.iter().enumerate() {
        let inside = policy.contains(region.id.as_str());
        let b = geo.boxes[i];
        items.push(Item::Rect {
            r: b,
            rx: 5.0,
            fill: if inside { tint } else { "url(#excluded)" }.into(),
            stroke: if inside { colour } else { FAINT }.into(),
            dashed: !inside,
            data: format!(
                r#" data-region="{}" data-in-policy="{inside}""#,
                esc(region.id.as_str())
            ),
            title: Some(if inside {
                format!("{}: in the scope's policy", region.id)
            } else {
                format!("{}: excluded from the scope's policy", region.id)
            }),
        });
        let s = header_text(region, !inside);
        let at = (geo.header_x(i), geo.header_y(i));
        labels.push(text_box(&s, at.0, at.1, FONT_REGION, Anchor::Start));
        items.push(text(
            at,
            FONT_REGION,
            Anchor::Start,
            true,
            if inside { INK } else { FAINT },
            &s,
        ));
    }

    let lines = route::polylines(grid, geo, routes);
    for (r, points) in routes.iter().zip(&lines) {
        let e = r.edge;
        let class = t.link_class(&e.a, &e.b);
        items.push(Item::Polyline {
            points: points.clone(),
            stroke: colour.into(),
            width: class_width(class),
            dashed: false,
            data: format!(
                r#" data-edge="{} {}" data-latency-ms="{}""#,
                esc(e.a.as_str()),
                esc(e.b.as_str()),
                e.latency_ms
            ),
            title: Some(format!(
                "{} — {}: {} round trip, {}",
                e.a,
                e.b,
                ms(e.latency_ms),
                class_name(class)
            )),
        });
    }

    let mut replica_labels = Vec::new();
    for (id, slot) in &grid.slots {
        let replica = &t.replicas[id];
        let inside = policy.contains(replica.region.as_str());
        let c = geo.disc(*slot);
        discs.push(c);
        items.push(Item::Circle {
            c,
            r: R,
            fill: if inside {
                role_fill(replica.role)
            } else {
                EXCLUDED_DISC
            }
            .into(),
            stroke: if inside { INK } else { FAINT }.into(),
            data: format!(
                r#" data-replica="{}" data-region="{}""#,
                esc(id.as_str()),
                esc(replica.region.as_str())
            ),
            title: Some(format!(
                "{id}: {} replica in {} ({})",
                role_name(replica.role),
                replica.region,
                replica.continent
            )),
        });
        let at = (c.0, geo.label_y(*slot));
        labels.push(text_box(
            id.as_str(),
            at.0,
            at.1,
            FONT_REPLICA,
            Anchor::Middle,
        ));
        replica_labels.push(text(
            at,
            FONT_REPLICA,
            Anchor::Middle,
            false,
            if inside { INK } else { FAINT },
            id.as_str(),
        ));
    }
    items.extend(replica_labels);

    // Latency labels, the shortest edges first (they have the fewest places).
    let mut order: Vec<usize> = (0..routes.len()).collect();
    order.sort_by(|&x, &y| {
        length(&lines[x])
            .total_cmp(&length(&lines[y]))
            .then(x.cmp(&y))
    });
    let mut placed: Vec<(usize, Pt)> = Vec::new();
    for i in order {
        let s = ms(routes[i].edge.latency_ms);
        let at = place_label(&s, &lines, i, &discs, &labels);
        labels.push(label_rect(&s, at));
        placed.push((i, at));
    }
    placed.sort_by_key(|(i, _)| *i);
    for (i, at) in placed {
        let s = ms(routes[i].edge.latency_ms);
        items.push(Item::Rect {
            r: label_rect(&s, at),
            rx: 2.0,
            fill: "#ffffff".into(),
            stroke: "none".into(),
            dashed: false,
            data: String::new(),
            title: None,
        });
        items.push(text(
            (at.0, baseline_centred(at.1, FONT_EDGE)),
            FONT_EDGE,
            Anchor::Middle,
            true,
            colour,
            &s,
        ));
    }
    items
}

/// The white box behind a latency label centred on `at`.
fn label_rect(s: &str, at: Pt) -> Rect {
    let w = text_width(s, FONT_EDGE) + 3.0;
    let h = (geom::ASCENT_EM + geom::DESCENT_EM) * FONT_EDGE + 2.0;
    Rect::new(at.0 - w / 2.0, at.1 - h / 2.0, w, h)
}

/// Where on edge `i` its label goes: the point nearest its middle where the label
/// covers no disc and no other label; preferably on a horizontal run (where a label
/// reads as the line's) and over no other edge.
fn place_label(s: &str, lines: &[Vec<Pt>], i: usize, discs: &[Pt], labels: &[Rect]) -> Pt {
    let path = &lines[i];
    let len = length(path);
    let mid = len / 2.0;
    let step = 2.0;
    let fits = |at: Pt, strict: bool| {
        let r = label_rect(s, at);
        if discs.iter().any(|c| r.hits_disc(*c, R + 2.0)) {
            return false;
        }
        if labels.iter().any(|l| l.inflate(LABEL_GAP).overlaps(&r)) {
            return false;
        }
        !strict
            || lines
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .all(|(_, other)| other.windows(2).all(|w| !r.crossed_by(w[0], w[1])))
    };
    // Whether the label centred `at_s` along the path lies along one horizontal
    // run, clear of its corners.
    let half = label_rect(s, (0.0, 0.0)).w() / 2.0 + 3.0;
    let horizontal = |at_s: f64| {
        let (a, b) = (point_at(path, at_s - half), point_at(path, at_s + half));
        (a.1 - b.1).abs() < 1e-6 && (a.0 - b.0).abs() > 2.0 * half - 1e-6
    };
    for (strict, flat) in [(true, true), (true, false), (false, true), (false, false)] {
        let mut k = 0.0;
        while k <= mid {
            for at_s in [mid - k, mid + k] {
                if flat && !horizontal(at_s) {
                    continue;
                }
                let at = point_at(path, at_s);
                if fits(at, strict) {
                    return at;
                }
            }
            k += step;
        }
    }
    point_at(path, mid)
}
