//! Where everything goes: continents as columns in file order, each continent's
//! regions stacked down its column (by name), replicas as discs in a grid of at most
//! [`PER_ROW`] a row inside their region's box, with their ids under them.
//!
//! Between the boxes run the corridors edges are routed along: a vertical one
//! left of each column and right of the last, a horizontal one above each row of
//! boxes and below the last (the i-th region of every continent makes a row), and
//! inside each box a lane above each row of discs. Every corridor and lane is as
//! wide as the most parallel lines any panel routes through it ([`Tracks`]), so the
//! panels share one layout: a replica is at the same place in every panel.

use super::geom::{ASCENT_EM, DESCENT_EM, Pt, Rect, text_width};
use super::route::{Channel, Tracks};
use crate::ids::{RegionId, ReplicaId};
use crate::topology::Topology;
use std::collections::BTreeMap;

/// Disc radius.
pub(super) const R: f64 = 12.0;
/// Between two parallel lines in a lane (inside a box) and in a corridor.
pub(super) const LANE_TRACK: f64 = 7.0;
pub(super) const TRACK: f64 = 8.0;
/// Replicas a row inside a region box.
pub(super) const PER_ROW: usize = 6;
pub(super) const FONT_REPLICA: f64 = 9.0;
pub(super) const FONT_REGION: f64 = 11.0;
pub(super) const FONT_CONTINENT: f64 = 13.0;
pub(super) const FONT_EDGE: f64 = 9.0;
/// Inside a region box, left and right of its cells.
const PAD_IN: f64 = 10.0;
/// The region's name, above its first lane.
const HEADER: f64 = 22.0;
/// From a disc's top to the lowest track of the lane above it.
const LANE_GAP: f64 = 10.0;
/// From the highest track of a lane to the row above.
const LANE_TOP: f64 = 8.0;
/// A lane no edge uses.
const LANE_EMPTY: f64 = 6.0;
const LABEL_GAP: f64 = 3.0;
const ROW_GAP: f64 = 4.0;
const V_MIN: f64 = 30.0;
const V_PAD: f64 = 12.0;
const H_MIN: f64 = 22.0;
const H_PAD: f64 = 9.0;
const MARGIN: f64 = 10.0;
/// The continent names' band, above the first corridor.
const CONTINENT_BAND: f64 = 26.0;

/// A region's box: which column (continent) and row of boxes, its replicas.
#[derive(Debug, Clone)]
pub(super) struct RegionBox {
    pub(super) id: RegionId,
    pub(super) col: usize,
    pub(super) grid_row: usize,
    pub(super) per_row: usize,
    pub(super) rows: usize,
}

/// Where a replica is: its region's box (index), row and column inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) region: usize,
    pub(super) row: usize,
    pub(super) col: usize,
}

/// The arrangement, before sizes.
#[derive(Debug, Clone)]
pub(super) struct Grid {
    /// Continents that have regions, in file order: the columns.
    pub(super) continents: Vec<String>,
    pub(super) regions: Vec<RegionBox>,
    pub(super) slots: BTreeMap<ReplicaId, Slot>,
    /// Rows of boxes: the most regions a continent has.
    pub(super) grid_rows: usize,
}

impl Grid {
    pub(super) fn new(t: &Topology) -> Grid {
        let mut continents = Vec::new();
        let mut regions = Vec::new();
        let mut slots = BTreeMap::new();
        let mut grid_rows = 0;
        for continent in &t.continents {
            let col = continents.len();
            let mut grid_row = 0;
            for region in t.regions.values().filter(|r| &r.continent == continent) {
                let index = regions.len();
                let n = region.replicas.len();
                for (i, id) in region.replicas.iter().enumerate() {
                    slots.insert(
                        id.clone(),
                        Slot {
                            region: index,
                            row: i / PER_ROW,
                            col: i % PER_ROW,
                        },
                    );
                }
                regions.push(RegionBox {
                    id: region.name.clone(),
                    col,
                    grid_row,
                    per_row: n.clamp(1, PER_ROW),
                    rows: n.div_ceil(PER_ROW).max(1),
                });
                grid_row += 1;
            }
            if grid_row > 0 {
                continents.push(continent.clone());
                grid_rows = grid_rows.max(grid_row);
            }
        }
        Grid {
            continents,
            regions,
            slots,
            grid_rows,
        }
    }

