//! The checkers of a recorded history (docs/invariants.md names them):
//!
//! - **C1, no acknowledged write lost.** After the heal, every replica that stores a
//!   key holds, for each acknowledged write to it, that write or a later one in merge
//!   order; unique-key writes (`set`, `ryw`) are present with their value; a final
//!   value was written by someone; no (scope, origin, sequence) names two writes.
//! - **C4, no watermark read below its token.** A watermark read that answered
//!   returned the token's write or a later one (for unique keys: exactly it).
//! - **C5, convergence.** After the heal every replica's content digest of each
//!   scope it stores is equal, within the limit the run was given.
//! - **Residency.** No replica holds a row its placement policy does not allow.
//! - **C9, change streams miss nothing.** Every acknowledged write begun after
//!   the last change-stream consumer took its cursor is in some consumer's
//!   stream, and no consumer's stream goes back within an origin.
//! - **C10, a backup holds its cut.** Read back as of its cut, each backup holds
//!   every acknowledged write at or below its cut (the write or a later version;
//!   for unique keys, exactly it) and no acknowledged unique-key write above it.
//!   A scope the backup says is not exact (no tail) is held to its start only.
//!   At least one backup of a run completes.
//!
//! A write whose outcome is unknown (`info`) may or may not have applied, so it is
//! never required, but its value may legitimately be read.

