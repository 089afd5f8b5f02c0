"""Build hook: generates the protobuf modules from the repository's proto/ files.

The client's wire types are the `pangea.v1` messages of `proto/pangea/v1/*.proto`
(docs/protocol.md §3). They are compiled at build time with the protoc that
grpcio-tools bundles (a build requirement in pyproject.toml), so neither a system
protoc nor generated code in the repository is needed:

- `pip install ./clients/python` builds in place and reads `../../proto`;
- an sdist (`python -m build`) carries a copy of the files in `proto/`;
- `PANGEA_PROTO_DIR` points the build at another checkout's `proto/`.

protoc names the modules after the proto package (`from pangea.v1 import
data_pb2`); the hook rewrites those imports to relative ones, so the modules live
inside this package as `pangea_client.pb.*_pb2` and claim no top-level `pangea`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
# The client protocol's files (replication.proto is between replicas only).
PROTOS = ("pangea/v1/data.proto", "pangea/v1/client.proto", "pangea/v1/ad_profile.proto")


def proto_root() -> Path:
    """The directory holding `pangea/v1/*.proto`."""
    candidates = []
    if os.environ.get("PANGEA_PROTO_DIR"):
        candidates.append(Path(os.environ["PANGEA_PROTO_DIR"]))
    candidates += [HERE / "proto", HERE.parent.parent / "proto"]
    for c in candidates:
        if all((c / p).is_file() for p in PROTOS):
            return c
    raise SystemExit(
        "pangea-client build: the proto files were not found; looked for "
        f"{', '.join(PROTOS)} under {', '.join(str(c) for c in candidates)}. Build from "
        "the repository (pip install ./clients/python) or set PANGEA_PROTO_DIR."
    )


def generate(out: Path) -> None:
    """Compiles the protos into `out` (the `pangea_client/pb` directory)."""
    from grpc_tools import protoc  # a build requirement (pyproject.toml)

    root = proto_root()
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            *[str(root / p) for p in PROTOS],
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"pangea-client build: protoc failed on {root}")
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted((Path(tmp) / "pangea" / "v1").iterdir()):
            text = f.read_text()
            text = re.sub(r"^from pangea\.v1 import", "from . import", text, flags=re.M)
            (out / f.name).write_text(text)


class BuildPyWithProtos(build_py):
    """`build_py` that also writes the generated modules."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            generate(HERE / "src" / "pangea_client" / "pb")
        else:
            generate(Path(self.build_lib) / "pangea_client" / "pb")


class SdistWithProtos(sdist):
    """`sdist` that carries the proto files, for builds outside the repository."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for p in PROTOS:
            dest = Path(base_dir) / "proto" / p
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / p, dest)


setup(cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos})
