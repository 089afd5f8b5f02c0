//! A read's requests in flight, driven by `pangea_core::frontend::call::ReadCall`:
//! it decides whom to ask when (the first, a hedge after a delay, failover on
//! errors, for watermark reads a race of the origin and every replica known to
//! cover the token once the first says "not covered"); this sends, times, traces
//! and learns round trips.

use super::*;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use pangea_core::frontend::call::{self, Action, Outcome, ReadCall, Reply};
use std::pin::Pin;
use std::task::{Context, Poll};

struct Answer {
    /// Index into `asked`.
    index: usize,
    candidate: Candidate,
    result: Result<(pb::client_response::Response, Served), Error>,
}

/// A request sent: to whom, its span (closed once its answer is in,
/// or when the call stops waiting for it), and its error if it failed.
struct Asked {
    replica: ReplicaId,
    span: tracing::Span,
    error: Option<Error>,
}

/// A request in flight: the call's attempt `index` (`Asked` names its replica).
struct Flight {
    index: usize,
    answer: Pin<Box<dyn Future<Output = Answer> + Send>>,
}

impl Future for Flight {
    type Output = Answer;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        self.answer.as_mut().poll(cx)
    }
}

/// The requests of one call in flight: one held on its own, any more (hedges,
/// fallbacks) in a `FuturesUnordered`, made only when a second goes out. Most
/// reads send one request, and the set's allocations and wake-up queue were a
/// few % of a 1 KiB get's client CPU.
#[derive(Default)]
struct Attempts {
    one: Option<Flight>,
    more: Option<FuturesUnordered<Flight>>,
}

impl Attempts {
    fn push(&mut self, flight: Flight) {
        if self.one.is_none() {
            self.one = Some(flight);
        } else {
            self.more
                .get_or_insert_with(FuturesUnordered::new)
                .push(flight);
        }
    }

    fn is_empty(&self) -> bool {
        self.one.is_none() && self.more.as_ref().is_none_or(|m| m.is_empty())
    }

    /// The next answer; `None` once nothing is in flight.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Answer>> {
        if let Some(flight) = &mut self.one
            && let Poll::Ready(o) = Pin::new(flight).poll(cx)
        {
            self.one = None;
            return Poll::Ready(Some(o));
        }
        if let Some(more) = &mut self.more
            && let Poll::Ready(Some(o)) = more.poll_next_unpin(cx)
        {
            return Poll::Ready(Some(o));
        }
        if self.is_empty() {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    fn into_flights(self) -> impl Iterator<Item = Flight> {
        self.one.into_iter().chain(self.more.into_iter().flatten())
    }
}

/// The call is over: applies what it learned ([`call::Lesson`], the rules the
/// simulator's frontends apply too). Requests it says to follow finish in the
/// background until their time is up (their answer teaches the round trip in
/// [`Inner::ask`]; their silence, [`Inner::no_answer`]).
fn learn(
    inner: &Arc<Inner>,
    call: &mut ReadCall<std::vec::IntoIter<Candidate>>,
    asked: &[Asked],
    set: Attempts,
) {
    let mut follow: Vec<(usize, Instant, Duration)> = Vec::new();
    let lessons: Vec<_> = call.lessons().collect();
    for lesson in lessons {
        match lesson {
            call::Lesson::Follow { attempt, until_us } => {
                let since_us = call.attempt(attempt).since_us;
                let waited = Duration::from_micros(until_us.saturating_sub(since_us));
                follow.push((attempt, inner.instant(until_us), waited));
            }
            _ => {
                if let Some(a) = asked.get(lesson.attempt()) {
                    inner.learn(&a.replica, lesson);
                }
            }
        }
    }
    for flight in set.into_flights() {
        let Some(&(_, until, waited)) = follow.iter().find(|f| f.0 == flight.index) else {
            continue;
        };
        let Some(replica) = asked.get(flight.index).map(|a| a.replica.clone()) else {
            continue;
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            if tokio::time::timeout_at(until.into(), flight).await.is_err() {
                inner.no_answer(&replica, waited);
            }
        });
    }
}

/// The call is over: requests still out are no longer waited for.
fn cancel_rest(asked: &mut [Asked]) {
    for a in asked {
        let span = std::mem::replace(&mut a.span, tracing::Span::none());
        if !span.is_none() {
            trace::cancel_attempt(span);
        }
    }
}