use super::history::{Cell, Event, Kind, Op, Outcome, Version};
use pangea_client::Token;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Workloads whose every write has a key of its own.
const UNIQUE_KEY_WORKLOADS: [&str; 2] = ["set", "ryw"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub checker: &'static str,
    pub message: String,
    /// The operations involved (ids in the history).
    pub ops: Vec<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// Per workload and kind ("register write"): outcomes.
    pub ops: BTreeMap<String, Counts>,
    /// Faults started, per kind.
    pub faults: BTreeMap<String, u64>,
    pub convergence_ms: Option<u64>,
    /// Distinct changes the change-stream consumers read (workload `changes`).
    pub changes_seen: u64,
    /// Backups of the `backup` workload.
    pub backups: Backups,
    pub violations: Vec<Violation>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Backups {
    pub taken: u64,
    pub failed: u64,
    /// Times a replica failed during a backup and its scopes went to another.
    pub failovers: u64,
}

pub fn check(events: &[Event]) -> Report {
    let mut report = Report::default();
    let ops: Vec<&Op> = events
        .iter()
        .filter_map(|e| match e {
            Event::Op(op) => Some(op),
            _ => None,
        })
        .collect();
    for op in &ops {
        let kind = match op.kind {
            Kind::Write => "write",
            Kind::Read => "read",
        };
        let c = report
            .ops
            .entry(format!("{} {kind}", op.workload))
            .or_default();
        match op.outcome {
            Outcome::Ok => c.ok += 1,
            Outcome::Fail => c.fail += 1,
            Outcome::Info => c.info += 1,
        }
    }
    for e in events {
        if let Event::Fault {
            fault,
            phase: super::history::Phase::Start,
            ..
        } = e
        {
            *report.faults.entry(fault.clone()).or_default() += 1;
        }
    }
    let mut seen = BTreeSet::new();
    for e in events {
        match e {
            Event::Changes { names, .. } => seen.extend(names.iter()),
            Event::Backup { ok, failovers, .. } => {
                let b = &mut report.backups;
                b.failovers += failovers;
                if *ok {
                    b.taken += 1;
                } else {
                    b.failed += 1;
                }
            }
            _ => {}
        }
    }
    report.changes_seen = seen.len() as u64;
    let v = &mut report.violations;
    check_tokens(&ops, v);
    check_watermark_reads(&ops, v);
    check_final(events, &ops, v);
    check_changes(events, &ops, v);
    check_backups(events, &ops, v);
    report.convergence_ms = check_convergence(events, v);
    report
}

/// C9: what the change-stream consumers read against the acknowledged writes.
fn check_changes(events: &[Event], ops: &[&Op], v: &mut Vec<Violation>) {
    let mut from = None;
    let mut seen: BTreeSet<(&str, &str, u64)> = BTreeSet::new();
    let mut last: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
    for e in events {
        match e {
            Event::ChangesFrom { at_us, .. } => from = from.max(Some(*at_us)),
            Event::ChangesLost { region, error, .. } => v.push(Violation {
                checker: "C9",
                message: format!("the change-stream consumer in {region} lost its place: {error}"),
                ops: vec![],
            }),
            Event::Changes { region, names, .. } => {
                for (scope, origin, seq) in names {
                    let at = (region.as_str(), scope.as_str(), origin.as_str());
                    if let Some(prev) = last.insert(at, *seq)
                        && prev > *seq
                    {
                        v.push(Violation {
                            checker: "C9",
                            message: format!(
                                "the change stream in {region} went back in {scope}/{origin}: \
                                 #{seq} after #{prev}"
                            ),
                            ops: vec![],
                        });
                    }
                    seen.insert((scope, origin, *seq));
                }
            }
            _ => {}
        }
    }
    let Some(from) = from else {
        return; // no consumer ran
    };
    let missing: Vec<(&Op, Token)> = ops
        .iter()
        .filter(|o| o.kind == Kind::Write && o.outcome == Outcome::Ok && o.start_us > from)
        .filter_map(|o| Some((*o, token_of(o)?)))
        .filter(|(_, t)| !seen.contains(&(t.scope.as_str(), t.origin.as_str(), t.sequence)))
        .collect();
    if !missing.is_empty() {
        let shown: Vec<String> = missing
            .iter()
            .take(5)
            .map(|(o, t)| {
                format!(
                    "{} {:?} ({}/{}#{})",
                    o.id, o.key, t.scope, t.origin, t.sequence
                )
            })
            .collect();
        v.push(Violation {
            checker: "C9",
            message: format!(
                "{} acknowledged writes are in no consumer's change stream: {}",
                missing.len(),
                shown.join(", ")
            ),
            ops: missing.iter().map(|(o, _)| o.id).collect(),
        });
    }
}

/// C10: each backup read back against the acknowledged writes.
fn check_backups(events: &[Event], ops: &[&Op], v: &mut Vec<Violation>) {
    fn positions(ps: &[(String, String, u64)]) -> BTreeMap<(&str, &str), u64> {
        ps.iter()
            .map(|(s, o, q)| ((s.as_str(), o.as_str()), *q))
            .collect()
    }
    // Per backup: its cut, and what it holds for certain.
    type Cut<'a> = BTreeMap<(&'a str, &'a str), u64>;
    let mut cuts: BTreeMap<u64, (Cut<'_>, Cut<'_>)> = BTreeMap::new();
    let mut taken = 0;
    for e in events {
        if let Event::Backup {
            id,
            ok: true,
            cut,
            held,
            ..
        } = e
        {
            taken += 1;
            cuts.insert(*id, (positions(cut), positions(held)));
        }
    }
    let tried = events.iter().any(|e| matches!(e, Event::Backup { .. }));
    if tried && taken == 0 {
        v.push(Violation {
            checker: "C10",
            message: "no backup of the run completed".into(),
            ops: vec![],
        });
    }
    let writes: Vec<(&Op, Token)> = ops
        .iter()
        .filter(|o| o.kind == Kind::Write && o.outcome == Outcome::Ok)
        .filter_map(|o| Some((*o, token_of(o)?)))
        .collect();
    for e in events {
        let Event::BackupRows { id, rows } = e else {
            continue;
        };
        let Some((cut, held)) = cuts.get(id) else {
            continue;
        };
        let cells: BTreeMap<&str, &Cell> = rows.iter().map(|c| (c.key.as_str(), c)).collect();
        for (op, t) in &writes {
            let stream = (t.scope.as_str(), t.origin.as_str());
            let (Some(&upto), Some(&sure)) = (cut.get(&stream), held.get(&stream)) else {
                continue; // a scope this backup does not hold
            };
            let unique = UNIQUE_KEY_WORKLOADS.contains(&op.workload.as_str());
            let wrote = version_of(t);
            let problem = match cells.get(op.key.as_str()) {
                None if t.sequence <= sure => Some("lacks it".to_owned()),
                Some(c) if t.sequence <= sure && unique && c.version != wrote => {
                    Some(format!("holds {:?} at {:?} instead", c.value, c.version))
                }
                Some(c) if t.sequence <= sure && c.version < wrote => {
                    Some(format!("holds the older {:?} at {:?}", c.value, c.version))
                }
                Some(c) if t.sequence > upto && unique => Some(format!(
                    "holds it ({:?}) although it is past the cut",
                    c.value
                )),
                _ => None,
            };
            if let Some(p) = problem {
                v.push(Violation {
                    checker: "C10",
                    message: format!(
                        "backup {id} (cut {}/{} #{upto}) and acknowledged write {} of {:?} \
                         ({}/{}#{}): the backup {p}",
                        t.scope, t.origin, op.id, op.key, t.scope, t.origin, t.sequence
                    ),
                    ops: vec![op.id],
                });
            }
        }
    }
}

/// The decoded token of an operation, if it has a well-formed one.
fn token_of(op: &Op) -> Option<Token> {
    let bytes = decode_hex(op.token.as_deref()?)?;
    Token::decode(&bytes).ok()
}

fn version_of(t: &Token) -> Version {
    Version {
        ts: t.timestamp.as_u64(),
        origin: t.origin.to_string(),
    }
}

/// C1 (I11): a (scope, origin, sequence) names one write forever.
fn check_tokens(ops: &[&Op], v: &mut Vec<Violation>) {
    let mut seen: BTreeMap<(String, String, u64), &Op> = BTreeMap::new();
    for op in ops
        .iter()
        .filter(|o| o.kind == Kind::Write && o.outcome == Outcome::Ok)
    {
        let Some(t) = token_of(op) else {
            v.push(Violation {
                checker: "C1",
                message: format!("acknowledged write {} has no readable token", op.id),
                ops: vec![op.id],
            });
            continue;
        };
        let id = (t.scope.to_string(), t.origin.to_string(), t.sequence);
        if let Some(first) = seen.insert(id.clone(), op) {
            v.push(Violation {
                checker: "C1",
                message: format!(
                    "writes {} ({:?}={:?}) and {} ({:?}={:?}) both carry sequence {} of \
                     origin {} in scope {}",
                    first.id, first.key, first.value, op.id, op.key, op.value, id.2, id.1, id.0
                ),
                ops: vec![first.id, op.id],
            });
        }
    }
}

/// C4: a watermark read never returns less than its token's write.
fn check_watermark_reads(ops: &[&Op], v: &mut Vec<Violation>) {
    // Unique-key writes by token, to compare values too.
    let writes: BTreeMap<&str, &Op> = ops
        .iter()
        .filter(|o| o.kind == Kind::Write)
        .filter_map(|o| Some((o.token.as_deref()?, *o)))
        .collect();
    for op in ops.iter().filter(|o| {
        o.kind == Kind::Read
            && o.outcome == Outcome::Ok
            && o.consistency.as_deref() == Some("watermark")
    }) {
        let Some(token) = token_of(op) else {
            v.push(Violation {
                checker: "C4",
                message: format!("watermark read {} has no readable token", op.id),
                ops: vec![op.id],
            });
            continue;
        };
        let wanted = version_of(&token);
        let write = op.token.as_deref().and_then(|t| writes.get(t));
        let mut involved = vec![op.id];
        involved.extend(write.map(|w| w.id));
        let at = op.replica.as_deref().unwrap_or("?");
        match (&op.value, &op.version) {
            (None, _) | (_, None) => v.push(Violation {
                checker: "C4",
                message: format!(
                    "watermark read {} of {:?} at {at} found no row, but its token's write \
                     (version {}@{}) had been acknowledged",
                    op.id, op.key, wanted.ts, wanted.origin
                ),
                ops: involved,
            }),
            (Some(value), Some(got)) => {
                if *got < wanted {
                    v.push(Violation {
                        checker: "C4",
                        message: format!(
                            "watermark read {} of {:?} at {at} returned version {}@{} ({value:?}), \
                             older than its token's {}@{}",
                            op.id, op.key, got.ts, got.origin, wanted.ts, wanted.origin
                        ),
                        ops: involved,
                    });
                } else if let Some(w) = write
                    && UNIQUE_KEY_WORKLOADS.contains(&w.workload.as_str())
                    && w.value.as_ref() != Some(value)
                {
                    v.push(Violation {
                        checker: "C4",
                        message: format!(
                            "watermark read {} of {:?} at {at} returned {value:?}, but the only \
                             write of that key wrote {:?}",
                            op.id, op.key, w.value
                        ),
                        ops: involved,
                    });
                }
            }
        }
    }
}

/// C1 on the final state every replica reported after the heal.
fn check_final(events: &[Event], ops: &[&Op], v: &mut Vec<Violation>) {
    let finals: Vec<(&str, &str, &[super::history::Cell])> = events
        .iter()
        .filter_map(|e| match e {
            Event::Final {
                replica,
                prefix,
                rows,
            } => Some((replica.as_str(), prefix.as_str(), rows.as_slice())),
            _ => None,
        })
        .collect();
    let acked: Vec<&Op> = ops
        .iter()
        .copied()
        .filter(|o| o.kind == Kind::Write && o.outcome == Outcome::Ok)
        .collect();
    if finals.is_empty() {
        if !acked.is_empty() {
            v.push(Violation {
                checker: "C1",
                message: "the history has acknowledged writes but no final state to check \
                          them against (the run did not finish?)"
                    .into(),
                ops: vec![],
            });
        }
        return;
    }
    // Every value some write (acknowledged or not) wrote, per key.
    let mut written: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.kind == Kind::Write) {
        if let Some(value) = &o.value {
            written.entry(&o.key).or_default().insert(value);
        }
    }
    for (replica, prefix, rows) in finals {
        let held: BTreeMap<&str, &super::history::Cell> =
            rows.iter().map(|c| (c.key.as_str(), c)).collect();
        for cell in rows {
            if !written
                .get(cell.key.as_str())
                .is_some_and(|vals| vals.contains(cell.value.as_str()))
            {
                v.push(Violation {
                    checker: "C1",
                    message: format!(
                        "{replica} holds {:?}={:?}, which no operation wrote",
                        cell.key, cell.value
                    ),
                    ops: vec![],
                });
            }
        }
        for w in acked.iter().filter(|w| w.key.starts_with(prefix)) {
            let Some(cell) = held.get(w.key.as_str()) else {
                v.push(Violation {
                    checker: "C1",
                    message: format!(
                        "acknowledged write {} of {:?} is missing on {replica} after the heal",
                        w.id, w.key
                    ),
                    ops: vec![w.id],
                });
                continue;
            };
            let Some(wanted) = token_of(w).map(|t| version_of(&t)) else {
                continue; // reported by check_tokens
            };
            let lost = if UNIQUE_KEY_WORKLOADS.contains(&w.workload.as_str()) {
                w.value.as_deref() != Some(cell.value.as_str())
            } else {
                cell.version < wanted
                    || (cell.version == wanted && w.value.as_deref() != Some(cell.value.as_str()))
            };
            if lost {
                v.push(Violation {
                    checker: "C1",
                    message: format!(
                        "{replica} ends with {:?}={:?} (version {}@{}), which loses acknowledged \
                         write {} of {:?} (version {}@{})",
                        cell.key,
                        cell.value,
                        cell.version.ts,
                        cell.version.origin,
                        w.id,
                        w.value,
                        wanted.ts,
                        wanted.origin
                    ),
                    ops: vec![w.id],
                });
            }
        }
    }
}

