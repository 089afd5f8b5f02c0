//! Batch writes (`MutateRows`, as Bigtable's): many rows in one request per
//! replica, each row atomic, the batch not.
//!
//! Each row goes where [`Client::mutate`] would send it alone (the nearest replica
//! its placement allows, or its affinity replica), so a batch is one request per
//! replica it touches and [`BATCH_ROWS_MAX`] rows (or [`BATCH_BYTES_MAX`] bytes),
//! replicas concurrently, one replica's requests in order. A row that was certainly not applied for a passing reason
//! (its replica refused writes or could not be reached; stale location metadata)
//! is planned again and sent in the next round, away from the replicas that
//! refused it, at most [`ROUNDS_MAX`] rounds within the call's deadline. A row
//! whose outcome is unknown (the answer never came) is not sent again, unless
//! [`WriteOptions::resend_if_unknown`] says that is harmless and it carries no
//! increment, as for a single write.

use crate::trace::{AttemptKind, Op, Traced};
use crate::{Ack, Reason, RowMutation, Token, WriteOptions};
use crate::{Client, Error, Response};
use pangea_core::read::Candidate;
use pangea_proto::v1 as pb;
use pangea_topology::ReplicaId;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tracing::Instrument as _;

/// Most rows in one request: the replicas' default batch limit
/// (`pangea_core::Limits::batch_rows_max`).
pub const BATCH_ROWS_MAX: usize = 1_000;
/// Most encoded bytes of rows in one request (well inside a 17 MiB frame); a
/// single row larger than this goes in a request of its own.
pub const BATCH_BYTES_MAX: usize = 4 << 20;
/// Less time left than this, a request is not sent (a replica reads a budget of
/// 0 as its default).
const BUDGET_MIN: Duration = Duration::from_millis(1);
/// Rounds of a batch call: the first, and resends of rows not applied.
pub(crate) const ROUNDS_MAX: u32 = 3;

/// What became of one row of a round.
enum Fate {
    Done(Result<Response<Token>, Error>),
    /// Not applied for a reason that may pass (or, `unknown`, perhaps applied and
    /// harmless to apply again): plan and send it again, not to `avoid`;
    /// `refresh`: the replica said the row is not its to write (location metadata
    /// may be stale).
    Again {
        error: Error,
        avoid: Option<ReplicaId>,
        refresh: bool,
        /// Its outcome there is unknown (sent again only with
        /// `resend_if_unknown`, to the same replica, behind the first copy).
        unknown: bool,
    },
}

impl Client {
    /// Writes many rows, each atomically, the batch not (Bigtable's MutateRows):
    /// one request per replica the rows go to (see the module docs), one result
    /// per row in `rows`' order, each applied row with its own token (rows of one
    /// batch may belong to different placement scopes, each its own origin
    /// stream, and a later read may demand any one row).
    ///
    /// A key given twice is applied in the order given (both go to one replica,
    /// whose requests are sent one after the other); a row sent again in a later
    /// round may land after a later row of its key: give a key once per call
    /// when order matters (the bulk loader does).
    pub async fn mutate_rows(
        &self,
        rows: Vec<RowMutation>,
        opts: &WriteOptions,
    ) -> Vec<Result<Response<Token>, Error>> {
        let Some(first) = rows.first() else {
            return Vec::new();
        };
        let traced = Traced::call(
            Op::MutateRows,
            first.table(),
            first.row_key(),
            rows.len(),
            "none",
        );
        let results = self
            .mutate_rows_traced(&rows, opts, &traced)
            .instrument(traced.span.clone())
            .await;
        traced.finish_batch(&results);
        results
    }

