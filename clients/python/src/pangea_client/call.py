"""One call's decisions, without sockets or clocks (docs/protocol.md §9 steps 6–10):
a port of the Rust client's `core/frontend/call.rs` (`ReadCall`, `WriteCall`) and
of its hedge budget (`core/frontend/mod.rs` `Hedger`).

A driver (client.py) builds a call from a plan, sends what `poll_action` asks
for, feeds back each answer (`handle_reply`, classified as a `Reply`), wakes the
call at `poll_timeout` (`handle_timeout`), and stops once `outcome` is set.
Times are seconds on the driver's monotonic clock.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass

from .routing import Candidate

#: §9 step 8: the pause before a watermark read nobody covers asks again.
WATERMARK_RETRY_S = 0.010
#: §9 step 10: candidates a write tries at most.
WRITE_CANDIDATES = 3
#: §9 step 10: how much longer than the budget it gave a write's replica the call
#: waits for the answer (at least; a tenth of the budget when that is more, within
#: the call's deadline): the replica answers at its budget at the latest
#: (NOT_REPLICATED, DEADLINE_EXCEEDED), which says more than a client timer firing
#: first would (the Rust client's `WRITE_ANSWER_GRACE`).
WRITE_ANSWER_GRACE_S = 0.020


class Reply(enum.Enum):
    """An answer, as the call needs to know it."""

    SERVED = "served"
    NOT_COVERED = "not_covered"
    DEADLINE_EXCEEDED = "deadline_exceeded"  # or no answer within the budget
    RETRYABLE = "retryable"  # UNAVAILABLE, TOO_STALE, not connected: not applied
    LOST = "lost"  # sent, then the connection or stream failed
    FINAL = "final"  # every replica would say the same


@dataclass
class Attempt:
    candidate: Candidate
    kind: str  # primary, hedge, fallback, failover, retry
    since: float
    until: float
    done: bool = False


@dataclass(frozen=True)
class Outcome:
    """How a call ended: `kind` is served, failed, not_covered, last_error,
    deadline, no_candidate or ambiguous; `attempt` names the attempt whose answer
    or error the driver returns."""

    kind: str
    attempt: int | None = None
    reason: str | None = None


class Hedger:
    """Recent latencies and the hedge budget (§9 step 7): the delay is the 95th
    percentile of answered requests over the current and previous 10 s windows,
    clamped to [min(2 ms, c), c] with c = min(50 ms, deadline / 2) (c with fewer
    than 20 samples); a token bucket of 5 % of reads, starting at 1, at most 10."""

    WINDOW_S = 10.0
    SAMPLES_MIN = 20

    def __init__(self, percentile: float = 0.95, floor_s: float = 0.002, ceiling_s: float = 0.050,
                 budget_fraction: float = 0.05) -> None:
        self.percentile = percentile
        self.floor_s = floor_s
        self.ceiling_s = ceiling_s
        self.budget_fraction = budget_fraction
        self.tokens = 1.0
        self._current: list[float] = []  # sorted
        self._previous: list[float] = []  # sorted
        self._window_start: float | None = None
        # The last percentile computed, and the sample count then: recomputed
        # after 16 new samples (as the Rust client's `REFRESH_SAMPLES`).
        self._cached: tuple[int, float] | None = None

    def record(self, now: float, latency_s: float) -> None:
        if self._window_start is None:
            self._window_start = now
        if now - self._window_start > self.WINDOW_S:
            self._previous, self._current = self._current, []
            self._window_start = now
            self._cached = None
        bisect.insort(self._current, latency_s)

    def delay(self, deadline_s: float) -> float:
        """The delay before hedging a read; earns the read's share of the budget."""
        self.tokens = min(self.tokens + self.budget_fraction, 10.0)
        ceiling = min(self.ceiling_s, deadline_s / 2)
        n = len(self._current) + len(self._previous)
        if n < self.SAMPLES_MIN:
            d = ceiling
        elif self._cached is not None and n < self._cached[0] + 16:
            d = self._cached[1]
        else:
            rank = min(n - 1, int(self.percentile * n))
            merged = sorted(self._previous + self._current) if self._previous else self._current
            d = merged[rank]
            self._cached = (n, d)
        return max(min(self.floor_s, ceiling), min(d, ceiling))

    def try_spend(self) -> bool:
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class ReadCall:
    """One read: ask the first candidate; hedge to the next after the hedge delay
    (within the budget); fail over on errors; for a watermark read, once the first
    answer is NOT_COVERED, race the origin and every replica known to cover the
    token, and while nobody does, ask them again every 10 ms until the deadline."""

    def __init__(self, primary: list[Candidate], fallback: list[Candidate], watermark: bool, may_hedge: bool,
                 now: float, deadline_s: float, hedge_after_s: float | None) -> None:
        self._primary = list(primary)
        self._primary.reverse()  # taken from the back
        self._fallback = list(fallback)
        self.watermark = watermark
        self.may_hedge = may_hedge
        self.deadline_at = now + deadline_s
        self._hedge_at = None if hedge_after_s is None else now + hedge_after_s
        self._retry_at: float | None = None
        self.attempts: list[Attempt] = []
        self._unsent = 0
        self._outstanding = 0
        self._raced = False
        self._race_note = False
        self._last_err: tuple[int, Reply] | None = None
        self.outcome: Outcome | None = None
        first = self._next_primary()
        self._retry_set: list[Candidate] = []
        if watermark:
            self._retry_set = list(fallback)
            if first is not None and all(c.replica != first.replica for c in self._retry_set):
                self._retry_set.append(first)
        if first is None:
            self.outcome = Outcome("no_candidate")
        else:
            self._launch(first, "primary", now)

    def _next_primary(self) -> Candidate | None:
        return self._primary.pop() if self._primary else None

    def _launch(self, c: Candidate, kind: str, now: float) -> None:
        self.attempts.append(Attempt(c, kind, now, self.deadline_at))
        self._outstanding += 1

    def poll_action(self) -> int | str | None:
        """The next attempt to send (its index), "fallback_race" once a race starts
        (for counters), or None."""
        if self.outcome is not None:
            return None
        if self._race_note:
            self._race_note = False
            return "fallback_race"
        if self._unsent < len(self.attempts):
            self._unsent += 1
            return self._unsent - 1
        return None

    def poll_timeout(self) -> float | None:
        if self.outcome is not None:
            return None
        t = self.deadline_at
        for x in (self._hedge_at, self._retry_at):
            if x is not None:
                t = min(t, x)
        return t

    def handle_reply(self, now: float, n: int, reply: Reply) -> None:
        if self.outcome is not None or n >= len(self.attempts) or self.attempts[n].done:
            return
        a = self.attempts[n]
        a.done = True
        self._outstanding -= 1
        if reply is Reply.SERVED:
            self.outcome = Outcome("served", n, "hedge" if a.kind == "hedge" else a.candidate.reason)
            return
        if reply is Reply.NOT_COVERED and self.watermark and not self._raced:
            self._raced = True
            self._race_note = True
            for c in self._fallback:
                if c.replica != a.candidate.replica:
                    self._launch(c, "fallback", now)
            self._fallback = []
            self._last_err = (n, reply)
        elif reply is Reply.DEADLINE_EXCEEDED and self._last_err is not None and self._last_err[1] is Reply.NOT_COVERED:
            pass  # keep the more telling answer: nobody covered the token
        elif reply is Reply.FINAL:
            self.outcome = Outcome("failed", n)
            return
        else:
            if not (self.watermark and self._raced):
                c = self._next_primary()
                if c is not None:
                    self._launch(c, "failover", now)
            self._last_err = (n, reply)
        if self._outstanding == 0:
            if self.watermark and self._raced:
                self._retry_at = now + WATERMARK_RETRY_S
            else:
                c = self._next_primary()
                if c is not None:
                    self._launch(c, "failover", now)
                else:
                    self._give_up(now)

    def handle_timeout(self, now: float, hedger: Hedger) -> None:
        if self.outcome is not None:
            return
        if now >= self.deadline_at:
            self._give_up(now)
            return
        if self._retry_at is not None and now >= self._retry_at and self._outstanding == 0:
            self._retry_at = None
            for c in self._retry_set:
                self._launch(c, "retry", now)
        if self._hedge_at is not None and now >= self._hedge_at:
            self._hedge_at = None
            if self.watermark:
                i = next((i for i, c in enumerate(self._fallback) if c.reason == "covered"), None)
                nxt = self._fallback.pop(i) if i is not None else None
            else:
                nxt = self._next_primary()
            if nxt is not None:
                if not self.may_hedge:
                    self._launch(nxt, "failover", now)  # not a hedge: the first looks gone
                elif hedger.try_spend():
                    self._launch(nxt, "hedge", now)

    def _give_up(self, now: float) -> None:
        le = self._last_err
        if le is not None and le[1] is Reply.NOT_COVERED and self.watermark:
            self.outcome = Outcome("not_covered", le[0])
        elif le is not None and le[1] is not Reply.DEADLINE_EXCEEDED and now < self.deadline_at:
            self.outcome = Outcome("last_error", le[0])
        else:
            self.outcome = Outcome("deadline")