/// C5 and residency, from the convergence record and the audits.
fn check_convergence(events: &[Event], v: &mut Vec<Violation>) -> Option<u64> {
    let converged = events.iter().find_map(|e| match e {
        Event::Converged {
            ok,
            after_heal_ms,
            detail,
        } => Some((*ok, *after_heal_ms, detail)),
        _ => None,
    });
    let convergence_ms = match converged {
        None => {
            v.push(Violation {
                checker: "C5",
                message: "the history records no convergence check".into(),
                ops: vec![],
            });
            None
        }
        Some((false, ms, detail)) => {
            v.push(Violation {
                checker: "C5",
                message: format!("replicas had not converged {ms} ms after the heal: {detail}"),
                ops: vec![],
            });
            None
        }
        Some((true, ms, _)) => Some(ms),
    };
    // Digests per scope, from the audits: all equal.
    let mut by_scope: BTreeMap<&str, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for e in events {
        if let Event::Audit {
            replica,
            rows_disallowed,
            scopes,
            ..
        } = e
        {
            if *rows_disallowed > 0 {
                v.push(Violation {
                    checker: "residency",
                    message: format!(
                        "{replica} holds {rows_disallowed} rows its placement does not allow"
                    ),
                    ops: vec![],
                });
            }
            for s in scopes {
                by_scope
                    .entry(&s.scope)
                    .or_default()
                    .entry(&s.digest)
                    .or_default()
                    .push(replica);
            }
        }
    }
    for (scope, digests) in by_scope {
        if digests.len() > 1 {
            let groups: Vec<String> = digests
                .iter()
                .map(|(d, rs)| format!("{} on {}", &d[..d.len().min(12)], rs.join(",")))
                .collect();
            v.push(Violation {
                checker: "C5",
                message: format!("scope {scope}: replicas disagree: {}", groups.join("; ")),
                ops: vec![],
            });
        }
    }
    convergence_ms
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    super::history::unhex(s)
}

