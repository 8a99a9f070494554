"""Generate the gRPC Python stubs from proto/minedraft/v1/*.proto.

Stdlib-only at import time: setup.py loads this file by path inside the build
environment, before the minedraft package is importable. The stubs land flat in
`minedraft.proto` (generation_pb2.py, generation_pb2_grpc.py, ...), so protoc's
`minedraft.v1` imports are rewritten to `minedraft.proto`. Every generated file
carries a digest of the .proto sources, which is how staleness is detected
without trusting file times (git checkouts and wheels scramble them).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

PROTO_PACKAGE = "minedraft/v1"
STAMP_PREFIX = "# minedraft-proto-sha256: "
_IMPORT_RE = re.compile(r"^(\s*)from minedraft\.v1 import ", re.MULTILINE)


def proto_files(source: Path) -> list[Path]:
    return sorted(source.glob("*.proto"))


def digest(protos: list[Path]) -> str:
    """One digest over all sources: a change in one file can change another's stubs (imports)."""
    h = hashlib.sha256()
    for p in protos:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def expected_outputs(protos: list[Path], out_dir: Path) -> list[Path]:
    return [out_dir / f"{p.stem}{suffix}" for p in protos for suffix in ("_pb2.py", "_pb2_grpc.py")]


def is_fresh(source: Path, out_dir: Path) -> bool:
    """True when every stub exists and was generated from the current sources."""
    protos = proto_files(source)
    stamp = STAMP_PREFIX + digest(protos)
    for out in expected_outputs(protos, out_dir):
        try:
            with out.open(encoding="utf-8") as fh:
                if fh.readline().rstrip("\n") != stamp:
                    return False
        except OSError:
            return False
    return True


def _protoc_include() -> str:
    from importlib.resources import files

    return str(files("grpc_tools") / "_proto")


def generate(source: Path, out_dir: Path) -> list[Path]:
    """Run grpc_tools.protoc over every .proto in `source`; returns the files written to `out_dir`."""
    from grpc_tools import protoc  # build/dev dependency only

    protos = proto_files(source)
    if not protos:
        raise FileNotFoundError(f"no .proto files in {source}")
    stamp = STAMP_PREFIX + digest(protos) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        # Stage the sources as minedraft/v1/*.proto so imports between them resolve the same
        # whether they come from the repository's proto/ folder or from a flat packaged copy.
        include = Path(tmp) / "include"
        staged = include / PROTO_PACKAGE
        staged.mkdir(parents=True)
        for p in protos:
            shutil.copyfile(p, staged / p.name)
        gen = Path(tmp) / "gen"
        gen.mkdir()
        args = [
            "grpc_tools.protoc",
            f"-I{include}",
            f"-I{_protoc_include()}",
            f"--python_out={gen}",
            f"--pyi_out={gen}",
            f"--grpc_python_out={gen}",
            *(f"{PROTO_PACKAGE}/{p.name}" for p in protos),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {source}")
        for produced in sorted((gen / PROTO_PACKAGE).iterdir()):
            text = _IMPORT_RE.sub(r"\1from minedraft.proto import ", produced.read_text(encoding="utf-8"))
            if produced.suffix == ".py":
                text = stamp + text
            written.append(_atomic_write(out_dir / produced.name, text))
    return written


def _atomic_write(path: Path, text: str) -> Path:
    """Write then rename, so a concurrent importer never sees half a module."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def main() -> int:
    """Regenerate the stubs of an editable checkout when they are stale (bin/_venv.sh runs this)."""
    repo = Path(__file__).resolve().parents[3]
    source = repo / "proto" / PROTO_PACKAGE
    out_dir = Path(__file__).resolve().parent
    if proto_files(source) and not is_fresh(source, out_dir):
        generate(source, out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
