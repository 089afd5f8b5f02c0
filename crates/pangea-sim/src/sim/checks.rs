//! The checkers' state (C1–C5, C7) in dense tables, and what they learn from the
//! wire: every durable write joins the oracle once, and a sequence carrying two
//! different writes is C1. The event loop (`super`) feeds them; the verdicts are
//! read by the report.

use super::*;

/// Most violations kept in words (all are counted).
const VIOLATIONS_KEPT: usize = 50;
/// How far back C7 can ask what a replica held durably: longer than any bound
/// drills use plus the clocks' allowed offset.
pub(super) const DURABLE_HISTORY: SimDuration = SimDuration::from_ms(10_000);

/// One durable write as the checkers know it: its timestamp and a hash of its row
/// key, enough to tell a reused sequence (C1) from a second copy of the same write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Fingerprint {
    pub(super) timestamp: u64,
    pub(super) key_hash: u64,
}

/// C1–C5 state, in dense tables.
#[derive(Debug)]
pub(super) struct Checks {
    pub(super) replicas: usize,
    pub(super) scopes: usize,
    /// `[(replica × scopes + scope) × replicas + origin]`: highest applied sequence.
    pub(super) applied: Vec<u64>,
    /// Same index: highest advertised (durable) watermark.
    pub(super) advertised: Vec<(u64, Timestamp)>,
    /// `[scope × replicas + origin]`: the durable writes of each stream, by
    /// sequence − 1 (the oracle's membership test and C1's reuse detector).
    pub(super) streams: Vec<Vec<Fingerprint>>,
    /// `[scope × replicas + origin]`: the durable writes themselves, by sequence
    /// − 1, when a backup runs (C10 rebuilds a scope as of a cut from them);
    /// empty otherwise.
    pub(super) log: Vec<Vec<Option<LogEntry>>>,
    /// `[scope × replicas + origin]`: proposal time of each write, by sequence − 1.
    pub(super) proposed_us: Vec<Vec<u64>>,
    /// `[scope × replicas + origin]`: highest acknowledged sequence.
    pub(super) acked_max: Vec<u64>,
    /// Every durable write applied to empty rows (C5's oracle).
    pub(super) oracle: BTreeMap<(Arc<str>, Bytes), RowState>,
    pub(super) lost_writes: u64,
    pub(super) watermark_violations: u64,
    pub(super) token_violations: u64,
    pub(super) staleness_violations: u64,
    pub(super) other_violations: u64,
    /// Same index as `applied`: (time µs, durable sequence) at each change of the
    /// durable watermark within the last `DURABLE_HISTORY`, after the last change
    /// before it (C7 asks what a replica held durably some seconds ago).
    pub(super) durable_history: Vec<VecDeque<(u64, u64)>>,
    /// Same index: the last sequence `durable_history` recorded (`u64::MAX`: none
    /// yet). Most watermark advances move the time alone; this dense copy answers
    /// them without reaching the history's buffer.
    pub(super) durable_last: Vec<u64>,
    pub(super) violations: Vec<String>,
    /// Tables and GC policies, which the oracle applies exactly as replicas do.
    pub(super) schema: pangea_topology::schema::Schema,
    /// C8: the increments acknowledged to each counter (table, row, family,
    /// column), where the client runs: their versions and deltas.
    pub(super) counted: Counted,
    /// Increments acknowledged that some replica does not count (C8).
    pub(super) lost_increments: u64,
}

/// Acknowledged increments per counter (table, row, family, column).
pub(super) type Counted = BTreeMap<(Arc<str>, Bytes, Arc<str>, Bytes), Vec<(Version, i64)>>;

impl Checks {
    /// C8: notes the increments of a write acknowledged at `version`; returns
    /// how many it holds.
    pub(super) fn count_acknowledged(&mut self, m: &RowMutation, version: Version) -> u64 {
        let mut n = 0;
        for x in m.mutations() {
            if let Mutation::Increment {
                family,
                column,
                delta,
            } = x
            {
                let k = (
                    m.table().clone(),
                    m.row_key().clone(),
                    family.clone(),
                    column.clone(),
                );
                self.counted
                    .entry(k)
                    .or_default()
                    .push((version.clone(), *delta));
                n += 1;
            }
        }
        n
    }