    pub(super) fn columns(&self) -> usize {
        self.continents.len()
    }
}

/// Sizes and places: every coordinate a panel needs, relative to the panel's top
/// left corner.
#[derive(Debug, Clone)]
pub(super) struct Geometry {
    pub(super) cell_w: f64,
    /// Per column: left edge and width of its boxes.
    pub(super) col_x: Vec<f64>,
    pub(super) col_w: Vec<f64>,
    /// Per vertical corridor (`columns + 1`): its middle, and how many tracks.
    v_mid: Vec<f64>,
    v_n: Vec<usize>,
    /// Per horizontal corridor (`grid_rows + 1`).
    h_mid: Vec<f64>,
    h_n: Vec<usize>,
    /// Per region: its box.
    pub(super) boxes: Vec<Rect>,
    /// Per region, per row of discs: the discs' centre line.
    disc_y: Vec<Vec<f64>>,
    /// Baseline of the continent names.
    pub(super) continent_y: f64,
    /// Top of the continent bands.
    pub(super) band_top: f64,
    pub(super) width: f64,
    pub(super) height: f64,
}

fn corridor(n: usize, pad: f64, min: f64) -> f64 {
    (2.0 * pad + n.saturating_sub(1) as f64 * TRACK).max(min)
}

fn lane_band(n: usize) -> f64 {
    if n == 0 {
        LANE_EMPTY
    } else {
        LANE_GAP + (n - 1) as f64 * LANE_TRACK + LANE_TOP
    }
}

/// From a row's label baseline to the next row's top.
const LABEL_DOWN: f64 = DESCENT_EM * FONT_REPLICA + ROW_GAP;
/// From a disc's centre to its label's baseline.
const LABEL_BASE: f64 = R + LABEL_GAP + ASCENT_EM * FONT_REPLICA;

