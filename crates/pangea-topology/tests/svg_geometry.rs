//! The plan drawing's geometry, checked on the SVG text itself (what an operator's
//! browser draws), on the reference topologies and on generated ones:
//!
//! - no edge passes through a replica's disc other than its two endpoints'
//!   (segment–circle distance against every other disc), nor through a region box
//!   other than its endpoints' regions;
//! - text boxes (0.6 em a character, the advance of a monospace font; ascent 0.8
//!   em, descent 0.25 em) are pairwise disjoint and clear of every disc;
//! - one panel per scope, its policy's regions (and only those) highlighted, each
//!   tree edge drawn once in its scope's panel between replicas of those regions,
//!   with its round trip written on it;
//! - the same input gives the same bytes.
//!
//! `PANGEA_SVG=FILE cargo test -p pangea-topology --test svg_geometry -- --ignored`
//! runs the geometric checks on any drawing (this is how the renderer before issue 34
//! was shown to fail them).

use pangea_topology::generate::{Shape, random_deployment};
use pangea_topology::{Deployment, Tree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// An element of the drawing, with the `data-scope` of the panel it is in.
#[derive(Debug, Default, Clone)]
struct Element {
    tag: String,
    attrs: BTreeMap<String, String>,
    /// Text content (`<text>` only), entities decoded.
    text: String,
    scope: Option<String>,
}

impl Element {
    fn num(&self, name: &str) -> f64 {
        self.attrs
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("<{}> without numeric {name}: {:?}", self.tag, self.attrs))
    }
    fn get(&self, name: &str) -> Option<&str> {
        self.attrs.get(name).map(String::as_str)
    }
}