class WriteCall:
    """One write (§9 step 10): never hedged; at most 3 candidates, one at a time,
    each attempt given a budget (`budget(n)`, the replica's `deadline_us`) of half
    the time left while another remains, and waited for until `attempts[n].until`:
    the budget and a grace of max(budget / 10, 20 ms), within the call's deadline;
    the last attempt's grace is min(max(left / 10, 20 ms), left / 2) and its budget
    the time left less that grace. It moves on
    after an error that says the write was not applied (UNAVAILABLE, not
    connected); after silence, DEADLINE_EXCEEDED or a lost connection the write may
    have been applied, and the call ends `ambiguous` unless `resend_if_unknown`."""

    def __init__(self, candidates: list[Candidate], now: float, deadline_s: float, resend_if_unknown: bool) -> None:
        self._candidates = list(candidates[:WRITE_CANDIDATES])
        self._candidates.reverse()
        self.resend_if_unknown = resend_if_unknown
        self.deadline_at = now + deadline_s
        self.attempts: list[Attempt] = []
        self._budgets: list[float] = []
        self._unsent = 0
        self._last_err: int | None = None
        self._unknown: int | None = None
        self.outcome: Outcome | None = None
        if not self._candidates:
            self.outcome = Outcome("no_candidate")
        else:
            self._next(now)

    def _next(self, now: float) -> None:
        left = self.deadline_at - now
        if not self._candidates or left <= 0:
            if self._unknown is not None:
                self.outcome = Outcome("ambiguous", self._unknown)
            elif self._last_err is not None:
                self.outcome = Outcome("last_error", self._last_err)
            else:
                self.outcome = Outcome("deadline")
            return
        c = self._candidates.pop()
        if self._candidates:
            budget = left / 2
            grace = min(max(budget / 10, WRITE_ANSWER_GRACE_S), left - budget)
        else:
            grace = min(max(left / 10, WRITE_ANSWER_GRACE_S), left / 2)
            budget = left - grace
        self.attempts.append(Attempt(c, "failover" if self.attempts else "primary", now, now + budget + grace))
        self._budgets.append(budget)

    def budget(self, n: int) -> float:
        """The budget attempt `n`'s replica is told (seconds): half the time left
        while another candidate remains, the rest less the grace for the last. The
        call waits a little longer for the answer, until `attempts[n].until`."""
        return self._budgets[n] if n < len(self._budgets) else 0.0

    def poll_action(self) -> int | None:
        if self.outcome is not None or self._unsent == len(self.attempts):
            return None
        self._unsent += 1
        return self._unsent - 1

    def handle_reply(self, now: float, n: int, reply: Reply) -> None:
        if self.outcome is not None or n >= len(self.attempts) or self.attempts[n].done:
            return
        a = self.attempts[n]
        a.done = True
        if reply is Reply.SERVED:
            self.outcome = Outcome("served", n, a.candidate.reason)
        elif reply is Reply.FINAL:
            self.outcome = Outcome("failed", n)
        elif reply in (Reply.NOT_COVERED, Reply.RETRYABLE):
            self._last_err = n
            self._next(now)
        else:  # DEADLINE_EXCEEDED, LOST: may have been applied
            if self._unknown is None:
                self._unknown = n
            self._last_err = n
            if self.resend_if_unknown:
                self._next(now)
            else:
                self.outcome = Outcome("ambiguous", n)
