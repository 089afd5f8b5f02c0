"""The language-neutral conformance vectors of conformance/ (its README says how
to run them; the Rust client runs them in crates/pangea-cli/tests/conformance.rs):

- routing.json: every case planned by this client's planner (`routing.plan_read`)
  from the case's deployment files, location entries and view, compared exactly
  with `expect`;
- exchanges.json: every exchange's frame written byte for byte on a new stream of
  one connection to the replica of a fresh single-replica cluster (started here,
  apart from conftest's 3-region one, and stopped after), its answer checked
  against the fields `expect` gives.

One test per case, named by the case.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pangea_client import ClusterFile, Credential
from pangea_client.consistency import (
    Bounded,
    Consistency,
    Eventual,
    OriginMark,
    RowAffinity,
    ScopeWatermarks,
    Token,
    Watermark,
)
from pangea_client.deployment import Deployment
from pangea_client.errors import PolicyForbids
from pangea_client.location import Location, LocationEntry
from pangea_client.pb import client_pb2 as pb
from pangea_client.routing import Peers, plan_read
from pangea_client.transport import Transport

from .conftest import REPO, pangea_bin

VECTORS = REPO / "conformance"
#: conformance/README.md: the wall clock bounded reads are judged at, by default.
NOW_MS = 1_700_000_000_000


def _load(name: str) -> dict[str, Any]:
    return json.loads((VECTORS / name).read_text())


ROUTING = _load("routing.json")
EXCHANGES = _load("exchanges.json")


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in cases]


# ---------------------------------------------------------------- routing

_deployments: dict[str, Deployment] = {}


def _deployment(name: str) -> Deployment:
    if name not in _deployments:
        files = ROUTING["deployments"][name]
        _deployments[name] = Deployment.from_text(
            (REPO / files["topology"]).read_text(), (REPO / files["placement"]).read_text()
        )
    return _deployments[name]


def _consistency(m: dict[str, Any]) -> Consistency:
    mode = m["mode"]
    if mode == "eventual":
        return Eventual()
    if mode == "row_affinity":
        return RowAffinity()
    if mode == "watermark":
        t = m["token"]
        return Watermark(Token(t["scope"], t["origin"], t["sequence"], 0))
    if mode == "bounded":
        return Bounded(m["max_staleness_ms"])
    raise AssertionError(f"unknown consistency mode {mode!r}")


def _peers(view: dict[str, Any], consistency: Consistency, row_scope: str, now: float) -> Peers:
    """A client's state as the case gives it: measured round trips, replicas down
    (for an hour past `now`), replicas whose last watermarks cover the token (an
    origin mark at its sequence) and each replica's freshness in the row's scope."""
    peers = Peers()
    peers.rtt.update({r: float(ms) for r, ms in view.get("rtt_ms", {}).items()})
    for r in view.get("down", []):
        peers.down_until[r] = now + 3600.0
    marks: dict[tuple[str, str], dict[str, Any]] = {}
    if isinstance(consistency, Watermark):
        t = consistency.token
        for r in view.get("covers", []):
            marks.setdefault((r, t.scope), {"origins": {}, "freshness": 0})["origins"][t.origin] = OriginMark(
                t.sequence, 0, 0
            )
    elif view.get("covers"):
        raise AssertionError("'covers' in the view of a read without a token")
    for r, ms in view.get("freshness_ms", {}).items():
        marks.setdefault((r, row_scope), {"origins": {}, "freshness": 0})["freshness"] = int(ms) << 16
    for (r, scope), m in marks.items():
        peers.keep(r, ScopeWatermarks(scope, m["origins"], 0, m["freshness"]))
    return peers


def _plan(case: dict[str, Any]) -> dict[str, Any]:
    d = _deployment(case["deployment"])
    profile = d.profiles.get(case["app_profile"])
    assert profile is not None, f"no app profile {case['app_profile']!r} in {case['deployment']}"
    location = Location()
    for e in case.get("location", []):
        prefix = e["prefix"].encode()
        location.set(
            e["table"], prefix,
            LocationEntry(e["table"], prefix, e["policy"], e.get("home"), e.get("migrating_to")),
        )
    table, key = case["table"], case["key"].encode()
    consistency = _consistency(case["consistency"])
    now = time.monotonic()
    peers = _peers(case.get("view", {}), consistency, location.scope_of(d, table, key), now)
    try:
        plan = plan_read(
            d, location, profile, case["client_region"], table, key, consistency, peers,
            now=now, wall_ms=case.get("now_ms", NOW_MS),
        )
    except PolicyForbids:
        return {"error": "no_eligible_replica"}
    return {
        "scope": plan.scope,
        "primary": [[c.replica, c.reason] for c in plan.primary],
        "fallback": [[c.replica, c.reason] for c in plan.fallback],
    }


@pytest.mark.parametrize("case", ROUTING["cases"], ids=_ids(ROUTING["cases"]))
def test_routing(case: dict[str, Any]) -> None:
    assert ROUTING["format"] == 1
    assert _plan(case) == case["expect"]


# -------------------------------------------------------------- exchanges


def _rows(rows: list[pb.Row]) -> list[Any]:
    def text(b: bytes) -> str:
        return b.decode("utf-8", errors="replace")

    return [
        [text(r.key), [[f.name, text(c.column), text(c.value)] for f in r.families for c in f.cells]] for r in rows
    ]


def _answer(raw: bytes) -> dict[str, Any]:
    """Every property conformance/README.md names, as this answer shows it."""
    resp = pb.ClientResponse.FromString(raw)
    a: dict[str, Any] = {"response": resp.WhichOneof("response")}
    if resp.HasField("served_by"):
        a["served_by"] = [resp.served_by.replica, resp.served_by.region]
    which = a["response"]
    if which == "error":
        e = resp.error
        try:
            a["code"] = pb.Error.Code.Name(e.code)
        except ValueError:
            a["code"] = str(e.code)
        a["message"] = e.message
    elif which == "get":
        a["rows"] = _rows([resp.get.row] if resp.get.HasField("row") else [])
    elif which == "get_many":
        a["rows"] = _rows(list(resp.get_many.rows))
    elif which == "scan_prefix":
        a["rows"] = _rows(list(resp.scan_prefix.rows))
        a["resume_key"] = resp.scan_prefix.resume_key.decode("utf-8", errors="replace")
    elif which == "mutate":
        try:
            t = Token.decode(resp.mutate.token)
            a["token"] = [t.scope, t.origin, t.sequence]
        except Exception as e:  # noqa: BLE001 (shown in the failure)
            a["token"] = f"undecodable: {e}"
    elif which == "watermarks":
        a["scopes"] = [s.scope for s in resp.watermarks.scopes]
    return a


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any] | str]]:
    """A fresh single-replica cluster, every exchange run on it in order (the reads
    see the writes before them), then the cluster stopped: each exchange's answer
    (or what went wrong), by name."""
    spec = EXCHANGES["cluster"]
    b = pangea_bin()
    d = tmp_path_factory.mktemp("pangea-solo") / "cluster"
    up = subprocess.run(
        [b, "cluster", "up", str(REPO / spec["topology"]), "--placement", str(REPO / spec["placement"]),
         "--data-dir", str(d)],
        capture_output=True, text=True, timeout=120,
    )
    try:
        if up.returncode != 0:
            raise RuntimeError(f"pangea cluster up failed:\n{up.stdout}\n{up.stderr}")
        cf = ClusterFile.load(d / "cluster.toml")

        async def run_all() -> dict[str, dict[str, Any] | str]:
            t = Transport(cf.certs, Credential("client", f"client-{spec['app_profile']}"), cf.addresses)
            got: dict[str, dict[str, Any] | str] = {}
            try:
                link = await t.link(spec["replica"])
                for x in EXCHANGES["exchanges"]:
                    try:
                        raw = await asyncio.wait_for(link.exchange_bytes(bytes.fromhex(x["frame"])), 10)
                        got[x["name"]] = _answer(raw)
                    except Exception as e:  # noqa: BLE001 (this exchange's failure)
                        got[x["name"]] = f"no answer: {type(e).__name__}: {e}"
            finally:
                await t.close()
            return got

        yield asyncio.run(asyncio.wait_for(run_all(), 120))
    finally:
        subprocess.run([b, "cluster", "down", "--data-dir", str(d)], capture_output=True, timeout=60)
        if os.environ.get("PANGEA_KEEP_CLUSTER") is None:
            shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("exchange", EXCHANGES["exchanges"], ids=_ids(EXCHANGES["exchanges"]))
def test_exchange(exchange: dict[str, Any], answers: dict[str, dict[str, Any] | str]) -> None:
    assert EXCHANGES["format"] == 1
    got = answers[exchange["name"]]
    assert isinstance(got, dict), got
    want = exchange["expect"]
    # Fields not given are not checked; the message holds `message_contains`.
    shown = {k: got.get(k) for k in want if k != "message_contains"}
    assert shown == {k: v for k, v in want.items() if k != "message_contains"}, got
    if "message_contains" in want:
        assert want["message_contains"] in (got.get("message") or ""), got