fn decode(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// A small SVG reader: start tags with their attributes, the text of `<text>`,
/// `<title>` skipped, the panel (`<g data-scope=…>`) each element sits in.
fn parse(svg: &str) -> Vec<Element> {
    let mut out = Vec::new();
    let mut groups: Vec<Option<String>> = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find('<') {
        rest = &rest[start + 1..];
        let end = rest.find('>').expect("unclosed tag");
        let tag_text = &rest[..end];
        rest = &rest[end + 1..];
        if let Some(closing) = tag_text.strip_prefix('/') {
            if closing.trim() == "g" {
                groups.pop();
            }
            continue;
        }
        let self_closing = tag_text.ends_with('/');
        let tag_text = tag_text.trim_end_matches('/');
        let (tag, mut attr_text) = tag_text
            .split_once(char::is_whitespace)
            .unwrap_or((tag_text, ""));
        let mut attrs = BTreeMap::new();
        loop {
            attr_text = attr_text.trim_start();
            let Some(eq) = attr_text.find('=') else { break };
            let name = attr_text[..eq].trim().to_owned();
            let after = &attr_text[eq + 1..];
            let quote = after.chars().next().expect("attribute value");
            let close = after[1..].find(quote).expect("closing quote") + 1;
            attrs.insert(name, decode(&after[1..close]));
            attr_text = &after[close + 1..];
        }
        let scope = groups.iter().rev().flatten().next().cloned();
        let mut e = Element {
            tag: tag.to_owned(),
            attrs,
            text: String::new(),
            scope,
        };
        match tag {
            "g" if !self_closing => {
                groups.push(e.attrs.get("data-scope").cloned());
                out.push(e);
            }
            "title" => {
                let close = rest.find("</title>").expect("closed title");
                rest = &rest[close + "</title>".len()..];
            }
            "text" => {
                let close = rest.find("</text>").expect("closed text");
                let inner = &rest[..close];
                assert!(!inner.contains('<'), "markup inside <text>: {inner}");
                e.text = decode(inner);
                rest = &rest[close + "</text>".len()..];
                out.push(e);
            }
            _ => out.push(e),
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Rect {
    x0: f64,
    y0: f64,
    x1: f64,
    y1: f64,
}

impl Rect {
    fn overlaps(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }
    fn hits_disc(&self, d: &Disc) -> bool {
        let dx = d.cx - d.cx.clamp(self.x0, self.x1);
        let dy = d.cy - d.cy.clamp(self.y0, self.y1);
        dx * dx + dy * dy < d.r * d.r
    }
    /// Whether segment a–b runs through the rectangle's inside (touching its
    /// outline does not count): Liang–Barsky clipping.
    fn crossed_by(&self, a: (f64, f64), b: (f64, f64)) -> bool {
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let (mut t0, mut t1) = (0.0f64, 1.0f64);
        for (p, q) in [
            (-dx, a.0 - self.x0),
            (dx, self.x1 - a.0),
            (-dy, a.1 - self.y0),
            (dy, self.y1 - a.1),
        ] {
            if p == 0.0 {
                if q <= 0.0 {
                    return false;
                }
            } else {
                let t = q / p;
                if p < 0.0 {
                    t0 = t0.max(t);
                } else {
                    t1 = t1.min(t);
                }
            }
        }
        t1 - t0 > 1e-9
    }
}

#[derive(Debug, Clone)]
struct Disc {
    cx: f64,
    cy: f64,
    r: f64,
    replica: Option<String>,
    region: Option<String>,
}

impl Disc {
    fn contains(&self, p: (f64, f64)) -> bool {
        (p.0 - self.cx).powi(2) + (p.1 - self.cy).powi(2) <= self.r * self.r
    }
    /// Whether segment a–b comes closer to the centre than the radius.
    fn crossed_by(&self, a: (f64, f64), b: (f64, f64)) -> bool {
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let len2 = dx * dx + dy * dy;
        let t = if len2 == 0.0 {
            0.0
        } else {
            (((self.cx - a.0) * dx + (self.cy - a.1) * dy) / len2).clamp(0.0, 1.0)
        };
        let (px, py) = (a.0 + t * dx, a.1 + t * dy);
        (px - self.cx).powi(2) + (py - self.cy).powi(2) < self.r * self.r
    }
}

/// The box a `<text>` covers: 0.6 em a character, ascent 0.8 em, descent 0.25 em.
fn text_box(e: &Element) -> Rect {
    let size = e
        .get("font-size")
        .and_then(|s| s.parse().ok())
        .unwrap_or(16.0);
    let w = e.text.chars().count() as f64 * 0.6 * size;
    let (x, y) = (e.num("x"), e.num("y"));
    let x0 = match e.get("text-anchor") {
        Some("middle") => x - w / 2.0,
        Some("end") => x - w,
        _ => x,
    };
    Rect {
        x0,
        y0: y - 0.8 * size,
        x1: x0 + w,
        y1: y + 0.25 * size,
    }
}

/// An edge as drawn: its points, and (when the drawing says) its endpoints.
#[derive(Debug, Clone)]
struct Drawn {
    points: Vec<(f64, f64)>,
    ends: Option<(String, String)>,
    scope: Option<String>,
}

fn edges(elements: &[Element]) -> Vec<Drawn> {
    let mut out = Vec::new();
    for e in elements {
        let points = match e.tag.as_str() {
            "line" => vec![(e.num("x1"), e.num("y1")), (e.num("x2"), e.num("y2"))],
            "polyline" => e.attrs["points"]
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').expect("x,y");
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect(),
            _ => continue,
        };
        let ends = e
            .get("data-edge")
            .map(|s| s.split_once(' ').expect("data-edge=\"a b\""))
            .map(|(a, b)| (a.to_owned(), b.to_owned()));
        out.push(Drawn {
            points,
            ends,
            scope: e.scope.clone(),
        });
    }
    out
}

fn discs(elements: &[Element]) -> Vec<Disc> {
    elements
        .iter()
        .filter(|e| e.tag == "circle")
        .map(|e| Disc {
            cx: e.num("cx"),
            cy: e.num("cy"),
            r: e.num("r"),
            replica: e.get("data-replica").map(str::to_owned),
            region: e.get("data-region").map(str::to_owned),
        })
        .collect()
}

/// Every geometric problem of a drawing: edges through discs or foreign region boxes,
/// overlapping labels, labels over discs.
fn geometry_problems(svg: &str) -> Vec<String> {
    let elements = parse(svg);
    let discs = discs(&elements);
    let mut problems = Vec::new();
    // Edges legend swatches are not edges: only lines near a disc at both ends.
    for edge in edges(&elements) {
        let (first, last) = (edge.points[0], *edge.points.last().unwrap());
        let at_first: Vec<usize> = (0..discs.len())
            .filter(|&i| discs[i].contains(first))
            .collect();
        let at_last: Vec<usize> = (0..discs.len())
            .filter(|&i| discs[i].contains(last))
            .collect();
        if at_first.is_empty() || at_last.is_empty() {
            if edge.ends.is_some() {
                problems.push(format!("edge {:?} does not end on discs", edge.ends));
            }
            continue; // a legend swatch
        }
        if let Some((a, b)) = &edge.ends {
            let named = |set: &[usize], id: &str| {
                set.iter().any(|&i| discs[i].replica.as_deref() == Some(id))
            };
            if !(named(&at_first, a) && named(&at_last, b)
                || named(&at_first, b) && named(&at_last, a))
            {
                problems.push(format!("edge {a}–{b} is not drawn between its replicas"));
            }
        }
        let ends: BTreeSet<usize> = at_first.iter().chain(&at_last).copied().collect();
        let end_regions: BTreeSet<&str> = ends
            .iter()
            .filter_map(|&i| discs[i].region.as_deref())
            .collect();
        let name = match &edge.ends {
            Some((a, b)) => format!("{a}–{b}"),
            None => format!("{first:?}–{last:?}"),
        };
        for w in edge.points.windows(2) {
            for (i, d) in discs.iter().enumerate() {
                if !ends.contains(&i) && d.crossed_by(w[0], w[1]) {
                    problems.push(format!(
                        "edge {name} passes through the disc of {} at ({:.0}, {:.0})",
                        d.replica.as_deref().unwrap_or("?"),
                        d.cx,
                        d.cy
                    ));
                }
            }
            for r in elements.iter().filter(|e| e.tag == "rect") {
                let Some(region) = r.get("data-region") else {
                    continue;
                };
                if end_regions.contains(region) || r.scope != edge.scope {
                    continue;
                }
                let rect = Rect {
                    x0: r.num("x"),
                    y0: r.num("y"),
                    x1: r.num("x") + r.num("width"),
                    y1: r.num("y") + r.num("height"),
                };
                if rect.crossed_by(w[0], w[1]) {
                    problems.push(format!("edge {name} passes through region {region}"));
                }
            }
        }
    }
    let texts: Vec<(&Element, Rect)> = elements
        .iter()
        .filter(|e| e.tag == "text")
        .map(|e| (e, text_box(e)))
        .collect();
    for (i, (a, ra)) in texts.iter().enumerate() {
        for (b, rb) in &texts[i + 1..] {
            if ra.overlaps(rb) {
                problems.push(format!("label {:?} overlaps label {:?}", a.text, b.text));
            }
        }
        for d in &discs {
            if ra.hits_disc(d) {
                problems.push(format!(
                    "label {:?} lies over the disc of {} at ({:.0}, {:.0})",
                    a.text,
                    d.replica.as_deref().unwrap_or("?"),
                    d.cx,
                    d.cy
                ));
            }
        }
    }
    problems
}

/// `12 ms`, `4.5 ms`: how a round trip is written on an edge.
fn ms(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

/// What the drawing must say about the deployment: a panel per scope highlighting
/// exactly its policy's regions, each tree edge drawn once there, between replicas
/// the policy allows, with its round trip written on it (the label's box centred on
/// the edge's path).
fn content_problems(d: &Deployment, trees: &[Tree], svg: &str) -> Vec<String> {
    let elements = parse(svg);
    let mut problems = Vec::new();
    let drawn = edges(&elements);
    let panels: Vec<&str> = elements
        .iter()
        .filter(|e| e.tag == "g")
        .filter_map(|e| e.get("data-scope"))
        .collect();
    let scopes: Vec<&str> = trees.iter().map(|t| t.scope.as_str()).collect();
    if panels != scopes {
        problems.push(format!("panels {panels:?}, scopes {scopes:?}"));
    }
    for tree in trees {
        let scope = tree.scope.as_str();
        let policy = &d.placement.policy(&tree.scope).expect("policy").regions;
        let highlighted: BTreeSet<&str> = elements
            .iter()
            .filter(|e| e.tag == "rect" && e.scope.as_deref() == Some(scope))
            .filter(|e| e.get("data-in-policy") == Some("true"))
            .filter_map(|e| e.get("data-region"))
            .collect();
        let expected: BTreeSet<&str> = policy.iter().map(|r| r.as_str()).collect();
        if highlighted != expected {
            problems.push(format!(
                "panel {scope} highlights {highlighted:?}, policy {expected:?}"
            ));
        }
        let in_panel: Vec<&Drawn> = drawn
            .iter()
            .filter(|e| e.scope.as_deref() == Some(scope) && e.ends.is_some())
            .collect();
        if in_panel.len() != tree.edges.len() {
            problems.push(format!(
                "panel {scope}: {} edges drawn, tree has {}",
                in_panel.len(),
                tree.edges.len()
            ));
        }
        for e in &tree.edges {
            for r in [&e.a, &e.b] {
                let region = d.topology.region_of(r.as_str()).unwrap();
                if !policy.contains(region) {
                    problems.push(format!("panel {scope}: {r} outside the policy"));
                }
            }
            let ends = Some((e.a.to_string(), e.b.to_string()));
            let Some(path) = in_panel.iter().find(|p| p.ends == ends) else {
                problems.push(format!("panel {scope}: edge {}–{} not drawn", e.a, e.b));
                continue;
            };
            let label = ms(e.latency_ms);
            let on_path = elements.iter().any(|t| {
                if t.tag != "text" || t.text != label || t.scope.as_deref() != Some(scope) {
                    return false;
                }
                let b = text_box(t);
                let c = ((b.x0 + b.x1) / 2.0, (b.y0 + b.y1) / 2.0);
                path.points.windows(2).any(|w| {
                    Disc {
                        cx: c.0,
                        cy: c.1,
                        r: 1.5,
                        replica: None,
                        region: None,
                    }
                    .crossed_by(w[0], w[1])
                })
            });
            if !on_path {
                problems.push(format!(
                    "panel {scope}: edge {}–{} has no {label:?} label on it",
                    e.a, e.b
                ));
            }
        }
    }
    problems
}

fn trees(d: &Deployment) -> Vec<Tree> {
    d.scopes().map(|s| d.tree(s, None)).collect()
}

fn check(d: &Deployment, what: &str) -> String {
    let trees = trees(d);
    let svg = pangea_topology::svg::render(d, &trees);
    assert_eq!(
        svg,
        pangea_topology::svg::render(d, &trees),
        "{what}: not deterministic"
    );
    let mut problems = geometry_problems(&svg);
    problems.extend(content_problems(d, &trees, &svg));
    assert!(
        problems.is_empty(),
        "{what}: {} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
    svg
}

fn reference(topology: &str) -> Deployment {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    Deployment::load(&root.join(topology), Some(&root.join("placement.toml"))).expect("loads")
}

#[test]
fn the_reference_topologies_draw_cleanly() {
    for topology in ["four-continents.toml", "five-continents.toml"] {
        let svg = check(&reference(topology), topology);
        // Worth a look: the drawing is left where the tests' target directory is.
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(topology.replace(".toml", ".svg"));
        std::fs::write(out, svg).unwrap();
    }
}

/// The seeded generator of the harnesses: a linear congruential stream.
fn stream(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut i = seed;
    move |n: u64| {
        i = i
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (i >> 33) % n
    }
}

fn generated(seed: u64, shape: &Shape<'_>) -> Deployment {
    random_deployment(shape, &mut stream(seed), None)
}

#[test]
fn a_generated_40_replica_topology_draws_cleanly() {
    let shape = Shape {
        name: "gen40",
        regions: 10,
        replicas_per_region_max: 7,
        relays: true,
        restricted: true,
        shard_groups: 1,
        processes_max: 1,
    };
    let d = (0..)
        .map(|seed| generated(seed, &shape))
        .find(|d| d.topology.replicas.len() == 40)
        .expect("some seed gives 40 replicas");
    let svg = check(&d, "generated, 40 replicas");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gen40.svg");
    std::fs::write(out, svg).unwrap();
}

/// Many shapes, from 3 replicas to regions of a dozen that wrap onto several rows.
#[test]
fn generated_topologies_of_every_shape_draw_cleanly() {
    for seed in 0..24 {
        let shape = Shape {
            name: "gen",
            regions: 2 + (seed as usize % 9),
            replicas_per_region_max: 1 + (seed as usize * 5 % 13),
            relays: seed % 2 == 0,
            restricted: seed % 3 != 0,
            shard_groups: 1,
            processes_max: 1,
        };
        check(&generated(seed, &shape), &format!("seed {seed}, {shape:?}"));
    }
}

/// Geometric checks on any drawing: `PANGEA_SVG=FILE`.
#[test]
#[ignore]
fn check_a_drawing_file() {
    let Ok(file) = std::env::var("PANGEA_SVG") else {
        return;
    };
    let svg = std::fs::read_to_string(&file).unwrap();
    let problems = geometry_problems(&svg);
    assert!(
        problems.is_empty(),
        "{file}: {} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
