//! What is drawn, as a list of shapes, written out as SVG text with plain absolute
//! coordinates (no transforms: what a reader of the file, or a test, sees is where
//! things are).

use super::geom::{Anchor, Pt, Rect};
use std::fmt::Write;

pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One shape. `data` is extra attributes, written as given (escaped by the caller).
#[derive(Debug, Clone)]
pub(super) enum Item {
    /// A group with attributes (a panel), up to the matching `End`.
    Group(String),
    End,
    Rect {
        r: Rect,
        rx: f64,
        fill: String,
        stroke: String,
        dashed: bool,
        data: String,
        title: Option<String>,
    },
    Circle {
        c: Pt,
        r: f64,
        fill: String,
        stroke: String,
        data: String,
        title: Option<String>,
    },
    Text {
        at: Pt,
        size: f64,
        anchor: Anchor,
        bold: bool,
        fill: String,
        text: String,
    },
    Polyline {
        points: Vec<Pt>,
        stroke: String,
        width: f64,
        dashed: bool,
        data: String,
        title: Option<String>,
    },
}

fn title(t: &Option<String>) -> String {
    t.as_ref()
        .map(|t| format!("<title>{}</title>", esc(t)))
        .unwrap_or_default()
}

/// Shapes moved down by `dy`, written out.
pub(super) fn write(out: &mut String, items: &[Item], dy: f64) {
    for item in items {
        let _ = match item {
            Item::Group(attrs) => write!(out, "<g {attrs}>"),
            Item::End => write!(out, "</g>"),
            Item::Rect {
                r,
                rx,
                fill,
                stroke,
                dashed,
                data,
                title: t,
            } => {
                let dash = if *dashed {
                    r#" stroke-dasharray="4 3""#
                } else {
                    ""
                };
                let (open, close) = match t {
                    Some(_) => (">", format!("{}</rect>", title(t))),
                    None => ("/>", String::new()),
                };
                write!(
                    out,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="{rx}" fill="{fill}" stroke="{stroke}"{dash}{data}{open}{close}"#,
                    r.x0,
                    r.y0 + dy,
                    r.w(),
                    r.h(),
                )
            }
            Item::Circle {
                c,
                r,
                fill,
                stroke,
                data,
                title: t,
            } => write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="{r}" fill="{fill}" stroke="{stroke}"{data}>{}</circle>"#,
                c.0,
                c.1 + dy,
                title(t)
            ),
            Item::Text {
                at,
                size,
                anchor,
                bold,
                fill,
                text,
            } => {
                let anchor = match anchor {
                    Anchor::Start => "",
                    Anchor::Middle => r#" text-anchor="middle""#,
                };
                let weight = if *bold { r#" font-weight="bold""# } else { "" };
                write!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}" font-size="{size}"{anchor}{weight} fill="{fill}">{}</text>"#,
                    at.0,
                    at.1 + dy,
                    esc(text)
                )
            }
            Item::Polyline {
                points,
                stroke,
                width,
                dashed,
                data,
                title: t,
            } => {
                let pts: Vec<String> = points
                    .iter()
                    .map(|p| format!("{:.1},{:.1}", p.0, p.1 + dy))
                    .collect();
                let dash = if *dashed {
                    r#" stroke-dasharray="6 3""#
                } else {
                    ""
                };
                write!(
                    out,
                    r#"<polyline points="{}" fill="none" stroke="{stroke}" stroke-width="{width}" stroke-linejoin="round"{dash}{data}>{}</polyline>"#,
                    pts.join(" "),
                    title(t)
                )
            }
        };
    }
}
