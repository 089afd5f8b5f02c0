"""Unit tests without a cluster: the byte examples and test vectors of
docs/protocol.md, and routing and call decisions on the reference topology."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import xxhash

from pangea_client import (
    Ambiguous,
    Bounded,
    Client,
    Eventual,
    PolicyForbids,
    RowAffinity,
    ScopeWatermarks,
    SetCell,
    Token,
    Watermark,
)
from pangea_client.affinity import affinity_hash, rendezvous
from pangea_client.call import Hedger, ReadCall, Reply, WriteCall
from pangea_client.consistency import OriginMark
from pangea_client.deployment import Deployment, files_digest
from pangea_client.framing import FRAME_BYTES_MAX, FrameError, FrameReader, encode_frame
from pangea_client.location import Location
from pangea_client.pb import client_pb2 as pb
from pangea_client.routing import Candidate, Peers, plan_read
from pangea_client.transport import server_name
from pangea_client.xxh3 import xxh3_64

from .conftest import PLACEMENT, TOPOLOGY


def test_frame_example_of_protocol_md_section_2() -> None:
    req = pb.ClientRequest(deadline_us=20_000, app_profile="frontend", watermarks=pb.WatermarkRequest())
    want = bytes.fromhex("00000010 08a09c01 12086672 6f6e7465 6e64 7200".replace(" ", ""))
    assert encode_frame(req.SerializeToString()) == want
    r = FrameReader()
    for b in want:  # byte by byte: a frame is whole only at its last byte
        assert r.next_frame() is None
        r.feed(bytes([b]))
    assert pb.ClientRequest.FromString(r.next_frame() or b"") == req
    big = FrameReader()
    big.feed((FRAME_BYTES_MAX + 1).to_bytes(4, "big"))
    with pytest.raises(FrameError):
        big.next_frame()


def test_token_example_of_protocol_md_section_6() -> None:
    t = Token("global", "use1-a", 42, 1700000000000 << 16 | 3)
    want = bytes.fromhex("010a06676c6f62616c1206757365312d61182a208380 80c0d6fcf3c501".replace(" ", ""))
    assert t.encode() == want
    assert Token.decode(want) == t
    assert t.wall_ms == 1700000000000
    for bad in (b"", b"\x02" + want[1:], want[:5]):
        with pytest.raises(Exception, match="consistency token"):
            Token.decode(bad)


def test_xxh3_matches_the_reference_at_every_length_class() -> None:
    rnd = random.Random(7)
    for n in [*range(0, 260), 511, 1024, 1025, 2047, 4096, 5000]:
        data = rnd.randbytes(n)
        for seed in (0, 1, rnd.getrandbits(64)):
            assert xxh3_64(data, seed) == xxhash.xxh3_64_intdigest(data, seed), (n, seed)


def test_rendezvous_vectors_of_protocol_md_section_9() -> None:
    assert affinity_hash("us-east-1a", b"user:42") == 0x3BFB234020E42FCB
    assert affinity_hash("us-east-1b", b"user:42") == 0x8555D245A019261F
    ids = ["us-east-1a", "us-east-1b", "us-east-1c"]
    equal = [(i, 1.0) for i in ids]
    weighted = list(zip(ids, [1.0, 2.0, 0.5]))
    cases = {
        b"user:1": ("us-east-1c", "us-east-1b"),
        b"user:2": ("us-east-1c", "us-east-1b"),
        b"user:3": ("us-east-1a", "us-east-1a"),
        b"user:42": ("us-east-1b", "us-east-1b"),
        b"app7,user9,1700000000": ("us-east-1c", "us-east-1c"),
    }
    for key, (eq, w) in cases.items():
        assert rendezvous(equal, key) == eq, key
        assert rendezvous(weighted, key) == w, key


def test_server_name_rule_of_protocol_md_section_1() -> None:
    assert server_name("us-east1-a") == "us-east1-a"
    assert server_name("use1-batch") == "use1-batch"
    for odd in ("r_1", "localhost", "LOCALHOST", "10.0.0.1", "-a", "a..b"):
        assert server_name(odd) == "localhost", odd


def deployment() -> Deployment:
    return Deployment.from_text(TOPOLOGY.read_text(), PLACEMENT.read_text())


def test_deployment_digest_and_placement() -> None:
    d = deployment()
    assert d.digest == files_digest(TOPOLOGY.read_text(), PLACEMENT.read_text()) != 0
    assert d.policy_of("ad_profiles", b"eu/1") == "eu-resident"
    assert d.policy_of("ad_profiles", b"us/1") == "global"
    assert d.policy_of("_location", b"eu/1") == "global"
    assert d.home_of("ad_profiles", b"apac/9") == "ap-northeast-1"
    assert d.region_rtt[("eu-west-1", "ap-northeast-1")] == pytest.approx(201.0)


def test_plans_follow_section_9() -> None:
    d = deployment()
    frontend = d.profiles["frontend"]
    loc = Location()
    peers = Peers()
    # A global row from us-east-1: the region's serving replicas first (1 ms), never
    # the batch replica; Europe (69.6 ms) before Tokyo (149.3 ms).
    p = plan_read(d, loc, frontend, "us-east-1", "ad_profiles", b"us/1", Eventual(), peers)
    assert [c.replica for c in p.primary] == ["use1-a", "use1-b", "euw1-a", "euw1-b", "apne1-a", "apne1-b"]
    # An EU-resident row from us-east-1: only eu-west-1, its home region.
    p = plan_read(d, loc, frontend, "us-east-1", "ad_profiles", b"eu/7", Eventual(), peers)
    assert [(c.replica, c.reason) for c in p.primary] == [("euw1-a", "home"), ("euw1-b", "home")]
    # A region-local profile in us-east-1 may not read it at all: fail closed.
    with pytest.raises(PolicyForbids, match="eu-resident"):
        plan_read(d, loc, d.profiles["frontend-local"], "us-east-1", "ad_profiles", b"eu/7", Eventual(), peers)
    # Down replicas go last; measured round trips beat the topology's, but never
    # make another region look nearer than the topology says (§9 step 4).
    peers.mark_down("use1-a")
    peers.note_rtt("euw1-b", 0.1)
    p = plan_read(d, loc, frontend, "us-east-1", "ad_profiles", b"us/1", Eventual(), peers)
    assert [c.replica for c in p.primary] == ["use1-b", "euw1-a", "euw1-b", "apne1-a", "apne1-b", "use1-a"]
    peers.rtt["euw1-b"] = 300.0  # farther than the file says: that counts
    peers.rtt["use1-b"] = 500.0  # in the client's region, a measurement counts as it is
    p = plan_read(d, loc, frontend, "us-east-1", "ad_profiles", b"us/1", Eventual(), peers)
    assert [c.replica for c in p.primary] == ["euw1-a", "apne1-a", "apne1-b", "euw1-b", "use1-b", "use1-a"]
    # Row affinity: the rendezvous winner of the region first.
    peers = Peers()
    p = plan_read(d, loc, frontend, "us-east-1", "ad_profiles", b"us/1", RowAffinity(), peers)
    want = rendezvous([("use1-a", 1.0), ("use1-b", 1.0)], b"us/1")
    assert (p.primary[0].replica, p.primary[0].reason) == (want, "affinity")
    # Watermark: the origin, then replicas known to cover the token.
    tok = Token("global", "apne1-b", 5, 1)
    peers.keep("euw1-a", ScopeWatermarks("global", {"apne1-b": OriginMark(5, 1, 0)}))
    peers.keep("use1-b", ScopeWatermarks("global", {"apne1-b": OriginMark(4, 1, 0)}))
    p = plan_read(d, loc, frontend, "us-east-1", "ad_profiles", b"us/1", Watermark(tok), peers)
    assert [(c.replica, c.reason) for c in p.fallback] == [("apne1-b", "origin-fallback"), ("euw1-a", "covered")]
    # Bounded: fresh replicas first, in order.
    peers.keep("apne1-a", ScopeWatermarks("global", {}, 0, 1_000_000 << 16))
    p = plan_read(d, loc, frontend, "us-east-1", "ad_profiles", b"us/1", Bounded(500), peers, wall_ms=1_000_100)
    assert (p.primary[0].replica, p.primary[0].reason) == ("apne1-a", "fresh")


def test_peers_name_the_watermarks_a_replica_last_sent() -> None:
    # §7: a request names the last watermarks a replica sent in full; an answer
    # that leaves them out gets them back by that name; a probe's other ones drop it.
    peers = Peers()
    assert peers.known_digest("euw1-a") == 0
    old = ScopeWatermarks("global", {"use1-a": OriginMark(4, 1, 0)})
    peers.keep("euw1-a", old, 0xD1)
    assert peers.known_digest("euw1-a") == 0xD1
    assert peers.named_watermarks("euw1-a", 0xD1) == old
    assert peers.named_watermarks("euw1-a", 0xD2) is None
    assert peers.named_watermarks("use1-b", 0xD1) is None
    peers.keep("euw1-a", ScopeWatermarks("eu-resident", {}), 0)  # another scope: name kept
    assert peers.known_digest("euw1-a") == 0xD1
    peers.keep("euw1-a", old, 0)  # the same ones, unnamed: name kept
    assert peers.known_digest("euw1-a") == 0xD1
    newer = ScopeWatermarks("global", {"use1-a": OriginMark(5, 2, 0)})
    peers.keep("euw1-a", newer, 0)  # other ones, unnamed: the name no longer holds
    assert peers.known_digest("euw1-a") == 0
    assert peers.named_watermarks("euw1-a", 0xD1) is None
    assert peers.freshness("euw1-a", "global") == newer


def cands(*ids: str) -> list[Candidate]:
    return [Candidate(i, "nearest", 1.0) for i in ids]


def test_watermark_read_races_the_fallbacks_then_retries() -> None:
    fallback = [Candidate("o", "origin-fallback", 1.0), Candidate("c", "covered", 1.0)]
    call = ReadCall(cands("a", "b"), fallback, watermark=True, may_hedge=True, now=0.0, deadline_s=0.02,
                    hedge_after_s=None)
    assert call.poll_action() == 0
    call.handle_reply(0.001, 0, Reply.NOT_COVERED)
    assert call.poll_action() == "fallback_race"
    assert [call.attempts[i].candidate.replica for i in (call.poll_action(), call.poll_action())] == ["o", "c"]
    call.handle_reply(0.002, 1, Reply.NOT_COVERED)
    call.handle_reply(0.002, 2, Reply.NOT_COVERED)
    assert call.poll_action() is None and call.poll_timeout() == pytest.approx(0.012)
    call.handle_timeout(0.012, Hedger())
    retried = [call.attempts[n].candidate.replica for n in iter(call.poll_action, None)]
    assert sorted(retried) == ["a", "c", "o"], "the fallbacks and the first replica again"
    call.handle_timeout(0.02, Hedger())
    assert call.outcome is not None and call.outcome.kind == "not_covered"


def test_write_after_silence_is_ambiguous_unless_resending_is_allowed() -> None:
    w = WriteCall(cands("a", "b", "c", "d"), 0.0, 0.2, resend_if_unknown=False)
    assert w.poll_action() == 0 and w.budget(0) == pytest.approx(0.1), "half the time left"
    assert w.attempts[0].until == pytest.approx(0.12), "and 20 ms of grace for the replica's own answer"
    w.handle_reply(0.1, 0, Reply.DEADLINE_EXCEEDED)
    assert w.outcome is not None and w.outcome.kind == "ambiguous"
    w = WriteCall(cands("a", "b"), 0.0, 0.2, resend_if_unknown=False)
    w.poll_action()
    w.handle_reply(0.01, 0, Reply.RETRYABLE)  # UNAVAILABLE: not applied, next one
    assert w.poll_action() == 1 and w.attempts[1].until == pytest.approx(0.2), "all of it for the last"
    w = WriteCall(cands("a", "b"), 0.0, 0.2, resend_if_unknown=True)
    w.poll_action()
    w.handle_reply(0.1, 0, Reply.LOST)
    assert w.poll_action() == 1


def test_write_waits_past_the_budget_it_tells_the_replica() -> None:
    """§9 step 10 (the Rust client's `WriteCall` test): budgets of half the time
    left, the rest less its grace for the last; the wait a grace of
    max(budget / 10, 20 ms) longer, within the call's deadline."""
    w = WriteCall(cands("a", "b", "c", "d"), 0.0, 0.8, resend_if_unknown=True)
    assert w.poll_action() == 0
    assert w.budget(0) == pytest.approx(0.4) and w.attempts[0].until == pytest.approx(0.44)
    w.handle_reply(0.44, 0, Reply.DEADLINE_EXCEEDED)  # silence until the wait ran out
    assert w.poll_action() == 1 and w.attempts[1].kind == "failover"
    assert w.budget(1) == pytest.approx(0.18) and w.attempts[1].until == pytest.approx(0.64)
    w.handle_reply(0.645, 1, Reply.RETRYABLE)
    assert w.poll_action() == 2
    # The last candidate: all that is left, its grace inside it; "d" never.
    assert w.budget(2) == pytest.approx(0.135) and w.attempts[2].until == pytest.approx(0.8)
    w.handle_reply(0.7, 2, Reply.RETRYABLE)
    assert w.poll_action() is None and w.outcome is not None and w.outcome.kind == "ambiguous"


class _FakeTransport:
    """Replicas scripted per id: "connecting" never gets the request out, "silent"
    takes it and never answers, "ok" answers a write's token at once. Records each
    request's `deadline_us`."""

    def __init__(self, script: dict[str, str]) -> None:
        self.script = script
        self.told: list[tuple[str, int]] = []

    async def call(self, replica: str, request: bytes, on_sent=None) -> bytes:  # noqa: ANN001
        what = self.script[replica]
        if what == "connecting":
            await asyncio.sleep(10)
        if on_sent is not None:
            on_sent()
        self.told.append((replica, pb.ClientRequest.FromString(request).deadline_us))
        if what == "silent":
            await asyncio.sleep(10)
        token = Token("global", replica, 1, 1).encode()
        return pb.ClientResponse(
            served_by=pb.ServedBy(replica=replica, region="us-east-1"), mutate=pb.MutateResponse(token=token)
        ).SerializeToString()

    def forget(self, replica: str) -> None:
        pass


def _write_with(script: dict[str, str]) -> tuple[object, _FakeTransport]:
    async def go() -> tuple[object, _FakeTransport]:
        t = _FakeTransport(script)
        c = Client(deployment(), t, "us-east-1", "frontend")  # type: ignore[arg-type]
        c.peers.note_rtt("use1-a", 0.1)  # use1-a first, then use1-b
        c.peers.note_rtt("use1-b", 0.2)
        try:
            r = await c.mutate("ad_profiles", b"us/1", [SetCell("profile", b"p", b"v")], deadline=0.2)
        except Exception as e:  # noqa: BLE001
            return e, t
        return r, t

    return asyncio.run(go())


def test_write_attempt_still_connecting_at_its_wait_was_not_sent() -> None:
    """§9 step 10: an attempt whose wait ran out before the request went out was
    not sent: the next candidate is asked, and told its own budget."""
    r, t = _write_with({"use1-a": "connecting", "use1-b": "ok"})
    assert not isinstance(r, Exception), r
    assert r.replica == "use1-b" and r.attempts == 2
    # Half of the ~80 ms left after the first attempt's 100 ms budget and 20 ms
    # grace; the last candidate but one (a third remains).
    assert [x for x, _ in t.told] == ["use1-b"]
    assert 20_000 <= t.told[0][1] <= 40_000


def test_write_attempt_silent_after_sending_is_ambiguous() -> None:
    """§9 step 10: the replica is told the budget (half of 200 ms) and waited for
    a grace longer; silence after the request went out leaves the write unknown."""
    started = time.monotonic()
    r, t = _write_with({"use1-a": "silent", "use1-b": "ok"})
    waited = time.monotonic() - started
    assert isinstance(r, Ambiguous) and r.replica == "use1-a", r
    assert [x for x, _ in t.told] == ["use1-a"]
    assert 95_000 <= t.told[0][1] <= 100_000, "told the budget, not the budget and grace"
    assert waited >= 0.115, "waited the 20 ms grace past the budget"


def test_error_codes_map_to_their_classes() -> None:
    from pangea_client import CursorExpired, NotReplicated
    from pangea_client.errors import Internal, from_wire

    e = from_wire(10, "behind the log", b"", "use1-a")
    assert isinstance(e, CursorExpired) and e.retryable and e.code == 10
    assert isinstance(from_wire(9, "late", b"t", "use1-a"), NotReplicated)
    unknown = from_wire(42, "?", b"", "use1-a")
    assert isinstance(unknown, Internal) and "error code 42" in str(unknown)
