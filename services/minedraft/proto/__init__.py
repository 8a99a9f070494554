"""Generated gRPC stubs of proto/minedraft/v1 (generation_pb2, generation_pb2_grpc, ...).

The stubs are build outputs, not sources: `pip install` writes them (see setup.py).
Importing this package regenerates them when they are missing or older than the
.proto files, so an editable checkout keeps working after a pull that changed a proto.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from minedraft.proto import _codegen

HERE = Path(__file__).resolve().parent
# Editable checkout: <repo>/services/minedraft/proto -> <repo>/proto/minedraft/v1.
REPO_PROTOS = HERE.parents[2] / "proto" / "minedraft" / "v1"


def proto_source() -> Path:
    """The repository's proto folder when present, else the .proto copies installed beside the stubs."""
    return REPO_PROTOS if _codegen.proto_files(REPO_PROTOS) else HERE


def ensure_stubs() -> None:
    """Regenerate the stubs if missing or stale; warn (not fail) if stale ones cannot be rebuilt."""
    source = proto_source()
    if not _codegen.proto_files(source) or _codegen.is_fresh(source, HERE):
        return
    try:
        _codegen.generate(source, HERE)
    except (ImportError, OSError) as exc:
        if all(p.exists() for p in _codegen.expected_outputs(_codegen.proto_files(source), HERE)):
            warnings.warn(f"minedraft gRPC stubs may be stale and cannot be regenerated: {exc}", stacklevel=2)
            return
        raise ImportError(
            f"minedraft gRPC stubs are missing and cannot be generated ({exc}); "
            "install grpcio-tools or reinstall minedraft with `pip install -e .`"
        ) from exc


ensure_stubs()
