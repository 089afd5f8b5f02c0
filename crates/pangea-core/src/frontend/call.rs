//! One client call as a sans-IO state machine (quinn-proto style): the decisions of
//! a read or a write — whom to ask, when to hedge, fail over, race the fallbacks,
//! ask again, give up — with no clock, socket or task of its own. `pangea-client`
//! drives it on tokio; the simulator's frontends drive the same type in virtual
//! time, so a drill's reads and writes take exactly the library's decisions.
//!
//! A driver:
//! 1. builds the call from a plan ([`ReadCall::new`], [`WriteCall::new`]);
//! 2. sends what [`ReadCall::poll_action`] asks for (each [`Action::Send`] names an
//!    attempt; [`ReadCall::attempt`] says to whom and why);
//! 3. feeds back each answer ([`ReadCall::handle_reply`], classified as a
//!    [`Reply`]) and wakes the call at [`ReadCall::poll_timeout`]
//!    ([`ReadCall::handle_timeout`]);
//! 4. stops once [`ReadCall::outcome`] says how the call ended; the driver holds the
//!    answers and errors themselves and returns the one the outcome names.
//!
//! Time is microseconds on the driver's monotonic clock, as everywhere in this crate.

use super::{HedgePolicy, Hedger, gone_after};
use crate::read::{Candidate, Consistency, Reason};
use std::time::Duration;

/// Why an attempt was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    /// The first request of the call.
    Primary,
    /// A second request after the hedging delay.
    Hedge,
    /// A watermark read's request to the origin or a covering replica after the
    /// first replica said "not covered".
    Fallback,
    /// The next candidate after an error, or after the first replica of a read that
    /// may not be hedged stayed silent for several round trips.
    Failover,
    /// A watermark read asking again while nobody covers the token yet.
    Retry,
}

impl AttemptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptKind::Primary => "primary",
            AttemptKind::Hedge => "hedge",
            AttemptKind::Fallback => "fallback",
            AttemptKind::Failover => "failover",
            AttemptKind::Retry => "retry",
        }
    }
}

/// An answer, as the call needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The replica answered the request.
    Served,
    /// A watermark read the replica has not caught up with.
    NotCovered,
    /// The replica did not answer within its time (the call's deadline, or a
    /// write attempt's budget).
    DeadlineExceeded,
    /// Another error the next replica may not have (unreachable, unavailable, too
    /// stale). For a write: the replica did not apply it (a replica answers
    /// `UNAVAILABLE` to a write only then; a request that never left counts too).
    Retryable,
    /// The request went out, but its connection or stream failed before an
    /// answer: a read asks the next replica; whether a write was applied is
    /// unknown.
    Lost,
    /// An error every replica would give (invalid input, refused by policy or
    /// authorization): the call ends with it.
    Final,
}

/// What the driver should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send attempt `n` ([`ReadCall::attempt`]).
    Send(usize),
    /// A "not covered" answer started the race of the fallbacks (the `Send`s
    /// follow); for the driver's counters.
    FallbackRace,
}

/// How a call ended; the attempt named is the one whose answer or error the
/// driver returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Attempt `attempt` was answered; the call's reason is `reason`.
    Served { attempt: usize, reason: Reason },
    /// Attempt `attempt` failed with an error every replica would give.
    Failed { attempt: usize },
    /// A watermark read no replica covered before the deadline; `attempt` said so.
    NotCovered { attempt: usize },
    /// Nothing left to ask before the deadline; `attempt`'s error was the last.
    LastError { attempt: usize },
    /// The deadline passed.
    DeadlineExceeded,
    /// The plan held no replica to ask.
    NoCandidate,
    /// A write none of whose attempts was acknowledged, and of which `attempt`
    /// may have been applied (its replica stopped waiting for it, or went silent,
    /// or its connection was lost after the request went out): the caller cannot
    /// tell whether the write happened.
    Ambiguous { attempt: usize },
}

/// What a frontend learns about a replica from a request the call no longer
/// waits for: both drivers apply these to their round-trip estimates and
/// down-marks ([`super::rtt_raised`], [`super::after_silence`]), so the simulator's
/// frontends learn exactly what the library's do. Taken with
/// [`ReadCall::lessons`] / [`WriteCall::lessons`] after each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lesson {
    /// Attempt `attempt` lost the race to the answer after being out `out_us`:
    /// raise its replica's estimate toward that.
    Slower { attempt: usize, out_us: u64 },
    /// Attempt `attempt` is still out when the call ended: keep waiting for it
    /// until `until_us`, so its real latency is measured (a slow replica always
    /// beaten by a hedge would otherwise look fast forever); no answer by then is
    /// [`Lesson::NoAnswer`] for `until_us` less its [`Attempt::since_us`].
    Follow { attempt: usize, until_us: u64 },
    /// Attempt `attempt` got no answer in `waited_us`: its replica is gone, or
    /// slower than its estimate ([`super::after_silence`]).
    NoAnswer { attempt: usize, waited_us: u64 },
}

impl Lesson {
    /// The attempt it is about.
    pub fn attempt(self) -> usize {
        match self {
            Lesson::Slower { attempt, .. }
            | Lesson::Follow { attempt, .. }
            | Lesson::NoAnswer { attempt, .. } => attempt,
        }
    }
}

/// One request sent, or about to be.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub candidate: Candidate,
    pub kind: AttemptKind,
    /// When it was (to be) sent.
    pub since_us: u64,
    /// When the call stops waiting for it: the call's deadline, or a write
    /// attempt's budget.
    pub until_us: u64,
    /// Its answer is in.
    pub done: bool,
}