    async fn mutate_rows_traced(
        &self,
        rows: &[RowMutation],
        opts: &WriteOptions,
        traced: &Traced,
    ) -> Vec<Result<Response<Token>, Error>> {
        let started = Instant::now();
        let deadline = opts.deadline_or_default();
        let mut results: Vec<Option<Result<Response<Token>, Error>>> =
            rows.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..rows.len()).collect();
        // Replicas each row must not be sent to again.
        let mut avoid: BTreeMap<usize, BTreeSet<ReplicaId>> = BTreeMap::new();
        let mut last_error: BTreeMap<usize, Error> = BTreeMap::new();
        // Rows whose outcome was unknown at some replica: they fail as Ambiguous.
        let mut unknown_at: BTreeMap<usize, ReplicaId> = BTreeMap::new();
        // Why each row went where it went.
        let mut reasons: BTreeMap<usize, Reason> = BTreeMap::new();
        for round in 0..ROUNDS_MAX {
            if todo.is_empty() || started.elapsed() >= deadline {
                break;
            }
            let cur = self.inner.current();
            // Rows by table and the replica that takes them, in input order.
            let mut to: BTreeMap<(&str, ReplicaId), (Candidate, Vec<usize>)> = BTreeMap::new();
            let mut again = Vec::new();
            for i in todo.drain(..) {
                let no = avoid.get(&i);
                match self.write_plan(&cur, &rows[i], opts, started, deadline) {
                    Ok(plan) => {
                        match plan
                            .primary
                            .into_iter()
                            .find(|c| no.is_none_or(|no| !no.contains(&c.replica)))
                        {
                            Some(c) => {
                                reasons.insert(i, c.reason);
                                let at = (&**rows[i].table(), c.replica.clone());
                                to.entry(at).or_insert((c, vec![])).1.push(i);
                            }
                            None => {
                                let e = last_error.remove(&i).unwrap_or_else(|| {
                                    Error::Unavailable("no replica to write to".into())
                                });
                                results[i] = Some(Err(e));
                            }
                        }
                    }
                    // Perhaps stale location metadata: refreshed below.
                    Err(e) => {
                        last_error.insert(i, e);
                        again.push(i);
                    }
                }
            }
            let mut refresh = !again.is_empty();
            // Replicas concurrently; one replica's requests in order, so rows of
            // one key reach it in the order given.
            let per_replica = to.into_values().map(|(c, idx)| async move {
                let mut out = Vec::new();
                for chunk in chunks(rows, idx) {
                    let fates = self
                        .send_batch(&c, rows, &chunk, opts, traced, started, deadline)
                        .await;
                    out.push((c.clone(), chunk, fates));
                }
                out
            });
            let rounds = futures_util::future::join_all(per_replica).await;
            for (c, chunk, fates) in rounds.into_iter().flatten() {
                for (i, fate) in chunk.into_iter().zip(fates) {
                    match fate {
                        Fate::Done(r) => {
                            results[i] = Some(r.map(|mut w| {
                                w.reason = reasons.get(&i).copied().unwrap_or(w.reason);
                                w
                            }));
                        }
                        Fate::Again {
                            error,
                            avoid: no,
                            refresh: r,
                            unknown,
                        } => {
                            refresh |= r;
                            if let Some(no) = no {
                                avoid.entry(i).or_default().insert(no);
                            }
                            if unknown {
                                unknown_at.insert(i, c.replica.clone());
                            }
                            tracing::debug!(replica = %c.replica, round, error = %error, "row sent again");
                            last_error.insert(i, error);
                            again.push(i);
                        }
                    }
                }
            }
            again.sort_unstable();
            todo = again;
            if refresh
                && !todo.is_empty()
                && round + 1 < ROUNDS_MAX
                && !self.refresh_after_refusal(round, started, deadline).await
            {
                break;
            }
        }
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let r = r.unwrap_or_else(|| {
                    Err(last_error.remove(&i).unwrap_or(Error::DeadlineExceeded {
                        deadline,
                        attempts: ROUNDS_MAX,
                    }))
                });
                match (r, unknown_at.remove(&i)) {
                    // Not applied later does not make the unknown attempt unapplied.
                    (Err(e), Some(at)) if !matches!(e, Error::Ambiguous { .. }) => {
                        Err(Error::Ambiguous {
                            replica: at.to_string(),
                            detail: format!(
                                "an attempt's outcome is unknown; the last failed: {e}"
                            ),
                        })
                    }
                    (r, _) => r,
                }
            })
            .collect()
    }

    /// One request of rows `chunk` (indices into `rows`) to `c`: each row's fate.
    #[allow(clippy::too_many_arguments)]
    async fn send_batch(
        &self,
        c: &Candidate,
        rows: &[RowMutation],
        chunk: &[usize],
        opts: &WriteOptions,
        traced: &Traced,
        started: Instant,
        deadline: Duration,
    ) -> Vec<Fate> {
        let body = pb::client_request::Request::MutateRows(pb::MutateRowsRequest {
            table: rows[chunk[0]].table().to_string(),
            rows: chunk
                .iter()
                .map(|&i| {
                    let mut m = rows[i].to_proto();
                    // The request's table stands for every row's.
                    m.table.clear();
                    m
                })
                .collect(),
            wait_regions: match opts.ack {
                Ack::Regions(n) => n,
                _ => 0,
            },
            wait_all_regions: opts.ack == Ack::AllRegions,
        });
        // The replica answers a little before the budget; the call waits a
        // little past it for that answer.
        let budget = deadline.saturating_sub(started.elapsed());
        if budget < BUDGET_MIN {
            // Not sent: certainly not applied.
            let e = Error::DeadlineExceeded {
                deadline,
                attempts: 1,
            };
            return chunk.iter().map(|_| Fate::Done(Err(e.clone()))).collect();
        }
        let wait = budget + (budget / 10).min(Duration::from_millis(100));
        let d = self.inner.current().deployment.clone();
        let span = traced.attempt(&d, c, AttemptKind::Primary);
        let answer = self
            .inner
            .attempt(
                c,
                &self.inner.request_body(body),
                (budget, wait),
                crate::trace::traceparent(&span),
            )
            .await;
        let answer = answer.unwrap_or_else(|| {
            Err(Error::Ambiguous {
                replica: c.replica.to_string(),
                detail: format!("no answer within {} ms", wait.as_millis()),
            })
        });
        crate::trace::finish_attempt(span, &answer);
        let unknown = |i: usize, e: Error| -> Fate {
            // Unknown outcome: sent again only if applying it twice is harmless.
            if crate::may_resend(opts, &rows[i]) {
                // To the same replica (unless it is found down): behind the first
                // copy in its queue, so a later row of the key is not overtaken.
                Fate::Again {
                    error: e,
                    avoid: None,
                    refresh: false,
                    unknown: true,
                }
            } else {
                Fate::Done(Err(e))
            }
        };
        match answer {
            Ok((pb::client_response::Response::MutateRows(r), served))
                if r.rows.len() == chunk.len() =>
            {
                let latency = started.elapsed();
                chunk
                    .iter()
                    .zip(r.rows)
                    .map(|(&i, o)| match o.error {
                        None => Fate::Done(
                            Token::decode(&o.token)
                                .map(|token| Response {
                                    value: token,
                                    replica: c.replica.clone(),
                                    region: served.region.clone(),
                                    reason: c.reason,
                                    watermarks: None,
                                    latency,
                                    attempts: 1,
                                })
                                .map_err(|e| {
                                    Error::Internal(format!("bad token from replica: {e}"))
                                }),
                        ),
                        Some(e) => match Error::from_wire(&e, &c.replica) {
                            Error::DeadlineExceeded { .. } => unknown(
                                i,
                                Error::Ambiguous {
                                    replica: c.replica.to_string(),
                                    detail: e.message,
                                },
                            ),
                            e @ Error::Unavailable(_) => Fate::Again {
                                error: e,
                                avoid: Some(c.replica.clone()),
                                refresh: false,
                                unknown: false,
                            },
                            e @ Error::PolicyForbids(_) => Fate::Again {
                                error: e,
                                avoid: None,
                                refresh: true,
                                unknown: false,
                            },
                            e => Fate::Done(Err(e)),
                        },
                    })
                    .collect()
            }
            Ok((other, _)) => {
                let e = Error::Internal(format!(
                    "replica {} answered a batch of {} rows with {other:?}",
                    c.replica,
                    chunk.len()
                ));
                // Nothing says which rows were applied.
                chunk.iter().map(|&i| unknown(i, e.clone())).collect()
            }
            // Never reached the replica, or refused whole before any row was
            // written.
            Err(e @ Error::Unavailable(_)) => chunk
                .iter()
                .map(|_| Fate::Again {
                    error: e.clone(),
                    avoid: Some(c.replica.clone()),
                    refresh: false,
                    unknown: false,
                })
                .collect(),
            Err(e @ (Error::Ambiguous { .. } | Error::Lost { .. })) => {
                chunk.iter().map(|&i| unknown(i, e.clone())).collect()
            }
            Err(e) => chunk.iter().map(|_| Fate::Done(Err(e.clone()))).collect(),
        }
    }
}

/// Rows `idx` (indices into `rows`, in order) cut into requests of at most
/// [`BATCH_ROWS_MAX`] rows and [`BATCH_BYTES_MAX`] bytes.
fn chunks(rows: &[RowMutation], idx: Vec<usize>) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for i in idx {
        // The payload and a generous allowance for framing: the limit only keeps
        // a request well inside the frame limit.
        let size = rows[i].payload_bytes() + 32 * (rows[i].mutations().len() + 1);
        match out.last_mut() {
            Some(last) if last.len() < BATCH_ROWS_MAX && bytes + size <= BATCH_BYTES_MAX => {
                last.push(i);
                bytes += size;
            }
            _ => {
                out.push(vec![i]);
                bytes = size;
            }
        }
    }
    out
}
