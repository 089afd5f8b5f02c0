"""The client API: connect from a cluster file, then get, get-many, scan, mutate
and read watermarks, routed as docs/protocol.md §9 specifies.

```python
async with await Client.connect("/tmp/pangea/cluster.toml", region="eu-west-1") as c:
    written = await c.mutate("ad_profiles", "us/42", [SetCell("profile", "p", b"hello")])
    r = await c.get("ad_profiles", "us/42", consistency=Watermark(written.value))
```

One `Client` per process and event loop. It keeps one QUIC connection per replica
it talks to, a round-trip estimate, a down mark and the last watermarks of every
replica, the location metadata (§8) and the deployment it routes by; a
background task refreshes them every second (§9 step 13).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from google.protobuf.message import DecodeError

from . import routing
from .call import Hedger, ReadCall, Reply, WriteCall
from .consistency import (
    Consistency,
    Eventual,
    RowAffinity,
    ScopeWatermarks,
    Token,
    Watermark,
    may_hedge,
    to_proto,
)
from .deployment import ClusterFile, Deployment
from .errors import (
    Ambiguous,
    ConfigError,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    Lost,
    NotCovered,
    PangeaError,
    PolicyForbids,
    Unavailable,
    from_wire,
)
from .location import LOCATION_ENTRIES_MAX, Location, LocationEntry
from .pb import client_pb2 as pb
from .routing import Candidate, Peers, plan_read
from .rows import Change, ChangesPage, Increment, Mutation, Row, ScanPage, row_filter
from .transport import Credential, Transport

log = logging.getLogger("pangea_client")

T = TypeVar("T")

#: §5: the Rust client's default budgets.
READ_DEADLINE_S = 0.020
WRITE_DEADLINE_S = 0.200
WRITE_REPLICATED_DEADLINE_S = 2.0
#: §9 step 13.
REFRESH_EVERY_S = 1.0
PROBE_TIMEOUT_S = 1.0
CONNECT_PROBE_TIMEOUT_S = 2.0
LOCATION_DEADLINE_S = 0.5
LOCATION_PAGE = 1_000
#: §9 step 11: waits before the refreshes after a refusal.
POLICY_REFRESH_WAITS_S = (0.0, 0.010, 0.020)


@dataclass(frozen=True)
class Response(Generic[T]):
    """An answer and where it came from: the replica, its region, why it was asked
    (`nearest`, `home`, `affinity`, `covered`, `origin-fallback`, `hedge`,
    `fresh`), its watermarks for the row's scope, the call's latency in seconds and
    how many requests it took."""

    value: T
    replica: str
    region: str
    reason: str
    watermarks: ScopeWatermarks | None
    latency: float
    attempts: int


@dataclass
class _Served:
    value: Any  # the response's oneof value
    replica: str
    region: str
    watermarks: ScopeWatermarks | None
    at: float
    # Filled in by the read that returns it.
    reason: str = ""
    latency: float = 0.0
    attempts: int = 1


@dataclass
class _LocationRefresh:
    cursor: bytes = b""
    replica: str | None = None
    building: Location | None = None
    digest: int = 0


def _reply_of(e: BaseException | None) -> Reply:
    """How a call's state machine sees an answer (the Rust client's `reply_of`)."""
    if e is None:
        return Reply.SERVED
    if isinstance(e, NotCovered):
        return Reply.NOT_COVERED
    if isinstance(e, DeadlineExceeded):
        return Reply.DEADLINE_EXCEEDED
    if isinstance(e, Lost):
        return Reply.LOST
    if isinstance(e, PangeaError) and e.retryable:
        return Reply.RETRYABLE
    return Reply.FINAL


def _bytes(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)


class Client:
    """A connection to a Pangea cluster for one region and app profile."""

    def __init__(self, deployment: Deployment, transport: Transport, region: str, app_profile: str) -> None:
        if region not in deployment.regions:
            raise ConfigError(f"region {region!r} is not in topology {deployment.name!r}")
        if app_profile not in deployment.profiles:
            raise ConfigError(f"unknown app profile {app_profile!r} (topology {deployment.name!r})")
        self.deployment = deployment
        self.region = region
        self.app_profile = app_profile
        self.peers = Peers()
        self.hedger = Hedger()
        self.location = Location()
        self._transport = transport
        self._location_state = _LocationRefresh(digest=deployment.digest)
        self._location_lock = asyncio.Lock()
        self._announced: tuple[str, int] | None = None
        self._refused_digests: set[int] = set()
        self._background: asyncio.Task[None] | None = None
        self._lingering: set[asyncio.Task[Any]] = set()
        self._profile_bytes = pb.ClientRequest(app_profile=app_profile).SerializeToString()
        #: Counters: requests sent, hedges, failovers, fallback races.
        self.stats = {"requests": 0, "hedges": 0, "failovers": 0, "fallback_races": 0, "location_resets": 0}

    # ----- connecting -----

    @classmethod
    async def connect(
        cls,
        cluster: str | Path | ClusterFile,
        region: str,
        app_profile: str = "frontend",
        *,
        credential: Credential | None = None,
        background: bool = True,
    ) -> Client:
        """Connects with mutual TLS from a cluster file (§10): the certificate is
        `clients/client-<app_profile>` of its certs directory unless `credential`
        names another. Probes every replica the profile may use (so the first calls
        know the nearest) and reads the location metadata; `background` keeps both
        fresh every second."""
        cf = cluster if isinstance(cluster, ClusterFile) else ClusterFile.load(cluster)
        deployment = cf.deployment()
        cred = credential or Credential("client", f"client-{app_profile}")
        transport = Transport(cf.certs, cred, cf.addresses)
        client = cls(deployment, transport, region, app_profile)
        await client.probe_all(CONNECT_PROBE_TIMEOUT_S)
        with contextlib.suppress(PangeaError):
            await client.refresh_location()
        if background:
            client._background = asyncio.create_task(client._refresh_loop())
        return client

    async def close(self) -> None:
        """Stops the background task and closes every connection."""
        if self._background is not None:
            self._background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._background
        for t in list(self._lingering):
            t.cancel()
        await self._transport.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def profile(self) -> routing.AppProfile:
        return self.deployment.profiles[self.app_profile]

    def usable(self) -> list[str]:
        """Replicas this client may use for any row (what it probes)."""
        out: list[str] = []
        for scope in self.deployment.policies:
            for r in routing.eligible(self.deployment, self.profile, self.region, scope):
                if r.id not in out:
                    out.append(r.id)
        return out

    # ----- reads -----

    async def get(
        self,
        table: str,
        key: bytes | str,
        *,
        consistency: Consistency = Eventual(),
        deadline: float = READ_DEADLINE_S,
        hedge: bool = True,
        families: list[str] | None = None,
        columns: list[tuple[str, bytes | str]] | None = None,
        versions: int = 0,
        cells: pb.CellFilter | None = None,
    ) -> Response[Row | None]:
        """Reads one row (§3 "Get"); `value` is None when there is no such row.
        `cells`: a server-side filter tree (`pangea_client.rows`: `chain`,
        `qualifier_prefix`, ...; docs/client.md "Filters")."""
        key = _bytes(key)
        req = pb.GetRequest(
            table=table,
            row_key=key,
            filter=row_filter(families, columns, versions, cells),
            consistency=to_proto(consistency),
        )
        r = await self._read(table, key, pb.ClientRequest(get=req), consistency, deadline, hedge)
        row = r.value.row if r.value.HasField("row") else None
        return self._respond(r, Row.from_proto(row) if row is not None and row.families else None)

    async def get_many(
        self,
        table: str,
        keys: Sequence[bytes | str],
        *,
        consistency: Consistency = Eventual(),
        deadline: float = READ_DEADLINE_S,
        hedge: bool = True,
        families: list[str] | None = None,
        columns: list[tuple[str, bytes | str]] | None = None,
        versions: int = 0,
        cells: pb.CellFilter | None = None,
    ) -> Response[list[Row]]:
        """Reads up to 1,000 keys of one placement policy (§3 "Get many"), in the
        order of `keys`; a missing row is a `Row` with no families. A replica
        answers as many rows as fit a response; the call asks again for the rest,
        each request with the whole deadline, as the Rust client does."""
        keys = [_bytes(k) for k in keys]
        started = time.monotonic()
        rows: list[Row] = []
        first: Response[None] | None = None
        attempts = 0
        while len(rows) < len(keys) or first is None:
            rest = keys[len(rows) :]
            req = pb.GetManyRequest(
                table=table,
                row_keys=rest,
                filter=row_filter(families, columns, versions, cells),
                consistency=to_proto(consistency),
            )
            r = await self._read(table, rest[0] if rest else b"", pb.ClientRequest(get_many=req), consistency, deadline, hedge)
            attempts += r.attempts
            got = list(r.value.rows)
            if len(got) > len(rest) or (not got and rest):
                raise Internal(f"replica {r.replica} answered {len(got)} rows for {len(rest)} keys", replica=r.replica)
            rows.extend(Row.from_proto(x) for x in got)
            if first is None:
                first = self._respond(r, None)
        return Response(rows, first.replica, first.region, first.reason, first.watermarks, time.monotonic() - started, attempts)

    async def scan(
        self,
        table: str,
        prefix: bytes | str,
        *,
        limit: int = 0,
        resume_after: bytes = b"",
        max_bytes: int = 0,
        consistency: Consistency = Eventual(),
        deadline: float = READ_DEADLINE_S,
        hedge: bool = True,
        families: list[str] | None = None,
        columns: list[tuple[str, bytes | str]] | None = None,
        versions: int = 0,
        cells: pb.CellFilter | None = None,
        key_range: pb.BytesRange | None = None,
        reverse: bool = False,
        row_sample: float = 0.0,
        keys_only: bool = False,
    ) -> Response[ScanPage]:
        """One page of the rows under `prefix` (§3 "Scan prefix"): at most `limit`
        rows visited (0: 100; at most 1,000) and about `max_bytes` (0: 4 MiB). Pass
        `value.resume_key` back as `resume_after` while it is not empty.
        `key_range` (`pangea_client.key_range`) narrows the prefix's keys,
        `reverse` pages from the last key down, `row_sample` keeps a fixed
        fraction of the rows (the same on every replica), `keys_only` drops the
        cells (docs/client.md "Key ranges and reverse scans", "Row samples")."""
        prefix = _bytes(prefix)
        req = pb.ScanPrefixRequest(
            table=table,
            prefix=prefix,
            filter=row_filter(families, columns, versions, cells),
            consistency=to_proto(consistency),
            limit=limit,
            resume_after=resume_after,
            max_bytes=max_bytes,
            reverse=reverse,
            row_sample=row_sample,
            keys_only=keys_only,
        )
        if key_range is not None:
            req.range.CopyFrom(key_range)
        r = await self._read(table, prefix, pb.ClientRequest(scan_prefix=req), consistency, deadline, hedge)
        page = ScanPage([Row.from_proto(x) for x in r.value.rows], r.value.resume_key)
        return self._respond(r, page)

    async def read_changes(
        self,
        table: str,
        prefix: bytes | str = b"",
        *,
        cursor: bytes = b"",
        from_earliest: bool = False,
        limit: int = 0,
        deadline: float = 2.0,
    ) -> Response[ChangesPage]:
        """One page of `table`'s change stream under `prefix` (§3 "Changes";
        docs/client.md "Change streams"): the committed writes after `cursor`
        (empty: from now, or with `from_earliest` from the oldest the replica
        keeps), each origin's in its order, at most `limit` (0: 1,000). Pass
        `value.cursor` back for the next page; `value.more`: ask again at once.
        At least once: a resumed cursor repeats what came after it."""
        prefix = _bytes(prefix)
        req = pb.ChangesRequest(table=table, prefix=prefix, cursor=cursor, from_earliest=from_earliest, limit=limit)
        r = await self._read(table, prefix, pb.ClientRequest(changes=req), Eventual(), deadline, False)
        changes = [Change(c.scope, c.origin, c.sequence, c.timestamp, c.mutation) for c in r.value.changes]
        return self._respond(r, ChangesPage(changes, r.value.cursor, r.value.more))

    async def watermarks(self, replica: str, scope: str = "", deadline: float = 2.0) -> list[ScopeWatermarks]:
        """One replica's watermarks (§3 "Watermarks"), for `scope` or every scope."""
        req = pb.ClientRequest(watermarks=pb.WatermarkRequest(scope=scope))
        r = await asyncio.wait_for(self._ask(replica, req, time.monotonic() + deadline), deadline)
        return [ScopeWatermarks.from_proto(s) for s in r.value.scopes]

    # ----- writes -----

    async def mutate(
        self,
        table: str,
        key: bytes | str,
        mutations: Sequence[Mutation],
        *,
        deadline: float | None = None,
        row_affinity: bool | None = None,
        wait_regions: int = 0,
        wait_all_regions: bool = False,
        resend_if_unknown: bool = False,
        event_time_ms: int | None = None,
    ) -> Response[Token]:
        """Applies `mutations` to one row atomically (§3 "Mutate") at the nearest
        allowed replica, or at the row's affinity replica (`row_affinity`, default
        the app profile's `writes`). Returns the write's token. `wait_regions` /
        `wait_all_regions` acknowledge only once other regions applied it (default
        deadline then 2 s, else 200 ms). `event_time_ms` writes the cells (and
        deletes) at that time instead of the replica's clock, on tables with an
        `event_time` window (docs/client.md "Event time")."""
        key = _bytes(key)
        if resend_if_unknown and any(isinstance(m, Increment) for m in mutations):
            # As the Rust client: an increment applied twice counts twice.
            raise InvalidArgument("resend_if_unknown: an increment is never resent when whether it was applied is unknown")
        if deadline is None:
            deadline = WRITE_REPLICATED_DEADLINE_S if (wait_regions or wait_all_regions) else WRITE_DEADLINE_S
        mutation = pb.MutateRequest(wait_regions=wait_regions, wait_all_regions=wait_all_regions)
        mutation.mutation.table = table
        mutation.mutation.row_key = key
        mutation.mutation.mutations.extend(m.to_proto() for m in mutations)
        if event_time_ms is not None:
            mutation.mutation.event_time_ms = event_time_ms
        affinity = row_affinity if row_affinity is not None else self.profile.writes == "row-affinity"
        started = time.monotonic()
        waited = bool(wait_regions or wait_all_regions)
        for rnd in range(len(POLICY_REFRESH_WAITS_S) + 1):
            try:
                return await self._write_once(
                    table, key, pb.ClientRequest(mutate=mutation), affinity, started, deadline, resend_if_unknown, waited
                )
            except PolicyForbids:
                if not await self._refresh_after_refusal(rnd, started, deadline):
                    raise
        raise AssertionError("unreachable")

    async def _write_once(
        self,
        table: str,
        key: bytes,
        request: pb.ClientRequest,
        affinity: bool,
        started: float,
        deadline: float,
        resend_if_unknown: bool,
        waited: bool,
    ) -> Response[Token]:
        d = self.deployment
        mode: Consistency = RowAffinity() if affinity else Eventual()
        plan = plan_read(d, self.location, self.profile, self.region, table, key, mode, self.peers, now=started)
        moving_to = self.location.migrating_to(table, key)
        if moving_to is not None:  # §9 step 10: during a migration, both policies
            plan.primary = [c for c in plan.primary if d.allowed(c.replica, moving_to)]
        call = WriteCall(plan.primary, time.monotonic(), deadline - (time.monotonic() - started), resend_if_unknown)
        body = request.SerializeToString()
        errors: dict[int, PangeaError] = {}
        while (n := call.poll_action()) is not None:
            a = call.attempts[n]
            # §9 step 10: the replica is told its budget; the call waits a little
            # longer (until a.until) for the answer the replica gives at that budget.
            told_until = a.since + call.budget(n)
            wait = max(0.0, a.until - time.monotonic())
            sent = [False]
            try:
                served = await asyncio.wait_for(
                    self._ask(a.candidate.replica, body, told_until, on_sent=lambda: sent.__setitem__(0, True),
                              waited=waited),
                    wait,
                )
            except asyncio.TimeoutError:
                if not sent[0]:
                    # Still connecting: nothing reached the replica (not applied).
                    self.peers.mark_down(a.candidate.replica)
                    err: PangeaError = Unavailable(
                        f"not connected within {wait * 1e3:.0f} ms", replica=a.candidate.replica
                    )
                else:
                    # Sent, then silence: whether it was applied is unknown.
                    self._no_answer(a.candidate.replica, wait * 1e3)
                    err = DeadlineExceeded(f"no answer within {wait * 1e3:.0f} ms", replica=a.candidate.replica)
                errors[n] = err
                call.handle_reply(time.monotonic(), n, _reply_of(err))
                continue
            except PangeaError as e:
                errors[n] = e
                call.handle_reply(time.monotonic(), n, _reply_of(e))
                continue
            call.handle_reply(time.monotonic(), n, Reply.SERVED)
            token = Token.decode(served.value.token)
            return Response(token, a.candidate.replica, served.region, a.candidate.reason, served.watermarks,
                            time.monotonic() - started, n + 1)
        o = call.outcome
        assert o is not None
        if o.kind == "no_candidate":
            raise Unavailable("no replica to write to")
        if o.kind == "ambiguous":
            e = errors.get(o.attempt) if o.attempt is not None else None
            rep = call.attempts[o.attempt].candidate.replica if o.attempt is not None else None
            raise Ambiguous(f"write may or may not have been applied: {e.message if e else 'no answer in time'}", replica=rep)
        if o.kind in ("failed", "last_error") and o.attempt in errors:
            raise errors[o.attempt]
        raise DeadlineExceeded(f"deadline of {deadline * 1e3:.0f} ms exceeded after {len(call.attempts)} attempt(s)")

    # ----- one read -----

    async def _read(
        self,
        table: str,
        key: bytes,
        request: pb.ClientRequest,
        consistency: Consistency,
        deadline: float,
        hedge: bool,
        prefer: str | None = None,
        replan: bool = True,
    ) -> _Served:
        """§9: plan, ask, hedge, fail over, race; on POLICY_FORBIDS refresh location
        metadata and plan again (step 11), each round with the time left."""
        started = time.monotonic()
        body = request.SerializeToString() + self._profile_bytes
        for rnd in range(len(POLICY_REFRESH_WAITS_S) + 1):
            left = deadline - (time.monotonic() - started)
            try:
                served, _ = await self._read_once(table, key, body, consistency, left, hedge, prefer)
                return served
            except PolicyForbids:
                if not replan or table.startswith("_") or not await self._refresh_after_refusal(rnd, started, deadline):
                    raise
        raise AssertionError("unreachable")

    def _respond(self, s: _Served, value: T) -> Response[T]:
        return Response(value, s.replica, s.region, s.reason, s.watermarks, s.latency, s.attempts)

    async def _read_once(
        self,
        table: str,
        key: bytes,
        body: bytes,
        consistency: Consistency,
        deadline: float,
        hedge: bool,
        prefer: str | None,
    ) -> tuple[_Served, int]:
        started = time.monotonic()
        plan = plan_read(self.deployment, self.location, self.profile, self.region, table, key, consistency, self.peers,
                         now=started)
        if prefer is not None:
            i = next((i for i, c in enumerate(plan.primary) if c.replica == prefer), None)
            if i is not None:
                plan.primary.insert(0, plan.primary.pop(i))
        hedgeable = may_hedge(consistency)
        if hedgeable:
            hedge_after = self.hedger.delay(deadline) if hedge else None
        else:
            first = plan.primary[0].replica if plan.primary else None
            hedge_after = routing.gone_after_s(self.peers.rtt_ms(first) if first else None)
        call = ReadCall(plan.primary, plan.fallback, isinstance(consistency, Watermark), hedgeable, started, deadline,
                        hedge_after)
        deadline_at = call.deadline_at
        tasks: dict[asyncio.Task[_Served], int] = {}
        errors: dict[int, PangeaError] = {}
        try:
            while True:
                while (action := call.poll_action()) is not None:
                    if action == "fallback_race":
                        self.stats["fallback_races"] += 1
                        continue
                    a = call.attempts[action]
                    if a.kind == "hedge":
                        self.stats["hedges"] += 1
                    elif a.kind == "failover":
                        self.stats["failovers"] += 1
                    t = asyncio.ensure_future(self._ask(a.candidate.replica, body, deadline_at))
                    tasks[t] = action
                if call.outcome is not None:
                    break
                wake = min(call.poll_timeout() or deadline_at, deadline_at)
                timeout = max(0.0, wake - time.monotonic())
                pending = [t for t in tasks if not t.done()]
                done: set[asyncio.Task[_Served]] = set()
                if pending:
                    done, _ = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                elif timeout > 0:
                    await asyncio.sleep(timeout)
                if not done:
                    call.handle_timeout(time.monotonic(), self.hedger)
                    continue
                for t in done:
                    n = tasks[t]
                    e = t.exception()
                    if e is not None and not isinstance(e, PangeaError):
                        e = Internal(f"{type(e).__name__}: {e}", replica=call.attempts[n].candidate.replica)
                    if e is not None:
                        errors[n] = e  # type: ignore[assignment]
                    at = t.result().at if e is None else time.monotonic()
                    call.handle_reply(at, n, _reply_of(e))
                    o = call.outcome
                    if o is not None and o.kind == "served" and o.attempt == n:
                        served = t.result()
                        self._note_losers(call, tasks, n, served.at, consistency)
                        served.reason = o.reason or ""
                        served.latency = served.at - started
                        served.attempts = len(call.attempts)
                        return served, n
                    if o is not None:
                        break
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
        o = call.outcome
        assert o is not None
        if o.kind != "failed":
            # Requests still out got no answer in time (§9 step 12).
            for t, n in tasks.items():
                if not call.attempts[n].done:
                    self._no_answer(call.attempts[n].candidate.replica, (deadline_at - call.attempts[n].since) * 1e3)
        if o.kind == "no_candidate":
            raise Unavailable("no replica to ask")
        if o.kind == "not_covered" and o.attempt in errors:
            e = errors[o.attempt]
            raise NotCovered(f"{e.message} (no covered replica answered before the deadline)", replica=e.replica)
        if o.kind in ("failed", "last_error") and o.attempt in errors:
            raise errors[o.attempt]
        raise DeadlineExceeded(f"deadline of {deadline * 1e3:.1f} ms exceeded after {len(call.attempts)} attempt(s)")

    def _note_losers(self, call: ReadCall, tasks: dict[asyncio.Task[_Served], int], winner: int, at: float,
                     consistency: Consistency) -> None:
        """Requests beaten by another answer took at least that long (§9 step 12),
        except the silent first replica of a read that may not be hedged."""
        win = call.attempts[winner].candidate.replica
        for i, a in enumerate(call.attempts):
            if a.candidate.replica == win:
                continue
            if i == 0 and not may_hedge(consistency) and not a.done:
                continue
            self.peers.note_slower(a.candidate.replica, (at - a.since) * 1e3)

    def _no_answer(self, replica: str, waited_ms: float) -> None:
        """A request got no answer in `waited_ms`: its replica is gone (down for
        1 s, connection dropped: a killed process keeps a QUIC connection open
        until its idle timeout) or slower than estimated."""
        rtt = self.peers.rtt_ms(replica)
        if routing.looks_gone(waited_ms, rtt):
            self.peers.mark_down(replica)
            self._transport.forget(replica)
        elif rtt is not None and rtt < waited_ms:
            self.peers.note_rtt(replica, waited_ms)

    async def _ask(
        self,
        replica: str,
        request: bytes | pb.ClientRequest,
        deadline_at: float,
        on_sent: Callable[[], None] | None = None,
        waited: bool = False,
    ) -> _Served:
        """One request to one replica, told the time left until `deadline_at`;
        learns from the answer (§9 step 12). Raises the replica's error, or
        Unavailable / Lost for transport failures (the replica is then down 1 s)."""
        since = time.monotonic()
        body = request if isinstance(request, bytes) else request.SerializeToString() + self._profile_bytes
        budget_us = max(1, int((deadline_at - since) * 1e6))
        head = pb.ClientRequest(  # merges with `body`
            deadline_us=budget_us, known_watermarks=self.peers.known_digest(replica)
        ).SerializeToString()
        self.stats["requests"] += 1
        try:
            raw = await self._transport.call(replica, head + body, on_sent)
        except PangeaError:
            self.peers.mark_down(replica)
            raise
        at = time.monotonic()
        try:
            resp = pb.ClientResponse.FromString(raw)
        except DecodeError as e:
            raise Internal(f"answer does not decode as ClientResponse: {e}", replica=replica) from None
        if not waited:
            self.peers.note_rtt(replica, (at - since) * 1e3)
        sb = resp.served_by
        if sb.deployment and sb.deployment != self.deployment.digest:
            self._announced = (replica, sb.deployment)
        wm = None
        if sb.HasField("watermarks"):
            wm = ScopeWatermarks.from_proto(sb.watermarks)
            self.peers.keep(replica, wm, sb.watermarks_digest)
        elif sb.watermarks_digest:
            # Left out as the ones this request named: unchanged (§7).
            wm = self.peers.named_watermarks(replica, sb.watermarks_digest)
        which = resp.WhichOneof("response")
        if which is None:
            raise Internal("empty response", replica=replica)
        if which == "error":
            e = resp.error
            raise from_wire(e.code, e.message, e.token, replica)
        if not waited:
            self.hedger.record(at, at - since)
        return _Served(getattr(resp, which), replica, sb.region, wm, at)

    # ----- background: probes, location metadata, deployment -----

    async def probe_all(self, timeout: float = PROBE_TIMEOUT_S) -> None:
        """Asks every usable replica for its watermarks (§9 step 13): measures round
        trips, learns what each has applied, clears or sets down marks."""

        async def probe(r: str) -> None:
            try:
                req = pb.ClientRequest(watermarks=pb.WatermarkRequest())
                started = time.monotonic()
                # Connected first, so the round trip measured is not the handshake's
                # (in Python a handshake costs tens of ms of CPU; the Rust client
                # times both together).
                await asyncio.wait_for(self._transport.link(r), timeout)
                left = timeout - (time.monotonic() - started)
                s = await asyncio.wait_for(self._ask(r, req, time.monotonic() + left), left)
            except (PangeaError, asyncio.TimeoutError):
                self.peers.mark_down(r, routing.PROBE_DOWN_FOR_S)
                return
            for w in s.value.scopes:
                self.peers.keep(r, ScopeWatermarks.from_proto(w))
            self.peers.clear_down(r)

        await asyncio.gather(*(probe(r) for r in self.usable()))

    async def refresh_location(self) -> None:
        """Brings the location metadata up to date (§8 `LocationChangesRequest`):
        changes since the cursor, from the replica that issued it; a reset builds a
        new copy, swapped in once complete."""
        async with self._location_lock:
            st = self._location_state
            d = self.deployment
            if st.digest != d.digest:
                st = self._location_state = _LocationRefresh(digest=d.digest)
            while True:
                req = pb.ClientRequest(location_changes=pb.LocationChangesRequest(cursor=st.cursor, limit=LOCATION_PAGE))
                s = await self._read("_location", b"", req, Eventual(), LOCATION_DEADLINE_S, False, prefer=st.replica,
                                     replan=False)
                st.replica = s.replica
                page = s.value
                if page.reset:
                    st.building = Location()
                    self.stats["location_resets"] += 1
                target = st.building if st.building is not None else self.location
                for u in page.updates:
                    entry = LocationEntry.parse(u.key, u.entry, d) if u.HasField("entry") else None
                    nul = u.key.find(b"\0")
                    if nul < 0:
                        continue
                    try:
                        table = u.key[:nul].decode()
                    except UnicodeDecodeError:
                        continue
                    prefix = u.key[nul + 1 :]
                    if entry is not None and len(target) >= LOCATION_ENTRIES_MAX and not target.contains(table, prefix):
                        continue
                    target.set(table, prefix, entry)
                st.cursor = page.cursor
                if not page.more:
                    break
            if st.building is not None:
                self.location, st.building = st.building, None

    async def _refresh_after_refusal(self, rnd: int, started: float, deadline: float) -> bool:
        """§9 step 11: whether to plan again after a refusal (after refreshing)."""
        if rnd >= len(POLICY_REFRESH_WAITS_S):
            return False
        wait = POLICY_REFRESH_WAITS_S[rnd]
        if wait:
            if time.monotonic() - started + wait >= deadline:
                return False
            await asyncio.sleep(wait)
        try:
            await self.refresh_location()
        except PangeaError:
            return False
        return time.monotonic() - started < deadline

    async def follow_deployment(self) -> None:
        """Takes up the files a replica announced (another digest in
        `ServedBy.deployment`, §9 step 12): fetches them (`DeploymentRequest`),
        checks their digest, and routes by them from the next call on."""
        announced, self._announced = self._announced, None
        if announced is None or announced[1] in self._refused_digests:
            return
        replica, digest = announced
        try:
            s = await self._ask(replica, pb.ClientRequest(deployment=pb.DeploymentRequest()), time.monotonic() + 2.0)
            dr = s.value
            d = Deployment.from_text(dr.topology, dr.placement or None)
            if d.digest != dr.digest:
                raise ConfigError(f"digest {d.digest} of the files differs from the {dr.digest} announced")
            if self.region not in d.regions or self.app_profile not in d.profiles:
                raise ConfigError(f"the new files drop region {self.region!r} or app profile {self.app_profile!r}")
        except PangeaError as e:
            log.warning("deployment %s announced by %s refused: %s", digest, replica, e)
            self._refused_digests.add(digest)
            return
        for r in d.replicas.values():
            if r.address:
                with contextlib.suppress(ConfigError):
                    self._transport.learn(r.id, r.address)
        self.deployment = d
        log.info("following deployment %s from replica %s", d.digest, replica)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_EVERY_S)
            try:
                await self.follow_deployment()
                await self.probe_all(PROBE_TIMEOUT_S)
                with contextlib.suppress(PangeaError):
                    await self.refresh_location()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 (keep refreshing; a bug here must not stop routing)
                log.exception("background refresh failed")

    # ----- typed profiles -----

    async def get_profile(self, user_key: str, **opts: Any) -> Response[Any]:
        """The typed `AdProfile` of `user_key` (adprofile.py)."""
        from .adprofile import get_profile

        return await get_profile(self, user_key, **opts)

    async def put_profile(self, user_key: str, profile: Any, **opts: Any) -> Response[Token]:
        """Writes the typed `AdProfile` of `user_key` (adprofile.py)."""
        from .adprofile import put_profile

        return await put_profile(self, user_key, profile, **opts)


def run(coro: Awaitable[T]) -> T:
    """Runs a coroutine to completion (scripts: `run(main())`)."""
    return asyncio.run(coro)  # type: ignore[arg-type]