/// How the call's state machine sees an answer.
pub(crate) fn reply_of<T>(result: &Result<T, Error>) -> Reply {
    match result {
        Ok(_) => Reply::Served,
        Err(Error::NotCovered { .. }) => Reply::NotCovered,
        // The replica stopped waiting for a write: as for a deadline, its outcome
        // is unknown.
        Err(Error::DeadlineExceeded { .. } | Error::Ambiguous { .. }) => Reply::DeadlineExceeded,
        Err(Error::Lost { .. }) => Reply::Lost,
        Err(e) if e.is_retryable() => Reply::Retryable,
        Err(_) => Reply::Final,
    }
}

/// Runs one read's plan, from `started` (when it was planned) to the answer or
/// the deadline of `opts`: a tokio driver of `pangea_core::frontend::call::ReadCall`,
/// which takes every decision (the simulator's frontends drive the same type).
/// `d` is the deployment the plan was made on (the attempts' spans name their
/// replicas' regions from it).
///
/// One timer serves the call: it wakes the loop when the call asks to be woken
/// (the hedge, a watermark retry or the deadline). Requests carry no timeout of
/// their own while the call waits for them (a timer each, set and cancelled per
/// read, was a measurable share of a 1 KiB get); those it stops waiting for get
/// one when it ends ([`learn`]).
#[allow(clippy::too_many_arguments)] // the call's parts, each needed once
pub(crate) async fn run(
    inner: &Arc<Inner>,
    d: &Deployment,
    plan: pangea_core::read::ReadPlan,
    body: &Arc<pb::ClientRequest>,
    started: Instant,
    opts: &ReadOptions,
    traced: &Traced,
    record: bool,
) -> Result<Response<pb::client_response::Response>, Error> {
    let deadline = opts.deadline;
    let hedge_after = |first: Option<&Candidate>| {
        let rtt = first.and_then(|c| inner.rtt_ms.get(&c.replica).map(|e| *e));
        let policy = opts.hedge.as_ref();
        call::hedge_delay(
            &mut inner.hedger(),
            policy,
            &opts.consistency,
            deadline,
            rtt,
        )
    };
    let (primary, fallback, now) = (plan.primary.into_iter(), plan.fallback, inner.us(started));
    let mut call = if record {
        ReadCall::recorded(
            primary,
            fallback,
            &opts.consistency,
            now,
            deadline,
            hedge_after,
        )
    } else {
        ReadCall::new(
            primary,
            fallback,
            &opts.consistency,
            now,
            deadline,
            hedge_after,
        )
    };
    let result = drive(inner, d, &mut call, body, started, opts, traced).await;
    if let Some(log) = call.log() {
        inner.recorder.keep(log.clone());
    }
    result
}