#[cfg(test)]
mod tests {
    use super::super::history::{Cell, Event, Kind, Op, Outcome, ScopeDigest, Version};
    use super::*;
    use pangea_core::Timestamp;

    fn token(origin: &str, seq: u64, ts: u64) -> String {
        let t = Token {
            scope: "global".into(),
            origin: origin.into(),
            sequence: seq,
            timestamp: Timestamp::from_u64(ts),
        };
        super::super::history::hex(&t.encode())
    }

    fn write(id: u64, workload: &str, key: &str, value: &str, tok: &str, outcome: Outcome) -> Op {
        Op {
            id,
            workload: workload.into(),
            region: "us-east-1".into(),
            kind: Kind::Write,
            key: key.into(),
            value: Some(value.into()),
            consistency: None,
            token: Some(tok.into()),
            version: None,
            replica: Some("use1-a".into()),
            start_us: id * 10,
            end_us: id * 10 + 5,
            outcome,
            error: None,
        }
    }

    fn read(id: u64, key: &str, value: Option<(&str, u64, &str)>, tok: &str) -> Op {
        Op {
            id,
            workload: "register".into(),
            region: "eu-west-1".into(),
            kind: Kind::Read,
            key: key.into(),
            value: value.map(|v| v.0.into()),
            consistency: Some("watermark".into()),
            token: Some(tok.into()),
            version: value.map(|v| Version {
                ts: v.1,
                origin: v.2.into(),
            }),
            replica: Some("euw1-a".into()),
            start_us: id * 10,
            end_us: id * 10 + 5,
            outcome: Outcome::Ok,
            error: None,
        }
    }

