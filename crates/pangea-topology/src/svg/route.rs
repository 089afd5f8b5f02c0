//! Edges routed orthogonally along corridors, so that none passes through a disc or
//! a region box other than its endpoints'.
//!
//! - Neighbours in a row of discs: a straight line between them.
//! - Other replicas in one row of a region: up from each disc to a track of the
//!   lane above the row, and along it.
//! - Anything else: up to a track of the lane above the endpoint's row, along it out
//!   of the box into the vertical corridor beside the box (the side facing the other
//!   end; for two boxes of one column, its less used side), along that corridor, then (ends in columns not side by side) along the
//!   horizontal corridor between the two rows of boxes — the least used of those
//!   that are — and the far end's vertical corridor, into the far box the same way.
//!
//! Every edge has a track of its own in every corridor and lane it uses, so no two
//! edges run along each other; where an edge leaves a disc it has a port of its own
//! (a few pixels apart on the disc's top), ordered so that edges from one disc do
//! not cross each other.

use super::geom::{Pt, simplify};
use super::layout::{Geometry, Grid, R, Slot};
use crate::tree::{Edge, Tree};
use std::collections::BTreeMap;

/// Where parallel lines run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Channel {
    /// Above a row of discs inside a region's box.
    Lane { region: usize, row: usize },
    /// Left of column `i` (right of the last: `i = columns`).
    V(usize),
    /// Above row of boxes `i` (below the last: `i = grid_rows`).
    H(usize),
}

/// Tracks used, by channel.
pub(super) type Tracks = BTreeMap<Channel, usize>;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Path {
    Straight,
    /// Along a track of the lane both ends' row shares.
    Lane {
        track: usize,
    },
    /// Out of one box and into another (or the same box's other row): the lane
    /// track at each end, and the corridors (channel, track) in between.
    Via {
        a_track: usize,
        legs: Vec<(Channel, usize)>,
        b_track: usize,
    },
}

/// A tree edge and its route.
#[derive(Debug, Clone)]
pub(super) struct Routed<'t> {
    pub(super) edge: &'t Edge,
    pub(super) a: Slot,
    pub(super) b: Slot,
    pub(super) path: Path,
}

fn take(tracks: &mut Tracks, c: Channel) -> usize {
    let n = tracks.entry(c).or_default();
    *n += 1;
    *n - 1
}

/// Routes a tree's edges (those whose replicas the grid has), and the tracks they
/// take.
pub(super) fn route<'t>(grid: &Grid, tree: &'t Tree) -> (Vec<Routed<'t>>, Tracks) {
    let mut tracks = Tracks::new();
    let mut out = Vec::new();
    for edge in &tree.edges {
        let (Some(&a), Some(&b)) = (grid.slots.get(&edge.a), grid.slots.get(&edge.b)) else {
            continue;
        };
        let path = if a.region == b.region && a.row == b.row {
            if a.col.abs_diff(b.col) == 1 {
                Path::Straight
            } else {
                Path::Lane {
                    track: take(
                        &mut tracks,
                        Channel::Lane {
                            region: a.region,
                            row: a.row,
                        },
                    ),
                }
            }
        } else {
            let (ra, rb) = (&grid.regions[a.region], &grid.regions[b.region]);
            let (va, vb) = sides(ra.col, rb.col, &tracks);
            let a_track = take(
                &mut tracks,
                Channel::Lane {
                    region: a.region,
                    row: a.row,
                },
            );
            let legs = if va == vb {
                vec![(Channel::V(va), take(&mut tracks, Channel::V(va)))]
            } else {
                let (lo, hi) = (ra.grid_row.min(rb.grid_row), ra.grid_row.max(rb.grid_row));
                // Between the two rows of boxes; for one row, just above or below it.
                let candidates = if lo == hi { lo..=lo + 1 } else { lo + 1..=hi };
                let h = candidates
                    .min_by_key(|&i| (tracks.get(&Channel::H(i)).copied().unwrap_or(0), i))
                    .expect("a corridor");
                vec![
                    (Channel::V(va), take(&mut tracks, Channel::V(va))),
                    (Channel::H(h), take(&mut tracks, Channel::H(h))),
                    (Channel::V(vb), take(&mut tracks, Channel::V(vb))),
                ]
            };
            let b_track = take(
                &mut tracks,
                Channel::Lane {
                    region: b.region,
                    row: b.row,
                },
            );
            Path::Via {
                a_track,
                legs,
                b_track,
            }
        };
        out.push(Routed { edge, a, b, path });
    }
    (out, tracks)
}

