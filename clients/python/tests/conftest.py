"""A real local cluster for the tests: `pangea cluster up` of the repository's
topology/local-3-regions.toml (7 replicas, 3 regions, on 127.0.0.1 ports the OS
picks) in a temporary directory, stopped at the end of the session even when
tests fail.

PANGEA_BIN names the `pangea` binary (default: the repository's
target/debug/pangea). Tests that need no cluster run without one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pangea_client import ClusterFile

REPO = Path(__file__).resolve().parents[3]
TOPOLOGY = REPO / "topology" / "local-3-regions.toml"
PLACEMENT = REPO / "topology" / "local-3-regions.placement.toml"
T = TypeVar("T")


def pangea_bin() -> str:
    """PANGEA_BIN, which must exist when set (CI sets it); else the repository's
    debug build, and the cluster tests are skipped without one."""
    b = os.environ.get("PANGEA_BIN")
    if b:
        if not Path(b).is_file():
            raise RuntimeError(f"PANGEA_BIN={b}: no such file")
        return str(Path(b).resolve())
    b = str(REPO / "target" / "debug" / "pangea")
    if not Path(b).is_file():
        pytest.skip(f"no pangea binary at {b} (set PANGEA_BIN)")
    return b


@dataclass
class Cluster:
    dir: Path
    file: Path
    bin: str

    @property
    def cluster(self) -> ClusterFile:
        return ClusterFile.load(self.file)

    def cli(self, *args: str, timeout: float = 30) -> dict[str, Any]:
        """Runs `pangea ARGS --cluster FILE --json` and returns its JSON output."""
        out = subprocess.run(
            [self.bin, *args, "--cluster", str(self.file), "--json"],
            capture_output=True, text=True, timeout=timeout,
        )
        if out.returncode != 0:
            raise AssertionError(f"pangea {' '.join(args)} failed: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def pids(self) -> dict[str, int]:
        import tomllib

        raw = tomllib.loads(self.file.read_text())
        return {r["id"]: r["pid"] for r in raw["replicas"]}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    b = pangea_bin()
    d = tmp_path_factory.mktemp("pangea") / "cluster"
    up = subprocess.run(
        [b, "cluster", "up", str(TOPOLOGY), "--placement", str(PLACEMENT), "--data-dir", str(d)],
        capture_output=True, text=True, timeout=120,
    )
    try:
        if up.returncode != 0:
            raise RuntimeError(f"pangea cluster up failed:\n{up.stdout}\n{up.stderr}")
        yield Cluster(d, d / "cluster.toml", b)
    finally:
        subprocess.run([b, "cluster", "down", "--data-dir", str(d)], capture_output=True, timeout=60)
        if os.environ.get("PANGEA_KEEP_CLUSTER") is None:
            shutil.rmtree(d, ignore_errors=True)


def run(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
    """Runs one test's coroutine on a fresh event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