    fn cell(key: &str, value: &str, ts: u64, origin: &str) -> Cell {
        Cell {
            key: key.into(),
            value: value.into(),
            version: Version {
                ts,
                origin: origin.into(),
            },
        }
    }

    fn healed(digests: &[(&str, &str)]) -> Vec<Event> {
        let mut out = vec![Event::Converged {
            ok: true,
            after_heal_ms: 1200,
            detail: String::new(),
        }];
        for (replica, d) in digests {
            out.push(Event::Audit {
                replica: (*replica).into(),
                region: "r".into(),
                rows_disallowed: 0,
                scopes: vec![ScopeDigest {
                    scope: "global".into(),
                    rows: 3,
                    digest: (*d).into(),
                }],
            });
        }
        out
    }

    /// A clean history: writes, covered reads, finals that keep everything.
    fn clean() -> Vec<Event> {
        let t1 = token("use1-a", 1, 1000);
        let t2 = token("euw1-a", 1, 2000);
        let t3 = token("use1-a", 2, 3000);
        let mut events = vec![
            Event::Op(write(1, "register", "reg/0", "a", &t1, Outcome::Ok)),
            Event::Op(write(2, "register", "reg/0", "b", &t2, Outcome::Ok)),
            Event::Op(read(3, "reg/0", Some(("b", 2000, "euw1-a")), &t2)),
            Event::Op(read(4, "reg/0", Some(("b", 2000, "euw1-a")), &t1)),
            Event::Op(write(5, "set", "set/x", "x", &t3, Outcome::Ok)),
            Event::Op(write(6, "set", "set/y", "y", "", Outcome::Info)),
        ];
        for r in ["use1-a", "euw1-a"] {
            events.push(Event::Final {
                replica: r.into(),
                prefix: "reg/".into(),
                rows: vec![cell("reg/0", "b", 2000, "euw1-a")],
            });
            events.push(Event::Final {
                replica: r.into(),
                prefix: "set/".into(),
                rows: vec![cell("set/x", "x", 3000, "use1-a")],
            });
        }
        events.extend(healed(&[("use1-a", "ab"), ("euw1-a", "ab")]));
        events
    }