impl Geometry {
    /// `top`: where the continent band starts; `header`: the widest header text a
    /// region box must hold (its name, or its name marked excluded), by region;
    /// `edge_label_w`: the widest label an edge between neighbouring discs carries.
    pub(super) fn new(
        grid: &Grid,
        tracks: &Tracks,
        top: f64,
        header: &dyn Fn(&RegionBox) -> f64,
        edge_label_w: f64,
    ) -> Geometry {
        let lane = |region: usize, row: usize| {
            tracks
                .get(&Channel::Lane { region, row })
                .copied()
                .unwrap_or(0)
        };
        let widest_id = grid
            .slots
            .keys()
            .map(|id| text_width(id.as_str(), FONT_REPLICA))
            .fold(0.0, f64::max);
        let cell_w = (widest_id + 12.0)
            .max(2.0 * R + edge_label_w + 10.0)
            .max(44.0)
            .ceil();
        let columns = grid.columns();
        let mut col_w = vec![0.0f64; columns];
        for (c, name) in grid.continents.iter().enumerate() {
            col_w[c] = text_width(name, FONT_CONTINENT) + 4.0;
        }
        for r in &grid.regions {
            let w = (2.0 * PAD_IN + r.per_row as f64 * cell_w).max(header(r) + 2.0 * PAD_IN);
            col_w[r.col] = col_w[r.col].max(w.ceil());
        }
        let v_n: Vec<usize> = (0..=columns)
            .map(|i| tracks.get(&Channel::V(i)).copied().unwrap_or(0))
            .collect();
        let h_n: Vec<usize> = (0..=grid.grid_rows)
            .map(|i| tracks.get(&Channel::H(i)).copied().unwrap_or(0))
            .collect();
        let mut x = MARGIN;
        let mut v_mid = Vec::new();
        let mut col_x = Vec::new();
        for c in 0..=columns {
            let w = corridor(v_n[c], V_PAD, V_MIN);
            v_mid.push(x + w / 2.0);
            x += w;
            if c < columns {
                col_x.push(x);
                x += col_w[c];
            }
        }
        let width = x + MARGIN;

        // Box heights, then rows of boxes.
        let mut disc_rel: Vec<Vec<f64>> = Vec::new();
        let mut box_h = Vec::new();
        for (i, r) in grid.regions.iter().enumerate() {
            let mut y = HEADER;
            let mut rows = Vec::new();
            for row in 0..r.rows {
                y += lane_band(lane(i, row)) + R;
                rows.push(y);
                y += LABEL_BASE + LABEL_DOWN;
            }
            disc_rel.push(rows);
            box_h.push(y + 2.0);
        }
        let mut row_h = vec![0.0f64; grid.grid_rows];
        for (r, h) in grid.regions.iter().zip(&box_h) {
            row_h[r.grid_row] = row_h[r.grid_row].max(*h);
        }
        let continent_y = top + 18.0;
        let mut y = top + CONTINENT_BAND;
        let mut h_mid = Vec::new();
        let mut row_y = Vec::new();
        for g in 0..=grid.grid_rows {
            let h = corridor(h_n[g], H_PAD, H_MIN);
            h_mid.push(y + h / 2.0);
            y += h;
            if g < grid.grid_rows {
                row_y.push(y);
                y += row_h[g];
            }
        }
        let height = y + 6.0;
        let boxes = grid
            .regions
            .iter()
            .zip(&box_h)
            .map(|(r, h)| Rect::new(col_x[r.col], row_y[r.grid_row], col_w[r.col], *h))
            .collect::<Vec<_>>();
        let disc_y = disc_rel
            .into_iter()
            .zip(&boxes)
            .map(|(rows, b)| rows.into_iter().map(|y| b.y0 + y).collect())
            .collect();
        Geometry {
            cell_w,
            col_x,
            col_w,
            v_mid,
            v_n,
            h_mid,
            h_n,
            boxes,
            disc_y,
            continent_y,
            band_top: top + 2.0,
            width,
            height,
        }
    }

    /// A disc's centre.
    pub(super) fn disc(&self, s: Slot) -> Pt {
        let b = &self.boxes[s.region];
        (
            b.x0 + PAD_IN + (s.col as f64 + 0.5) * self.cell_w,
            self.disc_y[s.region][s.row],
        )
    }

    /// Baseline of a replica's id, under its disc.
    pub(super) fn label_y(&self, s: Slot) -> f64 {
        self.disc(s).1 + LABEL_BASE
    }

    /// Baseline of a region's name.
    pub(super) fn header_y(&self, region: usize) -> f64 {
        self.boxes[region].y0 + 15.0
    }

    pub(super) fn header_x(&self, region: usize) -> f64 {
        self.boxes[region].x0 + PAD_IN
    }

    /// A track of the lane above a row of discs: 0 lowest.
    pub(super) fn lane_y(&self, region: usize, row: usize, track: usize) -> f64 {
        self.disc_y[region][row] - R - LANE_GAP - track as f64 * LANE_TRACK
    }

    /// A track of vertical corridor `i`, centred in it.
    pub(super) fn v_x(&self, i: usize, track: usize) -> f64 {
        self.v_mid[i] + (track as f64 - (self.v_n[i].max(1) - 1) as f64 / 2.0) * TRACK
    }

    /// A track of horizontal corridor `i`, centred in it.
    pub(super) fn h_y(&self, i: usize, track: usize) -> f64 {
        self.h_mid[i] + (track as f64 - (self.h_n[i].max(1) - 1) as f64 / 2.0) * TRACK
    }
}