    pub(super) fn idx(&self, r: usize, s: usize, o: usize) -> usize {
        (r * self.scopes + s) * self.replicas + o
    }

    pub(super) fn stream(&self, s: usize, o: usize) -> usize {
        s * self.replicas + o
    }

    /// Records that `k`'s durable watermark reached `sequence` at `now_us` (C7).
    pub(super) fn note_durable(&mut self, k: usize, sequence: u64, now_us: u64) {
        // Most advances move the watermark's time alone: nothing to record.
        if self.durable_last[k] == sequence {
            return;
        }
        self.durable_last[k] = sequence;
        let h = &mut self.durable_history[k];
        match h.back_mut() {
            Some(last) if last.0 == now_us => last.1 = sequence,
            _ => h.push_back((now_us, sequence)),
        }
        // Keep one change at or before the horizon: the value at any later time.
        let horizon = now_us.saturating_sub(DURABLE_HISTORY.as_us());
        while h.len() > 1 && h[1].0 <= horizon {
            h.pop_front();
        }
    }

    /// C7: of the replicas `heard` by reader `r` (each with the virtual time its
    /// clock read the read's claim), the first that held durably, by then, more of
    /// origin `o`'s stream in scope `s` than `have`, and how much.
    pub(super) fn lacked(
        &self,
        r: usize,
        s: usize,
        o: usize,
        have: u64,
        heard: &[(usize, u64)],
    ) -> Option<(usize, u64)> {
        heard
            .iter()
            .filter(|(p, _)| *p != o && *p != r)
            .map(|&(p, then_us)| (p, self.durable_at(self.idx(p, s, o), then_us)))
            .find(|(_, had)| *had > have)
    }

    /// What `k` held durably at time `at_us` (0 before anything; callers stay
    /// within `DURABLE_HISTORY`).
    pub(super) fn durable_at(&self, k: usize, at_us: u64) -> u64 {
        let h = &self.durable_history[k];
        let i = h.partition_point(|(t, _)| *t <= at_us);
        if i == 0 { 0 } else { h[i - 1].1 }
    }

    #[cold]
    pub(super) fn violation(&mut self, what: String) {
        if self.violations.len() < VIOLATIONS_KEPT {
            self.violations.push(what);
        }
    }
}

/// Entries on the wire are durable at their origin (I11): they join the oracle, and
/// a sequence seen twice with different writes is a C1 violation.
pub(super) fn note_wire(
    checks: &mut Checks,
    scopes: &Interner,
    names: &Interner,
    f: &Frame,
    now: SimTime,
) {
    let entries: &[LogEntry] = match f {
        Frame::Mutations(es) => es,
        Frame::GapFill(g) => &g.entries,
        _ => return,
    };
    let _ = now;
    for e in entries {
        note_durable(checks, scopes, names, e);
    }
}

pub(super) fn note_durable(checks: &mut Checks, scopes: &Interner, names: &Interner, e: &LogEntry) {
    let (Some(s), Some(o)) = (scopes.get(e.scope.as_str()), names.get(e.origin.as_str())) else {
        return;
    };
    let st = checks.stream(s, o);
    let i = (e.sequence - 1) as usize;
    let fp = Fingerprint {
        timestamp: e.timestamp.as_u64(),
        key_hash: xxh3_64(e.mutation.row_key()),
    };
    let known = checks.streams[st].get(i).copied().unwrap_or_default();
    if known == fp {
        return;
    }
    if known != Fingerprint::default() {
        checks.lost_writes += 1;
        checks.violation(format!(
            "C1: {}/{} #{} carries two different writes",
            e.scope, e.origin, e.sequence
        ));
        return;
    }
    let v = &mut checks.streams[st];
    if v.len() <= i {
        v.resize(i + 1, Fingerprint::default());
    }
    v[i] = fp;
    if let Some(log) = checks.log.get_mut(st) {
        if log.len() <= i {
            log.resize(i + 1, None);
        }
        log[i] = Some(e.clone());
    }
    let _ = names;
    let table: Arc<str> = e.mutation.table().clone();
    let row = checks
        .oracle
        .entry((table, e.mutation.row_key().clone()))
        .or_default();
    row.apply(
        &e.mutation
            .cell_version(&Version::new(e.timestamp, e.origin.clone())),
        e.mutation.mutations(),
        checks.schema.table(e.mutation.table()),
    );
}