    #[test]
    fn a_clean_history_passes_and_is_counted() {
        let r = check(&clean());
        assert_eq!(r.violations, vec![]);
        assert_eq!(r.ops["register write"].ok, 2);
        assert_eq!(r.ops["register read"].ok, 2);
        assert_eq!(r.ops["set write"].info, 1);
        assert_eq!(r.convergence_ms, Some(1200));
    }

    fn only(events: Vec<Event>, checker: &str) -> Vec<Violation> {
        let r = check(&events);
        assert!(!r.violations.is_empty(), "expected a {checker} violation");
        for v in &r.violations {
            assert_eq!(v.checker, checker, "{v:?}");
        }
        r.violations
    }

    #[test]
    fn a_watermark_read_below_its_token_is_a_c4_violation() {
        let mut events = clean();
        let t2 = token("euw1-a", 1, 2000);
        events.insert(
            2,
            Event::Op(read(7, "reg/0", Some(("a", 1000, "use1-a")), &t2)),
        );
        let v = only(events, "C4");
        assert_eq!(v[0].ops, vec![7, 2]);
        assert!(
            v[0].message.contains("older than its token"),
            "{}",
            v[0].message
        );
        // An absent row under a token is one too.
        let mut events = clean();
        events.insert(2, Event::Op(read(8, "reg/0", None, &t2)));
        assert!(only(events, "C4")[0].message.contains("found no row"));
    }

    #[test]
    fn a_lost_acknowledged_write_is_a_c1_violation() {
        // The register ends at the older value on one replica.
        let mut events = clean();
        if let Event::Final { rows, .. } = &mut events[6] {
            rows[0] = cell("reg/0", "a", 1000, "use1-a");
        }
        let v = only(events, "C1");
        assert_eq!(v[0].ops, vec![2]);
        assert!(v[0].message.contains("loses acknowledged write 2"));
        // A set member is missing on one replica.
        let mut events = clean();
        if let Event::Final { rows, .. } = &mut events[9] {
            rows.clear();
        }
        let v = only(events, "C1");
        assert!(
            v[0].message.contains("missing on euw1-a"),
            "{}",
            v[0].message
        );
        // A value nobody wrote.
        let mut events = clean();
        if let Event::Final { rows, .. } = &mut events[9] {
            rows.push(cell("set/z", "z", 1, "use1-b"));
        }
        assert!(
            only(events, "C1")[0]
                .message
                .contains("which no operation wrote")
        );
        // Two acknowledged writes with one sequence number.
        let mut events = clean();
        let t1 = token("use1-a", 1, 1000);
        events.insert(
            0,
            Event::Op(write(9, "set", "set/w", "w", &t1, Outcome::Ok)),
        );
        let v = check(&events).violations;
        assert!(
            v.iter()
                .any(|v| v.message.contains("both carry sequence 1")),
            "{v:?}"
        );
    }

    #[test]
    fn divergent_digests_no_convergence_and_residency_breaches_are_reported() {
        let mut events = clean();
        events.truncate(events.len() - 3);
        events.extend(healed(&[("use1-a", "ab"), ("euw1-a", "cd")]));
        assert!(only(events, "C5")[0].message.contains("replicas disagree"));

        let mut events = clean();
        events.retain(|e| !matches!(e, Event::Converged { .. }));
        assert!(only(events, "C5")[0].message.contains("no convergence"));

        let mut events = clean();
        if let Some(Event::Audit {
            rows_disallowed, ..
        }) = events.last_mut()
        {
            *rows_disallowed = 4;
        }
        assert!(
            only(events, "residency")[0]
                .message
                .contains("holds 4 rows")
        );
    }