/// When to hedge a read (`None` without a hedge policy; earns the read's share of
/// the hedge budget), or for a read that may not be hedged, when to take its first
/// replica for gone and fail over — with or without a hedge policy, since that is
/// no hedge: the first request is no longer waited for. That is [`gone_after`] its
/// round trip, but no later than leaves the next replica two such round trips and
/// 2 ms before the deadline (and never before half the deadline): a silent replica
/// would otherwise spend every such read's deadline (`gone_after` is 20 ms and
/// more), and a replica merely slow — a request lost once and sent again 10 ms
/// later — still answers, at the replica that has the caller's write.
/// `first_rtt_ms`: the first candidate's measured round trip.
pub fn hedge_delay(
    hedger: &mut Hedger,
    policy: Option<&HedgePolicy>,
    consistency: &Consistency,
    deadline: Duration,
    first_rtt_ms: Option<f64>,
) -> Option<Duration> {
    if consistency.may_hedge() {
        Some(hedger.delay(policy?, deadline))
    } else {
        let spare = first_rtt_ms.map_or(deadline, |rtt| {
            Duration::from_micros(((2.0 * rtt.min(1e9) + 2.0) * 1_000.0).ceil() as u64)
        });
        let latest = deadline.saturating_sub(spare).max(deadline / 2);
        Some(gone_after(first_rtt_ms).min(latest))
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One read: ask the first candidate; hedge to the next after the hedging delay
/// (within the budget); fail over on errors; for a watermark read, once the first
/// answer is "not covered", race the origin and every replica known to cover the
/// token, and while nobody does, ask them again every [`WATERMARK_RETRY`] until the
/// deadline.
///
/// `P`: the plan's primary candidates in order, taken as needed.
#[derive(Debug)]
pub struct ReadCall<P> {
    primary: P,
    fallback: Vec<Candidate>,
    /// Watermark reads that found no covered replica ask these again: the
    /// fallbacks and the first replica asked.
    retry_set: Vec<Candidate>,
    watermark: bool,
    may_hedge: bool,
    deadline_at: u64,
    hedge_at: Option<u64>,
    retry_at: Option<u64>,
    attempts: Vec<Attempt>,
    /// Attempts from here on are not yet handed to the driver.
    unsent: usize,
    outstanding: usize,
    raced_fallback: bool,
    race_note: bool,
    /// The error the call returns if nothing better comes: the attempt that gave
    /// it, and what it was.
    last_err: Option<(usize, Reply)>,
    outcome: Option<Outcome>,
    /// Learned and not yet taken ([`ReadCall::lessons`]).
    lessons: Vec<Lesson>,
    /// What this call was told and decided, when recorded ([`ReadCall::recorded`]).
    log: Option<Box<ReadLog>>,
}

/// The pause before a watermark read nobody covers asks again.
pub const WATERMARK_RETRY: Duration = Duration::from_millis(10);

impl<P: Iterator<Item = Candidate>> ReadCall<P> {
    /// A read planned at `now_us` with `primary` and `fallback` candidates, ending
    /// at the latest `deadline` later. `hedge_after`, told the first candidate,
    /// says when to hedge ([`hedge_delay`]).
    pub fn new(
        primary: P,
        fallback: Vec<Candidate>,
        consistency: &Consistency,
        now_us: u64,
        deadline: Duration,
        hedge_after: impl FnOnce(Option<&Candidate>) -> Option<Duration>,
    ) -> Self {
        Self::build(
            primary,
            fallback,
            consistency,
            now_us,
            deadline,
            hedge_after,
            false,
        )
    }

    /// [`Self::new`], keeping a [`ReadLog`] of what the call is told and decides
    /// ([`Self::log`]): a driver's record of one call, which [`ReadLog::replay`]
    /// runs again without the driver.
    pub fn recorded(
        primary: P,
        fallback: Vec<Candidate>,
        consistency: &Consistency,
        now_us: u64,
        deadline: Duration,
        hedge_after: impl FnOnce(Option<&Candidate>) -> Option<Duration>,
    ) -> Self {
        Self::build(
            primary,
            fallback,
            consistency,
            now_us,
            deadline,
            hedge_after,
            true,
        )
    }

    fn build(
        mut primary: P,
        fallback: Vec<Candidate>,
        consistency: &Consistency,
        now_us: u64,
        deadline: Duration,
        hedge_after: impl FnOnce(Option<&Candidate>) -> Option<Duration>,
        record: bool,
    ) -> Self {
        let watermark = matches!(consistency, Consistency::Watermark(_));
        let first = primary.next();
        let hedge_after = hedge_after(first.as_ref());
        let log = record.then(|| {
            Box::new(ReadLog {
                primary: first.iter().cloned().collect(),
                fallback: fallback.clone(),
                consistency: consistency.clone(),
                start_us: now_us,
                deadline,
                hedge_after,
                steps: Vec::new(),
            })
        });
        let mut retry_set = Vec::new();
        if watermark {
            retry_set.clone_from(&fallback);
            if let Some(f) = &first
                && !retry_set.iter().any(|c| c.replica == f.replica)
            {
                retry_set.push(f.clone());
            }
        }
        let deadline_at = now_us.saturating_add(micros(deadline));
        let mut call = ReadCall {
            primary,
            fallback,
            retry_set,
            watermark,
            may_hedge: consistency.may_hedge(),
            deadline_at,
            hedge_at: hedge_after.map(|h| now_us.saturating_add(micros(h))),
            retry_at: None,
            attempts: Vec::new(),
            unsent: 0,
            outstanding: 0,
            raced_fallback: false,
            race_note: false,
            last_err: None,
            outcome: None,
            lessons: Vec::new(),
            log,
        };
        match first {
            Some(c) => call.launch(c, AttemptKind::Primary, now_us),
            None => call.finish(now_us, Outcome::NoCandidate),
        }
        call
    }

    /// The next primary candidate (recorded, when the call is).
    fn next_primary(&mut self) -> Option<Candidate> {
        let c = self.primary.next();
        if let (Some(log), Some(c)) = (&mut self.log, &c) {
            log.primary.push(c.clone());
        }
        c
    }

    fn note(&mut self, step: Step) {
        if let Some(log) = &mut self.log {
            log.steps.push(step);
        }
    }

    /// The record of this call, if it is recorded ([`Self::recorded`]).
    pub fn log(&self) -> Option<&ReadLog> {
        self.log.as_deref()
    }

    fn launch(&mut self, candidate: Candidate, kind: AttemptKind, now_us: u64) {
        self.attempts.push(Attempt {
            candidate,
            kind,
            since_us: now_us,
            until_us: self.deadline_at,
            done: false,
        });
        self.outstanding += 1;
    }

    /// The next thing to do, until none is left.
    pub fn poll_action(&mut self) -> Option<Action> {
        if self.outcome.is_some() {
            return None;
        }
        let action = if std::mem::take(&mut self.race_note) {
            Action::FallbackRace
        } else if self.unsent < self.attempts.len() {
            self.unsent += 1;
            Action::Send(self.unsent - 1)
        } else {
            return None;
        };
        if self.log.is_some() {
            let step = match action {
                Action::Send(n) => {
                    let a = &self.attempts[n];
                    Step::Send {
                        attempt: n,
                        replica: a.candidate.replica.clone(),
                        kind: a.kind,
                    }
                }
                Action::FallbackRace => Step::FallbackRace,
            };
            self.note(step);
        }
        Some(action)
    }

    /// When to call [`Self::handle_timeout`]: the hedge, a watermark retry or the
    /// deadline, whichever is next; `None` once the call is over.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.outcome.is_some() {
            return None;
        }
        let mut t = self.deadline_at;
        if let Some(h) = self.hedge_at {
            t = t.min(h);
        }
        if let Some(r) = self.retry_at {
            t = t.min(r);
        }
        Some(t)
    }

    /// Attempt `n`: to whom, why, since when.
    pub fn attempt(&self, n: usize) -> &Attempt {
        &self.attempts[n]
    }

    /// Every attempt so far.
    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    pub fn deadline_us(&self) -> u64 {
        self.deadline_at
    }

    /// How the call ended; `None` while it goes on.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Attempt `n` was answered at `now_us`.
    pub fn handle_reply(&mut self, now_us: u64, n: usize, reply: Reply) {
        if self.outcome.is_some() || self.attempts.get(n).is_none_or(|a| a.done) {
            return;
        }
        self.note(Step::Reply {
            now_us,
            attempt: n,
            reply,
        });
        self.attempts[n].done = true;
        self.outstanding -= 1;
        match reply {
            Reply::Served => {
                let a = &self.attempts[n];
                let reason = if a.kind == AttemptKind::Hedge {
                    Reason::Hedge
                } else {
                    a.candidate.reason
                };
                self.finish(now_us, Outcome::Served { attempt: n, reason });
                return;
            }
            Reply::NotCovered if self.watermark && !self.raced_fallback => {
                // Ask the origin and every replica known to cover the token, all at
                // once; the first covered answer wins.
                self.raced_fallback = true;
                self.race_note = true;
                let asked = self.attempts[n].candidate.replica.clone();
                for c in std::mem::take(&mut self.fallback) {
                    if c.replica != asked {
                        self.launch(c, AttemptKind::Fallback, now_us);
                    }
                }
                self.last_err = Some((n, reply));
            }
            Reply::DeadlineExceeded if self.last_is_not_covered() => {
                // Keep the more telling answer: nobody covered the token.
            }
            Reply::Final => {
                self.finish(now_us, Outcome::Failed { attempt: n });
                return;
            }
            Reply::NotCovered | Reply::DeadlineExceeded | Reply::Retryable | Reply::Lost => {
                // Fail over to the next candidate (for watermark reads, only
                // replicas that may cover the token).
                if !(self.watermark && self.raced_fallback)
                    && let Some(c) = self.next_primary()
                {
                    self.launch(c, AttemptKind::Failover, now_us);
                }
                self.last_err = Some((n, reply));
            }
        }
        if self.outstanding == 0 {
            if self.watermark && self.raced_fallback {
                // Nobody covers the token yet: ask again shortly, until the
                // deadline (replicas catch up in milliseconds).
                self.retry_at = Some(now_us.saturating_add(micros(WATERMARK_RETRY)));
            } else if let Some(c) = self.next_primary() {
                self.launch(c, AttemptKind::Failover, now_us);
            } else {
                self.give_up(now_us);
            }
        }
    }

    fn last_is_not_covered(&self) -> bool {
        matches!(self.last_err, Some((_, Reply::NotCovered)))
    }

    /// Time passed: `now_us` is at or past [`Self::poll_timeout`] (earlier is
    /// harmless). `hedger` grants the hedge from its budget.
    pub fn handle_timeout(&mut self, now_us: u64, hedger: &mut impl HedgeBudget) {
        if self.outcome.is_some() {
            return;
        }
        if self.log.is_some() {
            // What the budget grants is recorded where it is asked (below).
            self.note(Step::Timeout {
                now_us,
                granted: None,
            });
        }
        if now_us >= self.deadline_at {
            self.give_up(now_us);
            return;
        }
        if self.retry_at.is_some_and(|t| now_us >= t) && self.outstanding == 0 {
            self.retry_at = None;
            for c in self.retry_set.clone() {
                self.launch(c, AttemptKind::Retry, now_us);
            }
        }
        if self.hedge_at.is_some_and(|t| now_us >= t) {
            self.hedge_at = None;
            // Hedge to the next candidate; for watermark reads only to one known to
            // cover the token. (A candidate taken when the budget is spent is not
            // asked.)
            let next = if self.watermark {
                let i = self
                    .fallback
                    .iter()
                    .position(|c| c.reason == Reason::Covered);
                i.map(|i| self.fallback.remove(i))
            } else {
                self.next_primary()
            };
            if !self.may_hedge {
                // Not a hedge: the first replica looks gone (`hedge_delay`).
                if let Some(c) = next {
                    self.launch(c, AttemptKind::Failover, now_us);
                }
            } else if let Some(c) = next {
                let granted = hedger.try_spend();
                if let Some(Step::Timeout { granted: g, .. }) =
                    self.log.as_mut().and_then(|l| l.steps.last_mut())
                {
                    *g = Some(granted);
                }
                if granted {
                    self.launch(c, AttemptKind::Hedge, now_us);
                }
            }
        }
    }

    /// Nothing more to ask, or the deadline passed: the error the call returns.
    fn give_up(&mut self, now_us: u64) {
        let outcome = match self.last_err {
            Some((n, Reply::NotCovered)) if self.watermark => Outcome::NotCovered { attempt: n },
            Some((n, r)) if r != Reply::DeadlineExceeded && now_us < self.deadline_at => {
                Outcome::LastError { attempt: n }
            }
            _ => Outcome::DeadlineExceeded,
        };
        self.finish(now_us, outcome);
    }

    /// The call is over at `now_us`; attempts still out stay not `done`. What the
    /// frontend learns from them:
    /// - answered: the requests still out are followed until the deadline (their
    ///   answer or silence teaches), and every replica but the winner's was slower
    ///   than the answer took — except the first replica of a read that may not be
    ///   hedged, left after [`gone_after`] of silence: raising its estimate would
    ///   lengthen the next such wait, read after read, until one spent its
    ///   deadline on a dead connection (its silence is judged when it ends);
    /// - failed with an error every replica would give: the rest are followed;
    /// - out of time or candidates: the requests still out got no answer in
    ///   time, and every replica asked was slower than the call lasted.
    fn finish(&mut self, now_us: u64, outcome: Outcome) {
        self.outcome = Some(outcome);
        self.note(Step::Outcome(outcome));
        let out_us = |a: &Attempt| now_us.saturating_sub(a.since_us);
        match outcome {
            Outcome::NoCandidate => {}
            Outcome::Served { attempt: won, .. } => {
                let winner = self.attempts[won].candidate.replica.clone();
                for (n, a) in self.attempts.iter().enumerate() {
                    if !a.done {
                        self.lessons.push(Lesson::Follow {
                            attempt: n,
                            until_us: a.until_us,
                        });
                    }
                    let silent_first = n == 0 && !self.may_hedge && !a.done;
                    if a.candidate.replica != winner && !silent_first {
                        self.lessons.push(Lesson::Slower {
                            attempt: n,
                            out_us: out_us(a),
                        });
                    }
                }
            }
            Outcome::Failed { .. } => {
                for (n, a) in self.attempts.iter().enumerate() {
                    if !a.done {
                        self.lessons.push(Lesson::Follow {
                            attempt: n,
                            until_us: a.until_us,
                        });
                    }
                }
            }
            _ => {
                for (n, a) in self.attempts.iter().enumerate() {
                    if !a.done {
                        self.lessons.push(Lesson::NoAnswer {
                            attempt: n,
                            waited_us: a.until_us.saturating_sub(a.since_us),
                        });
                    }
                    self.lessons.push(Lesson::Slower {
                        attempt: n,
                        out_us: out_us(a),
                    });
                }
            }
        }
    }

    /// What the frontend has learned since it last asked ([`Lesson`]), in order.
    pub fn lessons(&mut self) -> std::vec::Drain<'_, Lesson> {
        self.lessons.drain(..)
    }
}