/// The vertical corridors an edge between columns `ca` and `cb` leaves and enters
/// by: facing each other, or (one column) both on the side of the column fewer
/// edges use so far (the left one if as many).
fn sides(ca: usize, cb: usize, tracks: &Tracks) -> (usize, usize) {
    use std::cmp::Ordering::*;
    match ca.cmp(&cb) {
        Less => (ca + 1, cb),
        Greater => (ca, cb + 1),
        Equal => {
            let used = |v: usize| tracks.get(&Channel::V(v)).copied().unwrap_or(0);
            let v = if used(ca + 1) < used(ca) { ca + 1 } else { ca };
            (v, v)
        }
    }
}

/// Which way an edge leaves a disc, and at which lane track.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Leave {
    Left(usize),
    Right(usize),
}

/// The edges leaving each disc upwards (by region, row and column): which way, the
/// edge's index, and whether the disc is the edge's `a` end.
type Leaving = BTreeMap<(usize, usize, usize), Vec<(Leave, usize, bool)>>;

/// Each route as points, from `edge.a`'s disc centre to `edge.b`'s.
pub(super) fn polylines(grid: &Grid, geo: &Geometry, routes: &[Routed<'_>]) -> Vec<Vec<Pt>> {
    // Ports: each edge leaving a disc upwards gets its own x on the disc.
    let mut leaving: Leaving = BTreeMap::new();
    let key = |s: Slot| (s.region, s.row, s.col);
    for (i, r) in routes.iter().enumerate() {
        let (la, lb) = match &r.path {
            Path::Straight => continue,
            Path::Lane { track } => {
                if r.a.col < r.b.col {
                    (Leave::Right(*track), Leave::Left(*track))
                } else {
                    (Leave::Left(*track), Leave::Right(*track))
                }
            }
            Path::Via {
                a_track,
                legs,
                b_track,
            } => {
                let side = |s: Slot, leg: &(Channel, usize), track: usize| match leg.0 {
                    Channel::V(v) if v == grid.regions[s.region].col => Leave::Left(track),
                    _ => Leave::Right(track),
                };
                (
                    side(r.a, &legs[0], *a_track),
                    side(r.b, legs.last().expect("a leg"), *b_track),
                )
            }
        };
        leaving.entry(key(r.a)).or_default().push((la, i, true));
        leaving.entry(key(r.b)).or_default().push((lb, i, false));
    }
    // Left-going edges on the left, the lowest track leftmost; right-going on the
    // right, the lowest track rightmost: no two cross near the disc.
    let mut port: BTreeMap<(usize, bool), f64> = BTreeMap::new();
    for list in leaving.values_mut() {
        list.sort_by_key(|(leave, i, at_a)| {
            let order = match *leave {
                Leave::Left(t) => (0, t as i64),
                Leave::Right(t) => (1, -(t as i64)),
            };
            (order, *i, *at_a)
        });
        let n = list.len();
        let step = if n > 1 {
            (2.0 * (R - 4.0) / (n - 1) as f64).min(5.0)
        } else {
            0.0
        };
        for (k, (_, i, at_a)) in list.iter().enumerate() {
            port.insert((*i, *at_a), (k as f64 - (n - 1) as f64 / 2.0) * step);
        }
    }
    routes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (pa, pb) = (geo.disc(r.a), geo.disc(r.b));
            let points = match &r.path {
                Path::Straight => vec![pa, pb],
                Path::Lane { track } => {
                    let y = geo.lane_y(r.a.region, r.a.row, *track);
                    let xa = pa.0 + port[&(i, true)];
                    let xb = pb.0 + port[&(i, false)];
                    vec![(xa, pa.1), (xa, y), (xb, y), (xb, pb.1)]
                }
                Path::Via {
                    a_track,
                    legs,
                    b_track,
                } => {
                    let ya = geo.lane_y(r.a.region, r.a.row, *a_track);
                    let yb = geo.lane_y(r.b.region, r.b.row, *b_track);
                    let xa = pa.0 + port[&(i, true)];
                    let xb = pb.0 + port[&(i, false)];
                    let mut p = vec![(xa, pa.1), (xa, ya)];
                    match legs.as_slice() {
                        [(Channel::V(v), t)] => {
                            let x = geo.v_x(*v, *t);
                            p.extend([(x, ya), (x, yb)]);
                        }
                        [
                            (Channel::V(v1), t1),
                            (Channel::H(h), th),
                            (Channel::V(v2), t2),
                        ] => {
                            let (x1, x2, y) =
                                (geo.v_x(*v1, *t1), geo.v_x(*v2, *t2), geo.h_y(*h, *th));
                            p.extend([(x1, ya), (x1, y), (x2, y), (x2, yb)]);
                        }
                        _ => unreachable!("routes have one leg or three"),
                    }
                    p.extend([(xb, yb), (xb, pb.1)]);
                    p
                }
            };
            simplify(points)
        })
        .collect()
}
