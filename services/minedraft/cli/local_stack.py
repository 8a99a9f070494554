"""The three services as local processes: what `minedraft serve`, the benchmarks and the tests start.

It lives beside the CLI because it runs the CLI: each service is a `python -m minedraft.cli.main
<service> ...` child with the service's own flags.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class StackConfig:
    target: str
    draft: str
    host: str = "127.0.0.1"
    grpc_port: int = 50051
    http_port: int = 8000
    target_device: str = "cpu"
    draft_device: str = "cpu"
    mode: str = "psd"
    k: int = 4
    threads: int = 1
    max_num_seqs: int = 64
    num_blocks: int = 4096
    dtype: str = "float32"
    tokenizer: str | None = None  # default: the target folder
    tp_size: int = 1  # tensor-parallel ranks of the target; target_device may list one device per rank
    data_plane_backend: str = "gloo"
    log_dir: Path | None = None
    target_cpu: str = ""
    draft_cpu: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    process_env: dict[str, dict[str, str]] = field(default_factory=dict)  # by process name, e.g. {"draft": {...}}
    # Module run with `python -m` for the verifier and draft processes; the GPU benchmark swaps in
    # minedraft.bench.synthetic_workers (same flags, a synthetic model loader).
    worker_module: str = "minedraft.cli.main"


class LocalStack:
    """Starts verifier, draft service and batch manager as separate processes."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.target_port = free_port()
        self.draft_port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}

    def _spawn(self, name: str, args: list[str], module: str = "minedraft.cli.main") -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.cfg.extra_env, **self.cfg.process_env.get(name, {})}
        log = None
        if self.cfg.log_dir is not None:
            self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
            log = open(self.cfg.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=env, stdout=log, stderr=subprocess.STDOUT
            if log else None, start_new_session=True
        )

    def start_verifier(self) -> None:
        c = self.cfg
        devices = c.target_device.split(",")
        tp_addr = f"127.0.0.1:{free_port()}"
        for rank in range(c.tp_size):
            device = devices[rank % len(devices)]
            self._spawn("verifier" if rank == 0 else f"verifier-tp{rank}", [
                "verifier", "--model", c.target, "--host", "127.0.0.1", "--port", str(self.target_port),
                "--device", device, "--threads", str(c.threads), "--num-blocks", str(c.num_blocks),
                "--cpu", c.target_cpu, "--dtype", c.dtype, "--tp-size", str(c.tp_size), "--tp-rank", str(rank),
                "--tp-addr", tp_addr], c.worker_module)

    def start_draft(self) -> None:
        c = self.cfg
        self._spawn("draft", ["draft", "--model", c.draft, "--host", "127.0.0.1", "--port", str(self.draft_port),
                              "--device", c.draft_device, "--threads", str(c.threads),
                              "--num-blocks", str(c.num_blocks), "--cpu", c.draft_cpu, "--dtype", c.dtype],
                    c.worker_module)

    def start_manager(self) -> None:
        c = self.cfg
        self._spawn("batch-manager", [
            "batch-manager", "--tokenizer", c.tokenizer or c.target, "--host", c.host, "--grpc-port", str(c.grpc_port),
            "--http-port", str(c.http_port), "--mode", c.mode, "--k", str(c.k),
            "--max-num-seqs", str(c.max_num_seqs), "--data-plane-backend", c.data_plane_backend,
            "--verifier-address", f"127.0.0.1:{self.target_port}",
            "--draft-address", f"127.0.0.1:{self.draft_port}" if c.mode != "ar" else "",
        ])

    def start(self, timeout: float = 120.0) -> None:
        self.start_verifier()
        if self.cfg.mode != "ar":
            self.start_draft()
        self.start_manager()
        self.wait_ready(timeout)

    def health(self) -> dict[str, object] | None:
        try:
            with urllib.request.urlopen(f"http://{self.cfg.host}:{self.cfg.http_port}/health", timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None and name != "draft":  # the draft may come and go
                    raise RuntimeError(f"{name} exited with code {proc.returncode} during start-up")
            if self.health() is not None:
                return
            time.sleep(0.2)
        raise TimeoutError("the stack did not become ready in time")

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self, grace: float = 10.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name in list(self.procs):
            proc = self.procs[name]
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(name)
        self.procs.clear()

    def first_exit(self) -> tuple[str, int] | None:
        """A verifier or manager that died (the draft may come and go)."""
        for name, proc in self.procs.items():
            if name != "draft" and proc.poll() is not None:
                return name, proc.returncode
        return None