/// Grants hedges: the frontend's [`Hedger`], or a replay's record of what it granted.
pub trait HedgeBudget {
    /// Spends one hedge, if the budget has one.
    fn try_spend(&mut self) -> bool;
}

impl HedgeBudget for Hedger {
    fn try_spend(&mut self) -> bool {
        Hedger::try_spend(self)
    }
}

/// One thing a recorded call was told (`Reply`, `Timeout`) or decided (the rest).
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Reply {
        now_us: u64,
        attempt: usize,
        reply: Reply,
    },
    /// The driver woke the call; `granted`: what the hedge budget said, if asked.
    Timeout {
        now_us: u64,
        granted: Option<bool>,
    },
    Send {
        attempt: usize,
        replica: crate::ids::ReplicaId,
        kind: AttemptKind,
    },
    FallbackRace,
    Outcome(Outcome),
}

/// A read call's record: what it started from, and every step in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadLog {
    /// The primary candidates the call took, in order.
    pub primary: Vec<Candidate>,
    pub fallback: Vec<Candidate>,
    pub consistency: Consistency,
    pub start_us: u64,
    pub deadline: Duration,
    pub hedge_after: Option<Duration>,
    pub steps: Vec<Step>,
}

/// A replay's hedge budget: grants what the record says it granted, in order.
struct Granted(std::vec::IntoIter<bool>);

