"""The cluster file, topology and placement a client routes by (docs/protocol.md
§10, §9 "What a client keeps"; docs/topology.md, docs/placement.md).

Only what routing needs is read: regions with their intra-region round trips,
replicas (region, role, weight, address), links' round trips, app profiles,
placement policies, the placement file's prefix and home rules and each table's
default policy. The files are validated by the replicas and `pangea topology
check`; this module trusts their shape and reports a missing key by name.
"""

from __future__ import annotations

import heapq
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .xxh3 import xxh3_64

GLOBAL = "global"


@dataclass(frozen=True)
class Replica:
    id: str
    region: str
    role: str  # "serving", "batch" or "relay"
    weight: float = 1.0
    address: str | None = None

    @property
    def stores_rows(self) -> bool:
        return self.role != "relay"


@dataclass(frozen=True)
class AppProfile:
    name: str
    routing: str  # "nearest", "region-local" or "pinned"
    priority: str  # "serving" or "batch"
    writes: str  # "nearest" or "row-affinity"
    pinned: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rule:
    table: str
    prefix: bytes
    value: str  # a policy (prefix rules) or a region (home rules)


def _longest(rules: list[Rule], table: str, key: bytes) -> Rule | None:
    best: Rule | None = None
    for r in rules:
        if r.table == table and key.startswith(r.prefix) and (best is None or len(r.prefix) > len(best.prefix)):
            best = r
    return best


@dataclass
class Deployment:
    """A topology and its placement, as routing uses them."""

    name: str
    regions: dict[str, float]  # region -> intra-region round trip (ms)
    replicas: dict[str, Replica]  # by id, iterated in id order
    region_rtt: dict[tuple[str, str], float]  # cheapest path of links, both orders
    profiles: dict[str, AppProfile]
    policies: dict[str, tuple[str, ...]]  # policy -> its regions (includes global)
    tables: dict[str, str]  # table -> default policy
    rules: list[Rule] = field(default_factory=list)
    home_rules: list[Rule] = field(default_factory=list)
    digest: int = 0  # §11: files_digest(topology, placement)

    @staticmethod
    def from_text(topology: str, placement: str | None) -> Deployment:
        """Parses the topology file and the placement file (None: no placement)."""
        try:
            topo = tomllib.loads(topology)
            place = tomllib.loads(placement) if placement else {}
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"topology or placement file does not parse: {e}") from None
        try:
            return _build(topo, place, files_digest(topology, placement))
        except KeyError as e:
            raise ConfigError(f"topology or placement file: missing key {e}") from None

    def rtt_estimate_ms(self, client_region: str, replica: Replica) -> float:
        """§9 step 4: the topology's round trip from a client's region to a replica."""
        if replica.region == client_region:
            return self.regions[replica.region]
        return self.region_rtt.get((client_region, replica.region), math.inf)

    def policy_of(self, table: str, key: bytes) -> str:
        """The placement file's policy of a row: the longest prefix rule, else the
        table's default, else `global` (§8)."""
        if table.startswith("_"):
            return GLOBAL
        rule = _longest(self.rules, table, key)
        if rule is not None:
            return rule.value
        return self.tables.get(table, GLOBAL)

    def home_of(self, table: str, key: bytes) -> str | None:
        """The placement file's home region of a row: its longest home rule (§8)."""
        rule = _longest(self.home_rules, table, key)
        return rule.value if rule is not None else None

    def allowed(self, replica: str, policy: str) -> bool:
        """Whether `replica` stores rows of `policy`."""
        r = self.replicas.get(replica)
        regions = self.policies.get(policy)
        return r is not None and regions is not None and r.stores_rows and r.region in regions


def files_digest(topology: str, placement: str | None) -> int:
    """§11: XXH3-64 of the topology text, a 0x00 byte and the placement text; 1 if 0."""
    return xxh3_64(topology.encode() + b"\0" + (placement or "").encode()) or 1


