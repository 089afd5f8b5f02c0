"""End to end against a real local cluster (conftest.py): what Python writes `pangea
get` reads byte for byte and the reverse, tokens across regions, pages, residency
refusals, bounded and affinity reads, and errors decoded with their codes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from pangea_client import (
    AdProfile,
    AsOf,
    Bounded,
    Client,
    ConfigError,
    Credential,
    Increment,
    InvalidArgument,
    NotFound,
    PolicyForbids,
    RowAffinity,
    Segment,
    SetCell,
    Token,
    Watermark,
    key_range,
)
from pangea_client import rows as f
from pangea_client.affinity import rendezvous
from pangea_client.pb import client_pb2 as pb

from .conftest import Cluster, run

T = "ad_profiles"
#: Deadlines for a shared 2-core CI machine (a frontend's are 20 ms / 200 ms).
READ = 2.0
WRITE = 2.0


async def connect(c: Cluster, region: str, profile: str = "frontend", **kw: object) -> Client:
    return await Client.connect(c.file, region, profile, **kw)  # type: ignore[arg-type]


def test_python_writes_what_the_rust_cli_reads_byte_for_byte(cluster: Cluster) -> None:
    value = bytes(range(256))

    async def write() -> Token:
        async with await connect(cluster, "us-east-1") as c:
            w = await c.mutate(T, b"us/\x00bin", [SetCell("profile", b"p\xff", value)], deadline=WRITE,
                               wait_all_regions=True)
            assert w.value.origin == w.replica and w.value.sequence > 0
            return w.value

    token = run(write())
    got = cluster.cli("get", "--region", "ap-northeast-1", "0x" + b"us/\x00bin".hex(), "--consistency", "watermark",
                      "--token", token.encode().hex())
    cells = got["row"]["cells"]
    assert [(x["family"], x["column"], x["value"]) for x in cells] == [("profile", "0x70ff", "0x" + value.hex())]
    assert cells[0]["origin"] == token.origin and cells[0]["timestamp"] == token.timestamp


def test_rust_cli_writes_what_python_reads_with_its_token(cluster: Cluster) -> None:
    text = "écrit par pangea put ✓"
    put = cluster.cli("put", "--region", "eu-west-1", "us/from-rust", f"profile:p={text}", "--wait-all-regions")
    token = Token.decode(bytes.fromhex(put["token"]))

    async def read() -> None:
        async with await connect(cluster, "ap-northeast-1") as c:
            r = await c.get(T, "us/from-rust", consistency=Watermark(token), deadline=READ)
            assert r.value is not None and r.value.value("profile", "p") == text.encode()
            cell = r.value.families[0].cells[0]
            assert (cell.origin, cell.timestamp) == (token.origin, token.timestamp)
            assert r.reason in ("nearest", "covered", "origin-fallback", "hedge")

    run(read())


def test_watermark_read_with_a_token_written_in_another_region(cluster: Cluster) -> None:
    async def go() -> None:
        async with await connect(cluster, "us-east-1") as us, await connect(cluster, "ap-northeast-1") as ap:
            for i in range(5):
                w = await us.mutate(T, f"us/wm{i}", [SetCell("profile", "p", f"v{i}")], deadline=WRITE)
                r = await ap.get(T, f"us/wm{i}", consistency=Watermark(w.value), deadline=READ)
                # Never a stale value: the answer holds the write the token names.
                assert r.value is not None and r.value.value("profile", "p") == f"v{i}".encode()
                assert r.watermarks is not None and r.watermarks.covers(w.value)

    run(go())


def test_get_many_and_scan_pages(cluster: Cluster) -> None:
    async def go() -> None:
        async with await connect(cluster, "us-east-1") as c:
            keys = [f"us/page/{i:03}" for i in range(25)]
            last = None
            for k in keys:
                # Every region: a token names one origin's writes, and these may
                # go to several replicas.
                last = await c.mutate(T, k, [SetCell("profile", "p", k)], deadline=WRITE, wait_all_regions=True)
            assert last is not None
            wm = Watermark(last.value)
            asked = keys[:10] + ["us/page/missing"] + keys[10:]
            r = await c.get_many(T, asked, consistency=wm, deadline=READ)
            assert [row.key for row in r.value] == [k.encode() for k in asked]
            assert [row.exists for row in r.value] == [k != "us/page/missing" for k in asked]
            seen: list[bytes] = []
            resume = b""
            pages = 0
            while True:
                page = await c.scan(T, "us/page/", limit=10, resume_after=resume, consistency=wm, deadline=READ)
                seen += [row.key for row in page.value.rows]
                pages += 1
                resume = page.value.resume_key
                if not resume:
                    break
            assert seen == [k.encode() for k in keys] and pages >= 3

    run(go())


def test_resident_rows_are_refused_outside_their_regions(cluster: Cluster) -> None:
    async def go() -> None:
        async with await connect(cluster, "eu-west-1") as eu:
            await eu.mutate(T, "eu/alice", [SetCell("profile", "p", "resident")], deadline=WRITE)
        # A region-local profile in us-east-1 has no replica allowed for the row:
        # the client fails closed, without asking a replica for it (it refreshes
        # its location metadata and plans again first, §9 step 11).
        async with await connect(cluster, "us-east-1", "frontend-local") as local:
            with pytest.raises(PolicyForbids, match="'eu-resident' is usable by app profile 'frontend-local'") as e:
                await local.get(T, "eu/alice", deadline=READ)
            assert e.value.replica is None
        # Asked directly, a us-east-1 replica refuses the row itself: code 6.
        async with await connect(cluster, "us-east-1") as c:
            req = pb.ClientRequest(get=pb.GetRequest(table=T, row_key=b"eu/alice"))
            with pytest.raises(PolicyForbids) as e:
                await c._ask("use1-a", req, time.monotonic() + READ)
            assert e.value.code == 6 and e.value.replica == "use1-a"
            # Routed, the read goes to eu-west-1, the row's home region.
            r = await c.get(T, "eu/alice", deadline=READ)
            assert r.region == "eu-west-1" and r.reason in ("home", "hedge")

    run(go())


def test_bounded_and_affinity_reads(cluster: Cluster) -> None:
    async def go() -> None:
        async with await connect(cluster, "us-east-1") as c:
            await c.mutate(T, "us/bounded", [SetCell("profile", "p", "b")], deadline=WRITE)
            await c.probe_all()  # learn every replica's freshness
            r = await c.get(T, "us/bounded", consistency=Bounded(10_000), deadline=READ)
            assert r.reason in ("fresh", "hedge") and r.watermarks is not None
            assert r.watermarks.staleness_ms(int(time.time() * 1000)) <= 10_000
            want = rendezvous([("use1-a", 1.0), ("use1-b", 1.0)], b"us/bounded")
            for _ in range(3):
                a = await c.get(T, "us/bounded", consistency=RowAffinity(), deadline=READ)
                assert (a.replica, a.reason) == (want, "affinity")

    run(go())


def test_errors_are_decoded_with_their_codes(cluster: Cluster) -> None:
    async def go() -> None:
        async with await connect(cluster, "us-east-1") as c:
            with pytest.raises(NotFound) as nf:
                await c.get("no_such_table", "k", deadline=READ)
            assert nf.value.code == 2 and nf.value.replica
            with pytest.raises(InvalidArgument) as ia:
                await c.get(T, b"x" * 5000, deadline=READ)
            assert ia.value.code == 1 and "4096" in str(ia.value)
            with pytest.raises(NotFound, match="famille"):
                await c.mutate(T, "us/x", [SetCell("famille", "c", "v")], deadline=WRITE)
        # A certificate of profile `frontend` acting for `frontend-local`: refused.
        async with await connect(cluster, "us-east-1", "frontend-local",
                                 credential=Credential("client", "client-frontend")) as c:
            with pytest.raises(PolicyForbids) as pf:
                await c.get(T, "us/x", deadline=READ)
            assert pf.value.code == 6
        with pytest.raises(ConfigError, match="client-nobody.pem not found"):
            await connect(cluster, "us-east-1", credential=Credential("client", "client-nobody"))
        with pytest.raises(ConfigError, match="not the client"):
            await connect(cluster, "us-east-1", credential=Credential("client", "../operators/operator"))

    run(go())


def test_typed_profiles_and_deployment_digest(cluster: Cluster) -> None:
    async def go() -> None:
        async with await connect(cluster, "eu-west-1") as c:
            p = AdProfile(user_id="u7", segments=[Segment(name="z", score=3), Segment(name="a", score=-2)],
                          embedding=[0.25, -1.5], update_time_unix_ms=1_700_000_000_000)
            w = await c.put_profile("eu/u7", p, deadline=WRITE)
            r = await c.get_profile("eu/u7", consistency=Watermark(w.value), deadline=READ)
            assert r.value is not None and [s.name for s in r.value.segments] == ["a", "z"]
            assert list(r.value.embedding) == [0.25, -1.5] and r.value.user_id == "u7"
            assert (await c.get_profile("eu/nobody", deadline=READ)).value is None
            # The digest this client computes is the one every replica announces.
            assert c._announced is None

    run(go())


def test_filters_ranges_counters_event_times_and_reads_as_of_a_time(cluster: Cluster) -> None:
    """The data API of docs/client.md from Python: a server-side filter on a wide
    row, a reverse key-range scan, increments, a write at an event time, reads
    as of a time."""

    async def go() -> None:
        async with await connect(cluster, "us-east-1") as c:
            events = [SetCell("events", f"e:{n:03}", f"v{n}") for n in range(20)]
            w = await c.mutate(T, "us/wide", [*events, SetCell("profile", "p", "x")], deadline=WRITE)
            wm = Watermark(w.value)
            r = await c.get(T, "us/wide", consistency=wm, deadline=READ, cells=f.qualifier_prefix("e:01"))
            assert r.value is not None
            assert [cell.column for fam in r.value.families for cell in fam.cells] == [
                f"e:01{n}".encode() for n in range(10)
            ]
            tree = f.chain(f.family("events"), f.qualifier_regex("e:00[0-4]"), f.cells_per_row_limit(2))
            r = await c.get(T, "us/wide", consistency=wm, deadline=READ, cells=tree)
            assert r.value is not None and [cell.value for cell in r.value.families[0].cells] == [b"v0", b"v1"]
            # A reverse scan of a key range, closed at both ends.
            for n in range(8):
                last = await c.mutate(T, f"us/range/{n}", [SetCell("profile", "p", str(n))], deadline=WRITE)
            keys = key_range("us/range/2", "us/range/5", end_closed=True)
            page = await c.scan(
                T, "us/range/", key_range=keys, reverse=True, consistency=Watermark(last.value), deadline=READ
            )
            assert [row.key for row in page.value.rows] == [f"us/range/{n}".encode() for n in (5, 4, 3, 2)]
            # Increments add up; one may not be resent when its outcome is unknown.
            for _ in range(2):
                inc = await c.mutate(T, "us/caps", [Increment("impressions", "camp-1", 2)], deadline=WRITE)
            r = await c.get(T, "us/caps", consistency=Watermark(inc.value), deadline=READ)
            assert r.value is not None and r.value.count("impressions", "camp-1") == 4
            with pytest.raises(InvalidArgument, match="increment"):
                await c.mutate(T, "us/caps", [Increment("impressions", "camp-1")], resend_if_unknown=True)
            # An event 20 days old keeps its time; 100 days is outside the window.
            then = int(time.time() * 1000) - 20 * 86_400_000
            e = await c.mutate(T, "us/backfill", [SetCell("events", "click", "old")], event_time_ms=then, deadline=WRITE)
            r = await c.get(T, "us/backfill", consistency=Watermark(e.value), deadline=READ)
            assert r.value is not None and r.value.families[0].cells[0].timestamp >> 16 == then
            with pytest.raises(InvalidArgument, match="ms back"):
                await c.mutate(
                    T, "us/backfill", [SetCell("events", "click", "x")], event_time_ms=then - 80 * 86_400_000
                )
            # As of each of two writes' times, the value then.
            at = []
            for value in ("one", "two"):
                t = await c.mutate(T, "us/asof", [SetCell("events", "c", value)], deadline=WRITE)
                at.append(t.value.wall_ms)
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)  # every origin's heartbeats vouch for the times
            for ms, want in zip(at, (b"one", b"two"), strict=True):
                r = await c.get(T, "us/asof", consistency=AsOf(ms), deadline=READ)
                assert r.value is not None and r.value.value("events", "c") == want

    run(go())


def test_change_streams_resume_from_a_cursor(cluster: Cluster) -> None:
    async def go() -> None:
        async with await connect(cluster, "us-east-1") as c:
            start = await c.read_changes(T, "us/feed/", deadline=READ)
            assert start.value.changes == [] and start.value.cursor
            written = {}
            for i in range(3):
                w = await c.mutate(T, f"us/feed/{i}", [SetCell("profile", "p", f"v{i}")], deadline=WRITE)
                written[(w.value.scope, w.value.origin, w.value.sequence)] = f"us/feed/{i}".encode()
            seen: dict[tuple[str, str, int], bytes] = {}
            cursor = start.value.cursor
            for _ in range(50):
                page = await c.read_changes(T, "us/feed/", cursor=cursor, deadline=READ)
                for ch in page.value.changes:
                    assert ch.mutation.table == T
                    seen[(ch.scope, ch.origin, ch.sequence)] = ch.mutation.row_key
                cursor = page.value.cursor
                if written.items() <= seen.items():
                    break
                await asyncio.sleep(0.1)
            assert written.items() <= seen.items(), (written, seen)
            # Resumed from the cursor: nothing again.
            again = await c.read_changes(T, "us/feed/", cursor=cursor, deadline=READ)
            assert again.value.changes == []
            # A cursor that is not one is refused by name.
            with pytest.raises(InvalidArgument, match="cursor"):
                await c.read_changes(T, "us/feed/", cursor=b"\xff\xff", deadline=READ)

    run(go())


def test_failover_when_a_replica_is_killed(cluster: Cluster) -> None:
    """Reads keep being served by the others when a replica is killed, and the
    dead one is marked down. Keep it the last test of this file: pytest runs a
    file's tests in order and the cluster is the session's, so a test after it
    would run beside a dead origin (an as-of read then waits for the others to
    suspect it and vouch, seconds under load)."""

    async def go() -> None:
        async with await connect(cluster, "us-east-1") as c:
            w = await c.mutate(T, "us/failover", [SetCell("profile", "p", "still here")], deadline=WRITE,
                               wait_all_regions=True)
            first = (await c.get(T, "us/failover", deadline=READ)).replica
            os.kill(cluster.pids()[first], signal.SIGKILL)
            served = []
            for _ in range(20):
                r = await c.get(T, "us/failover", deadline=READ)
                assert r.value is not None and r.value.value("profile", "p") == b"still here"
                served.append(r.replica)
            assert first not in served
            a = await c.get(T, "us/failover", consistency=RowAffinity(), deadline=READ)
            assert a.replica != first
            t = await c.get(T, "us/failover", consistency=Watermark(w.value), deadline=READ)
            assert t.replica != first
            await c.probe_all(0.5)  # a round of probes, as the background runs
            assert c.peers.is_down(first)
            again = await c.mutate(T, "us/failover", [SetCell("profile", "p", "after")], deadline=WRITE,
                                   resend_if_unknown=True)
            assert again.replica != first

    run(go())