impl HedgeBudget for Granted {
    fn try_spend(&mut self) -> bool {
        self.0.next().unwrap_or(false)
    }
}

impl ReadLog {
    /// Runs the call again from this record's start, feeding it the recorded
    /// replies and wake-ups (and hedge grants) in order, polling it as a driver
    /// does after each: the steps it takes. Equal to [`Self::steps`] when the
    /// recording driver left every decision to the call.
    pub fn replay(&self) -> Vec<Step> {
        let hedge_after = self.hedge_after;
        let mut call = ReadCall::recorded(
            self.primary.clone().into_iter(),
            self.fallback.clone(),
            &self.consistency,
            self.start_us,
            self.deadline,
            |_| hedge_after,
        );
        let drain = |call: &mut ReadCall<_>| while call.poll_action().is_some() {};
        drain(&mut call);
        for step in &self.steps {
            match *step {
                Step::Reply {
                    now_us,
                    attempt,
                    reply,
                } => call.handle_reply(now_us, attempt, reply),
                Step::Timeout { now_us, granted } => {
                    let mut budget = Granted(granted.into_iter().collect::<Vec<_>>().into_iter());
                    call.handle_timeout(now_us, &mut budget);
                }
                _ => continue,
            }
            drain(&mut call);
        }
        call.log.map(|l| l.steps).unwrap_or_default()
    }
}

/// Candidates a write tries at most.
pub const WRITE_CANDIDATES: usize = 3;

/// How much longer than the budget it gave a write's replica the call waits for
/// its answer (at least; a tenth of the budget when that is more, within the call's
/// deadline): the replica answers at its budget at the latest (`NOT_REPLICATED`, or
/// `DEADLINE_EXCEEDED`), and that answer says more than the silence a client timer
/// firing first would leave.
pub const WRITE_ANSWER_GRACE: Duration = Duration::from_millis(20);

/// When a write may go to another replica after an attempt failed. A write sent
/// twice is applied twice, under two origins and two versions: last writer wins
/// between them, so a concurrent writer's cells can be overwritten again, and a
/// delete can take away what another writer wrote in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resend {
    /// Only when the attempt certainly was not applied: it could not be sent (a
    /// driver that stops waiting before the request went out answers
    /// [`Reply::Retryable`]), or its replica refused it (`UNAVAILABLE`). When that
    /// is unknown (the replica stopped waiting for it, or went silent, or the
    /// connection was lost after the request went out) the call ends
    /// [`Outcome::Ambiguous`].
    #[default]
    IfNotApplied,
    /// Also when that is unknown: the caller says applying the mutation twice is
    /// harmless.
    IfUnknown,
}

