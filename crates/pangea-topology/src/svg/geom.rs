//! Points, rectangles, text boxes and polylines: what the layout checks collisions
//! with.

pub(super) type Pt = (f64, f64);

/// A character's advance, in em, in the monospace font the drawing asks for
/// (DejaVu Sans Mono and Menlo 0.602, Consolas 0.55), with a little to spare: text
/// boxes are known without measuring, so labels can be kept apart.
pub(super) const CHAR_EM: f64 = 0.62;
/// Above the baseline.
pub(super) const ASCENT_EM: f64 = 0.8;
/// Below the baseline.
pub(super) const DESCENT_EM: f64 = 0.25;

/// An axis-aligned rectangle, `x0 <= x1`, `y0 <= y1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rect {
    pub(super) x0: f64,
    pub(super) y0: f64,
    pub(super) x1: f64,
    pub(super) y1: f64,
}

impl Rect {
    pub(super) fn new(x: f64, y: f64, w: f64, h: f64) -> Rect {
        Rect {
            x0: x,
            y0: y,
            x1: x + w,
            y1: y + h,
        }
    }

    pub(super) fn w(&self) -> f64 {
        self.x1 - self.x0
    }

    pub(super) fn h(&self) -> f64 {
        self.y1 - self.y0
    }

    pub(super) fn inflate(&self, d: f64) -> Rect {
        Rect {
            x0: self.x0 - d,
            y0: self.y0 - d,
            x1: self.x1 + d,
            y1: self.y1 + d,
        }
    }

    pub(super) fn overlaps(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }

    pub(super) fn hits_disc(&self, c: Pt, r: f64) -> bool {
        let dx = c.0 - c.0.clamp(self.x0, self.x1);
        let dy = c.1 - c.1.clamp(self.y0, self.y1);
        dx * dx + dy * dy < r * r
    }

    /// Whether the segment a–b runs through the rectangle (Liang–Barsky clipping).
    pub(super) fn crossed_by(&self, a: Pt, b: Pt) -> bool {
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let (mut t0, mut t1) = (0.0f64, 1.0f64);
        for (p, q) in [
            (-dx, a.0 - self.x0),
            (dx, self.x1 - a.0),
            (-dy, a.1 - self.y0),
            (dy, self.y1 - a.1),
        ] {
            if p == 0.0 {
                if q < 0.0 {
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
        t0 <= t1
    }
}

/// How a text sits on its x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Anchor {
    Start,
    Middle,
}

pub(super) fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * CHAR_EM * size
}

/// The box of `s` drawn at font `size` with its baseline at `y`.
pub(super) fn text_box(s: &str, x: f64, y: f64, size: f64, anchor: Anchor) -> Rect {
    let w = text_width(s, size);
    let x0 = match anchor {
        Anchor::Start => x,
        Anchor::Middle => x - w / 2.0,
    };
    Rect {
        x0,
        y0: y - ASCENT_EM * size,
        x1: x0 + w,
        y1: y + DESCENT_EM * size,
    }
}

/// The baseline that centres a text of font `size` vertically on `y`.
pub(super) fn baseline_centred(y: f64, size: f64) -> f64 {
    y + (ASCENT_EM - DESCENT_EM) / 2.0 * size
}

pub(super) fn length(points: &[Pt]) -> f64 {
    points
        .windows(2)
        .map(|w| (w[1].0 - w[0].0).hypot(w[1].1 - w[0].1))
        .sum()
}

/// The point `s` along the polyline from its start (clamped to its ends).
pub(super) fn point_at(points: &[Pt], mut s: f64) -> Pt {
    for w in points.windows(2) {
        let l = (w[1].0 - w[0].0).hypot(w[1].1 - w[0].1);
        if s <= l && l > 0.0 {
            let f = s / l;
            return (
                w[0].0 + f * (w[1].0 - w[0].0),
                w[0].1 + f * (w[1].1 - w[0].1),
            );
        }
        s -= l;
    }
    *points.last().expect("a polyline has points")
}

/// The polyline without repeated points or points in the middle of a straight run.
pub(super) fn simplify(points: Vec<Pt>) -> Vec<Pt> {
    let mut out: Vec<Pt> = Vec::with_capacity(points.len());
    for p in points {
        if out.last() == Some(&p) {
            continue;
        }
        if out.len() >= 2 {
            let (a, b) = (out[out.len() - 2], out[out.len() - 1]);
            let cross = (b.0 - a.0) * (p.1 - b.1) - (b.1 - a.1) * (p.0 - b.0);
            let forward = (b.0 - a.0) * (p.0 - b.0) + (b.1 - a.1) * (p.1 - b.1);
            if cross.abs() < 1e-9 && forward > 0.0 {
                out.pop();
            }
        }
        out.push(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rectangles_discs_and_segments() {
        let r = Rect::new(0.0, 0.0, 10.0, 10.0);
        assert!(r.overlaps(&Rect::new(9.0, 9.0, 5.0, 5.0)));
        assert!(!r.overlaps(&Rect::new(10.0, 0.0, 5.0, 5.0)));
        assert!(r.hits_disc((12.0, 5.0), 3.0));
        assert!(!r.hits_disc((14.0, 14.0), 5.0));
        assert!(r.crossed_by((-5.0, 5.0), (15.0, 5.0)));
        assert!(r.crossed_by((5.0, 5.0), (5.0, 6.0)));
        assert!(!r.crossed_by((-5.0, 11.0), (15.0, 11.0)));
        assert!(!r.crossed_by((-5.0, -5.0), (-1.0, 20.0)));
    }

    #[test]
    fn polylines() {
        let p = simplify(vec![
            (0.0, 0.0),
            (0.0, 0.0),
            (0.0, 5.0),
            (0.0, 10.0),
            (10.0, 10.0),
        ]);
        assert_eq!(p, vec![(0.0, 0.0), (0.0, 10.0), (10.0, 10.0)]);
        assert_eq!(length(&p), 20.0);
        assert_eq!(point_at(&p, 15.0), (5.0, 10.0));
        assert_eq!(point_at(&p, 99.0), (10.0, 10.0));
    }
}