/// [`run`]'s loop: does what `call` asks until it ends.
#[allow(clippy::too_many_arguments)] // the call's parts, each needed once
async fn drive(
    inner: &Arc<Inner>,
    d: &Deployment,
    call: &mut ReadCall<std::vec::IntoIter<Candidate>>,
    body: &Arc<pb::ClientRequest>,
    started: Instant,
    opts: &ReadOptions,
    traced: &Traced,
) -> Result<Response<pb::client_response::Response>, Error> {
    let deadline = opts.deadline;
    let deadline_at = deadline_after(started, deadline);
    // The attempts race inside this task (no task spawned per attempt, which
    // was 5 % of a client's CPU on 1 KiB reads); the losers are handed to the
    // runtime once the race is decided, to finish in the background.
    let mut set = Attempts::default();
    // Who has been asked, in the call's attempt order (the call's lessons name
    // attempts: [`learn`]).
    let mut asked: Vec<Asked> = Vec::new();
    let timer = tokio::time::sleep_until(deadline_at.into());
    tokio::pin!(timer);
    let outcome = loop {
        while let Some(action) = call.poll_action() {
            match action {
                Action::FallbackRace => {
                    inner.stats.not_covered.fetch_add(1, Ordering::Relaxed);
                }
                Action::Send(n) => {
                    let a = call.attempt(n);
                    let counter = match a.kind {
                        AttemptKind::Failover => Some(&inner.stats.failovers),
                        AttemptKind::Hedge => Some(&inner.stats.hedges),
                        AttemptKind::Fallback => Some(&inner.stats.fallbacks),
                        AttemptKind::Primary | AttemptKind::Retry => None,
                    };
                    if let Some(c) = counter {
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                    let since = if n == 0 {
                        started
                    } else {
                        inner.instant(a.since_us)
                    };
                    launch(
                        inner,
                        d,
                        body,
                        traced,
                        &mut set,
                        &mut asked,
                        n,
                        a,
                        since,
                        deadline_at,
                    );
                }
            }
        }
        if let Some(outcome) = call.outcome() {
            break outcome;
        }
        // A hedge already due fires now (the timer is then in the past): one the
        // loop was too busy with answers to send is late, not dropped.
        let wake = call
            .poll_timeout()
            .map_or(deadline_at, |t| inner.instant(t).min(deadline_at));
        if timer.deadline() != wake.into() {
            timer.as_mut().reset(wake.into());
        }
        tokio::select! {
            biased;
            done = std::future::poll_fn(|cx| set.poll_next(cx)), if !set.is_empty() => {
                let Some(o) = done else { continue };
                let a = &mut asked[o.index];
                trace::finish_attempt(std::mem::replace(&mut a.span, tracing::Span::none()), &o.result);
                let at = match &o.result {
                    Ok((_, served)) => served.at,
                    Err(_) => Instant::now(),
                };
                call.handle_reply(inner.us(at), o.index, reply_of(&o.result));
                match o.result {
                    Ok((resp, served)) => {
                        if let Some(Outcome::Served { attempt, reason }) = call.outcome()
                            && attempt == o.index
                        {
                            learn(inner, call, &asked, set);
                            cancel_rest(&mut asked);
                            return Ok(Response {
                                value: resp,
                                replica: o.candidate.replica,
                                region: served.region,
                                reason,
                                watermarks: served.watermarks,
                                latency: served.at.saturating_duration_since(started),
                                attempts: asked.len() as u32,
                            });
                        }
                    }
                    Err(e) => asked[o.index].error = Some(e),
                }
            }
            () = &mut timer => {
                let now = inner.us(Instant::now());
                call.handle_timeout(now, &mut *inner.hedger());
            }
        }
    };
    let attempts = asked.len() as u32;
    let mut error_of = |n: usize| {
        asked
            .get_mut(n)
            .and_then(|a| a.error.take())
            .unwrap_or_else(|| Error::Internal(format!("attempt {n} has no error")))
    };
    let error = match outcome {
        Outcome::Failed { attempt } => {
            let e = error_of(attempt);
            learn(inner, call, &asked, set);
            cancel_rest(&mut asked);
            return Err(e);
        }
        Outcome::NoCandidate => return Err(Error::Unavailable("no replica to ask".into())),
        Outcome::NotCovered { attempt } => match error_of(attempt) {
            Error::NotCovered {
                replica, detail, ..
            } => Error::NotCovered {
                replica,
                detail,
                deadline_passed: true,
            },
            e => e,
        },
        // Reads are never ambiguous (only a `WriteCall` ends so).
        Outcome::LastError { attempt } | Outcome::Ambiguous { attempt } => error_of(attempt),
        Outcome::DeadlineExceeded | Outcome::Served { .. } => {
            Error::DeadlineExceeded { deadline, attempts }
        }
    };
    learn(inner, call, &asked, set);
    cancel_rest(&mut asked);
    Err(error)
}

/// Sends attempt `n` of a call, `a`, at `since`.
#[allow(clippy::too_many_arguments)] // the call's parts, each needed once
fn launch(
    inner: &Arc<Inner>,
    d: &Deployment,
    body: &Arc<pb::ClientRequest>,
    traced: &Traced,
    set: &mut Attempts,
    asked: &mut Vec<Asked>,
    n: usize,
    a: &call::Attempt,
    since: Instant,
    deadline_at: Instant,
) {
    let c = a.candidate.clone();
    let span = traced.attempt(d, &c, a.kind);
    let traceparent = trace::traceparent(&span);
    debug_assert_eq!(n, asked.len(), "attempts are sent in order");
    asked.push(Asked {
        replica: c.replica.clone(),
        span,
        error: None,
    });
    let inner = inner.clone();
    let body = Arc::clone(body);
    let answer = Box::pin(async move {
        let sent = crate::transport::Sent::until(deadline_at, since);
        let result = inner
            .ask(&c, &body, since, deadline_at, traceparent, &sent)
            .await;
        Answer {
            index: n,
            candidate: c,
            result,
        }
    });
    set.push(Flight { index: n, answer });
}