/// One write: not hedged (a write is not idempotent across origins); it goes to
/// the next of at most [`WRITE_CANDIDATES`] candidates only as its [`Resend`]
/// allows. Each attempt gets half the time left while another candidate remains,
/// so a replica that cannot be reached does not eat the whole deadline.
#[derive(Debug)]
pub struct WriteCall {
    /// Not yet asked, the next last.
    candidates: Vec<Candidate>,
    resend: Resend,
    deadline_at: u64,
    attempts: Vec<Attempt>,
    /// Each attempt's budget, as its replica is told (`deadline_us`): its
    /// `until_us` less the grace.
    budgets_us: Vec<u64>,
    unsent: usize,
    last_err: Option<usize>,
    /// The first attempt that may have been applied.
    unknown: Option<usize>,
    outcome: Option<Outcome>,
    /// Learned and not yet taken ([`WriteCall::lessons`]).
    lessons: Vec<Lesson>,
}

impl WriteCall {
    /// A write planned at `now_us`, to `candidates` in order, ending at the latest
    /// `deadline` later.
    pub fn new(
        candidates: impl IntoIterator<Item = Candidate>,
        now_us: u64,
        deadline: Duration,
        resend: Resend,
    ) -> Self {
        let mut candidates: Vec<Candidate> =
            candidates.into_iter().take(WRITE_CANDIDATES).collect();
        candidates.reverse();
        let mut call = WriteCall {
            candidates,
            resend,
            deadline_at: now_us.saturating_add(micros(deadline)),
            attempts: Vec::new(),
            budgets_us: Vec::new(),
            unsent: 0,
            last_err: None,
            unknown: None,
            outcome: None,
            lessons: Vec::new(),
        };
        if call.candidates.is_empty() {
            call.outcome = Some(Outcome::NoCandidate);
        } else {
            call.next(now_us);
        }
        call
    }

    /// Asks the next candidate, or ends the call.
    fn next(&mut self, now_us: u64) {
        let left = self.deadline_at.saturating_sub(now_us);
        let Some(candidate) = self.candidates.pop().filter(|_| left > 0) else {
            self.outcome = Some(match (self.unknown, self.last_err) {
                (Some(n), _) => Outcome::Ambiguous { attempt: n },
                (None, Some(n)) => Outcome::LastError { attempt: n },
                (None, None) => Outcome::DeadlineExceeded,
            });
            return;
        };
        // While another candidate remains, half the time left, and the grace
        // after it; the last gets what is left less its grace, so that its
        // replica's answer at its budget arrives before the deadline too.
        let (budget, grace) = if self.candidates.is_empty() {
            let grace = (left / 10).max(micros(WRITE_ANSWER_GRACE)).min(left / 2);
            (left - grace, grace)
        } else {
            let budget = left / 2;
            let grace = (budget / 10)
                .max(micros(WRITE_ANSWER_GRACE))
                .min(left - budget);
            (budget, grace)
        };
        let kind = if self.attempts.is_empty() {
            AttemptKind::Primary
        } else {
            AttemptKind::Failover
        };
        self.attempts.push(Attempt {
            candidate,
            kind,
            since_us: now_us,
            until_us: now_us + budget + grace,
            done: false,
        });
        self.budgets_us.push(budget);
    }

    /// The budget of attempt `n` its replica is told: half the time left while
    /// another candidate remains, the rest less the grace for the last. The call
    /// waits for the answer a little longer ([`WRITE_ANSWER_GRACE`], or a tenth),
    /// until [`Attempt::until_us`].
    pub fn budget(&self, n: usize) -> Duration {
        Duration::from_micros(self.budgets_us.get(n).copied().unwrap_or(0))
    }

    /// The next thing to do, until none is left.
    pub fn poll_action(&mut self) -> Option<Action> {
        if self.outcome.is_some() || self.unsent == self.attempts.len() {
            return None;
        }
        self.unsent += 1;
        Some(Action::Send(self.unsent - 1))
    }