    #[test]
    fn a_write_missing_from_every_change_stream_is_a_c9_violation() {
        // Consumers took their cursors at 5 µs; writes 1, 2 and 5 began after.
        let stream = |names: &[(&str, u64)]| Event::Changes {
            region: "us-east-1".into(),
            at_us: 100,
            names: names
                .iter()
                .map(|(o, q)| ("global".to_owned(), (*o).to_owned(), *q))
                .collect(),
        };
        let from = Event::ChangesFrom {
            region: "us-east-1".into(),
            at_us: 5,
        };
        let mut events = clean();
        events.push(from.clone());
        // Every acknowledged write seen, one of them twice (at least once).
        events.push(stream(&[("use1-a", 1), ("euw1-a", 1), ("use1-a", 1)]));
        events.push(stream(&[("use1-a", 2)]));
        assert_eq!(check(&events).violations, vec![]);
        // One missing.
        let mut events = clean();
        events.push(from.clone());
        events.push(stream(&[("use1-a", 1), ("use1-a", 2)]));
        let v = only(events, "C9");
        assert_eq!(v[0].ops, vec![2]);
        assert!(v[0].message.contains("euw1-a#1"), "{}", v[0].message);
        // Going back within an origin.
        let mut events = clean();
        events.push(from);
        events.push(stream(&[("euw1-a", 1), ("use1-a", 2), ("use1-a", 1)]));
        assert!(only(events, "C9")[0].message.contains("went back"));
        // Without consumers, nothing is required.
        assert_eq!(check(&clean()).violations, vec![]);
    }

    #[test]
    fn a_backup_that_lacks_a_write_below_its_cut_is_a_c10_violation() {
        let backup = |cut: &[(&str, u64)]| Event::Backup {
            id: 100,
            region: "us-east-1".into(),
            start_us: 0,
            end_us: 1,
            ok: true,
            error: None,
            failovers: 0,
            cut: cut
                .iter()
                .map(|(o, q)| ("global".to_owned(), (*o).to_owned(), *q))
                .collect(),
            held: cut
                .iter()
                .map(|(o, q)| ("global".to_owned(), (*o).to_owned(), *q))
                .collect(),
        };
        let rows = |cells: Vec<Cell>| Event::BackupRows {
            id: 100,
            rows: cells,
        };
        // The cut covers use1-a#1 and euw1-a#1, not use1-a#2 (set/x).
        let cut = [("use1-a", 1), ("euw1-a", 1)];
        let mut events = clean();
        events.push(backup(&cut));
        events.push(rows(vec![cell("reg/0", "b", 2000, "euw1-a")]));
        assert_eq!(check(&events).violations, vec![]);
        // The register's newest write below the cut is missing.
        let mut events = clean();
        events.push(backup(&cut));
        events.push(rows(vec![cell("reg/0", "a", 1000, "use1-a")]));
        let v = only(events, "C10");
        assert_eq!(v[0].ops, vec![2]);
        // A unique key past the cut is in it.
        let mut events = clean();
        events.push(backup(&cut));
        events.push(rows(vec![
            cell("reg/0", "b", 2000, "euw1-a"),
            cell("set/x", "x", 3000, "use1-a"),
        ]));
        assert!(only(events, "C10")[0].message.contains("past the cut"));
        // A scope that is not exact is held to its start only: set/x (use1-a#2)
        // below the cut but above the start may be missing.
        let mut events = clean();
        let mut inexact = backup(&[("use1-a", 2), ("euw1-a", 1)]);
        if let Event::Backup { held, .. } = &mut inexact {
            held[0].2 = 1;
        }
        events.push(inexact);
        events.push(rows(vec![cell("reg/0", "b", 2000, "euw1-a")]));
        assert_eq!(check(&events).violations, vec![]);
        // Backups tried, none completed.
        let mut events = clean();
        events.push(Event::Backup {
            id: 101,
            region: "us-east-1".into(),
            start_us: 0,
            end_us: 1,
            ok: false,
            error: Some("unavailable".into()),
            failovers: 2,
            cut: vec![],
            held: vec![],
        });
        assert!(only(events, "C10")[0].message.contains("no backup"));
    }
}
