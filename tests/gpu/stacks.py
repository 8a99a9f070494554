"""The three services on the bundled pair across two GPUs (NCCL data plane, fp32), as the GPU tests start them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port


def two_gpu_stack(logs: Path, **fields: object) -> LocalStack:
    """PSD with k = 4: the verifier on GPU 0 and the draft service on GPU 1 unless `fields` say otherwise."""
    nccl_env = {k: v for k, v in os.environ.items() if k.startswith("TORCH_NCCL_")}
    settings: dict[str, object] = {
        "target_device": "cuda:0", "draft_device": "cuda:1", "mode": "psd", "k": 4, "num_blocks": 1024,
        "dtype": "float32", "data_plane_backend": "nccl", "log_dir": logs,
        "extra_env": {"NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"), **nccl_env}, **fields}
    return LocalStack(StackConfig(target=str(TINY_TARGET), draft=str(TINY_DRAFT), grpc_port=free_port(),
                                  http_port=free_port(), **settings))  # type: ignore[arg-type]


@contextmanager
def running(stack: LocalStack, show_logs: bool = False, timeout: float = 240) -> Iterator[LocalStack]:
    """Started, then stopped; the tail of every service's log is printed on failure (always with `show_logs`)."""
    failed = False
    try:
        stack.start(timeout=timeout)
        yield stack
    except BaseException:
        failed = True
        raise
    finally:
        if (failed or show_logs) and stack.cfg.log_dir is not None:
            for f in sorted(Path(stack.cfg.log_dir).glob("*.log")):
                print(f"--- {f.name}\n" + "\n".join(f.read_text(errors="ignore").splitlines()[-25:]))
        stack.stop()