    /// When to call [`Self::handle_timeout`]: the budget of the attempt out.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.outcome.is_some() {
            return None;
        }
        self.attempts.last().map(|a| a.until_us)
    }

    pub fn attempt(&self, n: usize) -> &Attempt {
        &self.attempts[n]
    }

    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Attempt `n` was answered at `now_us`.
    pub fn handle_reply(&mut self, now_us: u64, n: usize, reply: Reply) {
        if self.outcome.is_some() {
            return;
        }
        let Some(a) = self.attempts.get_mut(n) else {
            return;
        };
        if a.done {
            return;
        }
        a.done = true;
        match reply {
            Reply::Served => {
                let reason = a.candidate.reason;
                self.outcome = Some(Outcome::Served { attempt: n, reason });
            }
            Reply::Final => self.outcome = Some(Outcome::Failed { attempt: n }),
            Reply::NotCovered | Reply::Retryable => {
                self.last_err = Some(n);
                self.next(now_us);
            }
            Reply::DeadlineExceeded | Reply::Lost => {
                self.unknown.get_or_insert(n);
                self.last_err = Some(n);
                match self.resend {
                    Resend::IfUnknown => self.next(now_us),
                    Resend::IfNotApplied => self.outcome = Some(Outcome::Ambiguous { attempt: n }),
                }
            }
        }
    }

    /// Time passed: the attempt out ran out of its budget (as if it had answered
    /// "deadline exceeded"), unanswered: [`Lesson::NoAnswer`].
    pub fn handle_timeout(&mut self, now_us: u64) {
        let Some(n) = self.attempts.len().checked_sub(1) else {
            return;
        };
        let a = &self.attempts[n];
        if self.outcome.is_none() && !a.done && now_us >= a.until_us {
            self.lessons.push(Lesson::NoAnswer {
                attempt: n,
                waited_us: a.until_us.saturating_sub(a.since_us),
            });
            self.handle_reply(now_us, n, Reply::DeadlineExceeded);
        }
    }

    /// What the frontend has learned since it last asked ([`Lesson`]): a write's
    /// attempts are sent one after another, so only silence teaches.
    pub fn lessons(&mut self) -> std::vec::Drain<'_, Lesson> {
        self.lessons.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Timestamp;
    use crate::token::Token;

    const MS: u64 = 1_000;

    fn c(name: &str, reason: Reason) -> Candidate {
        Candidate {
            replica: name.into(),
            reason,
            rtt_ms: 1.0,
        }
    }

    fn sends<P: Iterator<Item = Candidate>>(call: &mut ReadCall<P>) -> Vec<(String, AttemptKind)> {
        let mut out = Vec::new();
        while let Some(a) = call.poll_action() {
            if let Action::Send(n) = a {
                let a = call.attempt(n);
                out.push((a.candidate.replica.to_string(), a.kind));
            }
        }
        out
    }

    fn eventual(hedge_after: Option<Duration>) -> ReadCall<std::vec::IntoIter<Candidate>> {
        let primary = vec![
            c("a", Reason::Nearest),
            c("b", Reason::Nearest),
            c("c", Reason::Nearest),
        ];
        ReadCall::new(
            primary.into_iter(),
            Vec::new(),
            &Consistency::Eventual,
            0,
            Duration::from_millis(100),
            |_| hedge_after,
        )
    }

    #[test]
    fn first_answer_wins() {
        let mut call = eventual(None);
        assert_eq!(sends(&mut call), [("a".into(), AttemptKind::Primary)]);
        assert_eq!(call.poll_timeout(), Some(100 * MS));
        call.handle_reply(MS, 0, Reply::Served);
        assert_eq!(
            call.outcome(),
            Some(Outcome::Served {
                attempt: 0,
                reason: Reason::Nearest
            })
        );
        assert_eq!(call.poll_timeout(), None);
        assert_eq!(call.poll_action(), None);
    }

    #[test]
    fn hedges_within_budget_and_a_hedge_answer_says_so() {
        let mut call = eventual(Some(Duration::from_millis(5)));
        sends(&mut call);
        assert_eq!(call.poll_timeout(), Some(5 * MS));
        let mut hedger = Hedger::new(0);
        call.handle_timeout(5 * MS, &mut hedger);
        assert_eq!(sends(&mut call), [("b".into(), AttemptKind::Hedge)]);
        // The hedge spent the one token a new hedger holds: no second hedge.
        assert!(!hedger.try_spend());
        call.handle_reply(7 * MS, 1, Reply::Served);
        assert_eq!(
            call.outcome(),
            Some(Outcome::Served {
                attempt: 1,
                reason: Reason::Hedge
            })
        );
        // The first request is still out: the driver learns from its silence.
        assert!(!call.attempt(0).done);
    }

    #[test]
    fn no_budget_no_hedge() {
        let mut call = eventual(Some(Duration::from_millis(5)));
        sends(&mut call);
        let mut hedger = Hedger::new(0);
        assert!(hedger.try_spend());
        call.handle_timeout(5 * MS, &mut hedger);
        assert!(sends(&mut call).is_empty());
        assert_eq!(call.poll_timeout(), Some(100 * MS));
        call.handle_timeout(100 * MS, &mut hedger);
        assert_eq!(call.outcome(), Some(Outcome::DeadlineExceeded));
    }

    #[test]
    fn errors_fail_over_then_the_last_error_is_returned() {
        let mut call = eventual(None);
        sends(&mut call);
        call.handle_reply(MS, 0, Reply::Retryable);
        assert_eq!(sends(&mut call), [("b".into(), AttemptKind::Failover)]);
        call.handle_reply(2 * MS, 1, Reply::Retryable);
        call.handle_reply(3 * MS, 2, Reply::Retryable);
        assert_eq!(call.outcome(), Some(Outcome::LastError { attempt: 2 }));
        // A final error ends the call at once.
        let mut call = eventual(None);
        sends(&mut call);
        call.handle_reply(MS, 0, Reply::Final);
        assert_eq!(call.outcome(), Some(Outcome::Failed { attempt: 0 }));
        assert!(sends(&mut call).is_empty());
    }

    #[test]
    fn an_ended_read_teaches_what_its_requests_showed() {
        use Lesson::*;
        // A hedge won: the first request is followed to the deadline, and was
        // slower than the hedge's answer took.
        let mut call = eventual(Some(Duration::from_millis(5)));
        sends(&mut call);
        call.handle_timeout(5 * MS, &mut Hedger::new(0));
        sends(&mut call);
        assert!(call.lessons().next().is_none(), "nothing while it goes on");
        call.handle_reply(7 * MS, 1, Reply::Served);
        let lessons: Vec<_> = call.lessons().collect();
        assert_eq!(
            lessons,
            [
                Follow {
                    attempt: 0,
                    until_us: 100 * MS
                },
                Slower {
                    attempt: 0,
                    out_us: 7 * MS
                },
            ]
        );
        assert!(call.lessons().next().is_none(), "taken once");
        // The deadline passed: silence for each request still out, and each was
        // slower than the call lasted.
        let mut call = eventual(Some(Duration::from_millis(5)));
        sends(&mut call);
        call.handle_timeout(5 * MS, &mut Hedger::new(0));
        sends(&mut call);
        call.handle_reply(9 * MS, 1, Reply::Retryable);
        sends(&mut call);
        call.handle_timeout(100 * MS, &mut Hedger::new(0));
        assert_eq!(call.outcome(), Some(Outcome::DeadlineExceeded));
        let lessons: Vec<_> = call.lessons().collect();
        assert_eq!(
            lessons,
            [
                NoAnswer {
                    attempt: 0,
                    waited_us: 100 * MS
                },
                Slower {
                    attempt: 0,
                    out_us: 100 * MS
                },
                Slower {
                    attempt: 1,
                    out_us: 95 * MS
                },
                NoAnswer {
                    attempt: 2,
                    waited_us: 91 * MS
                },
                Slower {
                    attempt: 2,
                    out_us: 91 * MS
                },
            ]
        );
        // A read that may not be hedged left its silent first replica: followed,
        // but its estimate is not raised by the next replica's answer.
        let consistency = Consistency::RowAffinity;
        let mut call = ReadCall::new(
            vec![c("a", Reason::Affinity), c("b", Reason::Nearest)].into_iter(),
            Vec::new(),
            &consistency,
            0,
            Duration::from_millis(100),
            |_| Some(Duration::from_millis(30)),
        );
        sends(&mut call);
        call.handle_timeout(30 * MS, &mut Hedger::new(0));
        sends(&mut call);
        call.handle_reply(32 * MS, 1, Reply::Served);
        let lessons: Vec<_> = call.lessons().collect();
        assert_eq!(
            lessons,
            [Follow {
                attempt: 0,
                until_us: 100 * MS
            }]
        );
    }

    #[test]
    fn a_write_learns_silence_when_its_attempt_times_out() {
        let cands = ["a", "b"].map(|n| c(n, Reason::Nearest));
        let mut call = WriteCall::new(cands, 0, Duration::from_millis(200), Resend::IfUnknown);
        call.poll_action();
        call.handle_timeout(119 * MS);
        assert!(call.lessons().next().is_none(), "not yet");
        call.handle_timeout(120 * MS);
        let lessons: Vec<_> = call.lessons().collect();
        assert_eq!(
            lessons,
            [Lesson::NoAnswer {
                attempt: 0,
                waited_us: 120 * MS
            }]
        );
        // The next replica's own "deadline exceeded" is an answer, not silence.
        call.poll_action();
        call.handle_reply(150 * MS, 1, Reply::DeadlineExceeded);
        assert!(call.lessons().next().is_none());
    }

    #[test]
    fn an_affinity_read_leaves_a_silent_replica_in_time_for_the_next() {
        let mut hedger = Hedger::new(0);
        let mut at = |deadline_ms: u64, rtt: Option<f64>| {
            hedge_delay(
                &mut hedger,
                None,
                &Consistency::RowAffinity,
                Duration::from_millis(deadline_ms),
                rtt,
            )
        };
        // 4 × 1 ms + 20 ms would outlast a 20 ms deadline: the next replica gets
        // two round trips and 2 ms.
        assert_eq!(at(20, Some(1.0)), Some(Duration::from_millis(16)));
        assert_eq!(at(1_000, Some(1.0)), Some(Duration::from_millis(24)));
        // Never before half the deadline; half of it while the round trip is unknown.
        assert_eq!(at(20, Some(8.0)), Some(Duration::from_millis(10)));
        assert_eq!(at(20, None), Some(Duration::from_millis(10)));
    }

    #[test]
    fn an_affinity_read_fails_over_from_a_silent_replica_without_spending_budget() {
        // With hedging or without: failing over is not hedging.
        for policy in [Some(HedgePolicy::default()), None] {
            let primary = vec![c("a", Reason::Affinity), c("b", Reason::Nearest)];
            let consistency = Consistency::RowAffinity;
            let mut hedger = Hedger::new(0);
            let mut call = ReadCall::new(
                primary.into_iter(),
                Vec::new(),
                &consistency,
                0,
                Duration::from_millis(100),
                |first| {
                    assert_eq!(first.map(|c| c.replica.as_str()), Some("a"));
                    hedge_delay(
                        &mut hedger,
                        policy.as_ref(),
                        &consistency,
                        Duration::from_millis(100),
                        Some(2.0),
                    )
                },
            );
            assert_eq!(call.poll_timeout(), Some(28 * MS), "{policy:?}");
            sends(&mut call);
            let mut broke = Hedger::new(0);
            assert!(broke.try_spend());
            call.handle_timeout(28 * MS, &mut broke);
            assert_eq!(
                sends(&mut call),
                [("b".into(), AttemptKind::Failover)],
                "{policy:?}"
            );
        }
    }

    #[test]
    fn watermark_read_races_fallbacks_retries_then_reports_not_covered() {
        let token = Token {
            scope: "global".into(),
            origin: "o".into(),
            sequence: 7,
            timestamp: Timestamp::ZERO,
        };
        let primary = vec![c("a", Reason::Nearest), c("b", Reason::Nearest)];
        let fallback = vec![
            c("o", Reason::OriginFallback),
            c("a", Reason::Covered),
            c("x", Reason::Covered),
        ];
        let mut call = ReadCall::new(
            primary.into_iter(),
            fallback,
            &Consistency::Watermark(token),
            0,
            Duration::from_millis(100),
            |_| None,
        );
        sends(&mut call);
        call.handle_reply(MS, 0, Reply::NotCovered);
        assert_eq!(call.poll_action(), Some(Action::FallbackRace));
        assert_eq!(
            sends(&mut call),
            [
                ("o".into(), AttemptKind::Fallback),
                ("x".into(), AttemptKind::Fallback)
            ]
        );
        call.handle_reply(2 * MS, 1, Reply::NotCovered);
        // A deadline answer does not hide that nobody covered the token.
        call.handle_reply(3 * MS, 2, Reply::DeadlineExceeded);
        assert_eq!(call.outcome(), None);
        assert_eq!(call.poll_timeout(), Some(13 * MS));
        call.handle_timeout(13 * MS, &mut Hedger::new(0));
        let retried: Vec<String> = sends(&mut call)
            .into_iter()
            .map(|(r, k)| {
                assert_eq!(k, AttemptKind::Retry);
                r
            })
            .collect();
        assert_eq!(retried, ["o", "a", "x"]);
        call.handle_timeout(100 * MS, &mut Hedger::new(0));
        assert_eq!(call.outcome(), Some(Outcome::NotCovered { attempt: 1 }));
    }

    #[test]
    fn no_candidate() {
        let call = ReadCall::new(
            Vec::new().into_iter(),
            Vec::new(),
            &Consistency::Eventual,
            0,
            Duration::from_millis(100),
            |_| None,
        );
        assert_eq!(call.outcome(), Some(Outcome::NoCandidate));
        let call = WriteCall::new(Vec::new(), 0, Duration::from_millis(100), Resend::default());
        assert_eq!(call.outcome(), Some(Outcome::NoCandidate));
    }

    #[test]
    fn an_idempotent_write_leaves_room_to_fail_over_and_tries_three_replicas_at_most() {
        let cands = ["a", "b", "c", "d"].map(|n| c(n, Reason::Nearest));
        let mut call = WriteCall::new(cands, 0, Duration::from_millis(800), Resend::IfUnknown);
        assert_eq!(call.poll_action(), Some(Action::Send(0)));
        // Half the time while another candidate remains; the call waits a tenth
        // longer for the replica's own answer at its budget.
        assert_eq!(call.budget(0), Duration::from_millis(400));
        assert_eq!(call.attempt(0).until_us, 440 * MS);
        assert_eq!(call.poll_timeout(), Some(440 * MS));
        call.handle_timeout(439 * MS);
        assert_eq!(call.poll_action(), None, "still waiting");
        call.handle_timeout(440 * MS);
        assert_eq!(call.poll_action(), Some(Action::Send(1)));
        assert_eq!(call.attempt(1).kind, AttemptKind::Failover);
        assert_eq!(call.budget(1), Duration::from_millis(180));
        assert_eq!(call.attempt(1).until_us, 640 * MS);
        call.handle_reply(645 * MS, 1, Reply::Retryable);
        assert_eq!(call.poll_action(), Some(Action::Send(2)));
        // The last candidate gets all that is left, its grace inside it; "d" is
        // never asked.
        assert_eq!(call.budget(2), Duration::from_millis(135));
        assert_eq!(call.attempt(2).until_us, 800 * MS);
        call.handle_reply(460 * MS, 2, Reply::Retryable);
        assert_eq!(call.poll_action(), None);
        // The first attempt may have been applied: the write is not known to
        // have failed.
        assert_eq!(call.outcome(), Some(Outcome::Ambiguous { attempt: 0 }));
        // A final error is not failed over.
        let mut call = WriteCall::new(
            [c("a", Reason::Nearest), c("b", Reason::Nearest)],
            0,
            Duration::from_millis(800),
            Resend::IfUnknown,
        );
        call.poll_action();
        call.handle_reply(MS, 0, Reply::Final);
        assert_eq!(call.outcome(), Some(Outcome::Failed { attempt: 0 }));
        assert_eq!(call.poll_action(), None);
    }

    #[test]
    fn a_write_goes_elsewhere_only_when_it_was_certainly_not_applied() {
        let cands = || ["a", "b", "c"].map(|n| c(n, Reason::Nearest));
        let deadline = Duration::from_millis(200);
        // Refused or never sent: the next replica.
        let mut call = WriteCall::new(cands(), 0, deadline, Resend::default());
        assert_eq!(call.poll_action(), Some(Action::Send(0)));
        assert_eq!(call.budget(0), Duration::from_millis(100));
        assert_eq!(call.attempt(0).until_us, 120 * MS);
        call.handle_reply(100 * MS, 0, Reply::Retryable);
        assert_eq!(call.poll_action(), Some(Action::Send(1)));
        assert_eq!(call.attempt(1).until_us, 170 * MS);
        call.handle_reply(2 * MS, 1, Reply::Retryable);
        assert_eq!(call.poll_action(), Some(Action::Send(2)));
        call.handle_reply(3 * MS, 2, Reply::Retryable);
        assert_eq!(call.outcome(), Some(Outcome::LastError { attempt: 2 }));
        // A write with one candidate: its replica answers at 180 ms, 20 ms before
        // the call stops waiting.
        let call = WriteCall::new([c("a", Reason::Nearest)], 0, deadline, Resend::default());
        assert_eq!(call.budget(0), Duration::from_millis(180));
        assert_eq!(call.attempt(0).until_us, 200 * MS);
        // Each way of not knowing ends the call at once, naming the attempt.
        for (name, unknown) in [
            ("stopped waiting", Some(Reply::DeadlineExceeded)),
            ("lost after sending", Some(Reply::Lost)),
            ("silent", None),
        ] {
            let mut call = WriteCall::new(cands(), 0, deadline, Resend::default());
            call.poll_action();
            call.handle_reply(MS, 0, Reply::Retryable);
            assert_eq!(call.poll_action(), Some(Action::Send(1)), "{name}");
            match unknown {
                Some(r) => call.handle_reply(5 * MS, 1, r),
                None => {
                    // Half of the 199 ms left at 1 ms, and 20 ms of grace.
                    assert_eq!(call.poll_timeout(), Some(120_500), "{name}");
                    call.handle_timeout(120_500);
                }
            }
            assert_eq!(call.poll_action(), None, "{name}: never sent to a third");
            assert_eq!(
                call.outcome(),
                Some(Outcome::Ambiguous { attempt: 1 }),
                "{name}"
            );
        }
    }

    #[test]
    fn a_recorded_call_replays_to_the_same_steps_and_a_changed_record_does_not() {
        let primary = vec![
            c("a", Reason::Nearest),
            c("b", Reason::Nearest),
            c("c", Reason::Nearest),
        ];
        let mut call = ReadCall::recorded(
            primary.into_iter(),
            Vec::new(),
            &Consistency::Eventual,
            0,
            Duration::from_millis(100),
            |_| Some(Duration::from_millis(5)),
        );
        sends(&mut call);
        let mut hedger = Hedger::new(0);
        call.handle_timeout(5 * MS, &mut hedger);
        sends(&mut call);
        call.handle_reply(6 * MS, 1, Reply::Retryable);
        sends(&mut call);
        call.handle_reply(9 * MS, 2, Reply::Served);
        let log = call.log().expect("recorded").clone();
        assert_eq!(
            log.primary.len(),
            3,
            "every candidate taken is in the record"
        );
        assert!(log.steps.contains(&Step::Timeout {
            now_us: 5 * MS,
            granted: Some(true)
        }));
        assert_eq!(
            log.steps.last(),
            Some(&Step::Outcome(Outcome::Served {
                attempt: 2,
                reason: Reason::Nearest
            }))
        );
        assert_eq!(log.replay(), log.steps);
        // Had the budget refused the hedge, the call would have decided otherwise.
        let mut refused = log;
        for s in &mut refused.steps {
            if let Step::Timeout { granted, .. } = s {
                *granted = Some(false);
            }
        }
        assert_ne!(refused.replay(), refused.steps);
    }
}