def _build(topo: dict[str, Any], place: dict[str, Any], digest: int) -> Deployment:
    regions: dict[str, float] = {}
    replicas: list[Replica] = []
    default_intra = float(topo["intra_region_rtt_ms"])
    for cont in topo.get("continents", []):
        for reg in cont.get("regions", []):
            regions[reg["name"]] = float(reg.get("intra_rtt_ms", default_intra))
            for rep in reg.get("replicas", []):
                replicas.append(
                    Replica(rep["id"], reg["name"], rep["role"], float(rep.get("weight", 1.0)), rep.get("address"))
                )
    # Bytewise id order (§9 step 2): UTF-8 bytes compare as code points do.
    by_id = {r.id: r for r in sorted(replicas, key=lambda r: r.id.encode())}
    graph: dict[str, list[tuple[str, float]]] = {r: [] for r in regions}
    for link in topo.get("links", []):
        rtt = float(link.get("rtt_ms", 0.0))
        graph[link["a"]].append((link["b"], rtt))
        graph[link["b"]].append((link["a"], rtt))
    region_rtt: dict[tuple[str, str], float] = {}
    for a in regions:
        for b, d in _dijkstra(graph, a).items():
            if b != a:
                region_rtt[(a, b)] = d
    profiles = {}
    for p in topo.get("app_profiles", []):
        profiles[p["name"]] = AppProfile(
            name=p["name"],
            routing=p["routing"],
            priority=p.get("priority", "serving"),
            writes=p.get("writes") or "nearest",
            pinned=tuple(p.get("replicas", [])),
        )
    policies: dict[str, tuple[str, ...]] = {GLOBAL: tuple(regions)}
    for pol in place.get("policies", []):
        policies[pol["name"]] = tuple(pol["regions"])
    tables = {t["name"]: t.get("default_policy", GLOBAL) for t in place.get("tables", [])}
    rules = [Rule(r["table"], r["prefix"].encode(), r["policy"]) for r in place.get("rules", [])]
    homes = [Rule(r["table"], r["prefix"].encode(), r["home"]) for r in place.get("home_rules", [])]
    return Deployment(topo["name"], regions, by_id, region_rtt, profiles, policies, tables, rules, homes, digest)


def _dijkstra(graph: dict[str, list[tuple[str, float]]], start: str) -> dict[str, float]:
    dist = {start: 0.0}
    heap = [(0.0, start)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist.get(u, math.inf):
            continue
        for v, w in graph.get(u, []):
            nd = d + w
            if nd < dist.get(v, math.inf):
                dist[v] = nd
                heapq.heappush(heap, (nd, v))
    return dist


@dataclass(frozen=True)
class ClusterFile:
    """`cluster.toml` (§10): where the replicas are and the files they run."""

    path: Path
    name: str
    topology: Path
    placement: Path | None
    certs: Path
    emulate_wan: bool
    addresses: dict[str, str]  # replica id -> "IP:port"

    @staticmethod
    def load(path: str | Path) -> ClusterFile:
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except OSError as e:
            raise ConfigError(f"cluster file {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"cluster file {path} does not parse: {e}") from None
        try:
            return ClusterFile(
                path=path,
                name=raw["name"],
                # §10: paths are used as written (relative: to the working directory).
                topology=Path(raw["topology"]),
                placement=Path(raw["placement"]) if raw.get("placement") else None,
                certs=Path(raw["certs"]),
                emulate_wan=bool(raw.get("emulate_wan", False)),
                addresses={r["id"]: r["address"] for r in raw.get("replicas", [])},
            )
        except KeyError as e:
            raise ConfigError(f"cluster file {path}: missing key {e}") from None

    def deployment(self) -> Deployment:
        """The topology and placement files it names."""
        try:
            topology = self.topology.read_text()
            placement = self.placement.read_text() if self.placement else None
        except OSError as e:
            raise ConfigError(f"cluster file {self.path}: {e.filename}: {e.strerror}") from None
        return Deployment.from_text(topology, placement)
