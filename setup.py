"""Build hook: generate the gRPC stubs from proto/minedraft/v1/*.proto at install time.

All metadata lives in pyproject.toml; this file only adds commands. The stubs are
build outputs (git-ignored): an editable install writes them into the source tree,
a regular build writes them (and copies of the .proto files) into the wheel.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
PROTO_SOURCE = ROOT / "proto" / "minedraft" / "v1"
PACKAGE_PROTO = ROOT / "services" / "minedraft" / "proto"
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")


def _codegen():
    """Load the generator by path: the minedraft package is not importable while it is being built."""
    spec = importlib.util.spec_from_file_location("_minedraft_codegen", PACKAGE_PROTO / "_codegen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithStubs(build_py):
    """build_py that also runs protoc (in place for editable installs)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            _codegen().generate(PROTO_SOURCE, PACKAGE_PROTO)
            return
        out_dir = Path(self.build_lib) / "minedraft" / "proto"
        _codegen().generate(PROTO_SOURCE, out_dir)
        for proto in sorted(PROTO_SOURCE.glob("*.proto")):
            self.copy_file(str(proto), str(out_dir / proto.name))


class SdistWithProtos(sdist):
    """sdist that ships the top-level proto/ folder (outside the package tree) and no generated stubs."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        files = [f for f in files if not GENERATED.search(f)]
        super().make_release_tree(base_dir, files)
        for proto in sorted(PROTO_SOURCE.glob("*.proto")):
            dest = Path(base_dir) / proto.relative_to(ROOT)
            self.mkpath(str(dest.parent))
            self.copy_file(str(proto), str(dest))


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos})
