"""The three services as local processes: what `minedraft serve`, the benchmarks and the tests start.

It lives beside the CLI because it runs the CLI: each service is a `python -m minedraft.cli.main
<service> ...` child with the service's own flags, in its own session (a terminal's Ctrl-C
reaches only the launcher, which forwards it). `supervise()` reaps children that exited and
restarts them with exponential backoff (the verifier's tensor-parallel ranks as one group), as
Kubernetes restarts a pod's containers; `stop()` sends SIGTERM to all of them at once, as
Kubernetes does, and waits for their drain.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A port free now, picked below the kernel's ephemeral range and never twice by this process: a port
    the kernel hands out (port 0) can be handed out again to another socket (a client connection, a gloo or
    store listener) before the child that was meant to bind it starts, and that child then dies on 'address
    in use'."""
    low = _ephemeral_low()
    for _ in range(200):
        port = _PICKS.randrange(max(1024, low - 12000), low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:  # that whole range is busy: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PICKS = random.Random()
_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


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
    admin_port: int = 0  # the batch manager's admin API (loopback); 0 = a free port
    drain_grace_s: float = 25.0  # what the services get as MINEDRAFT_DRAIN_GRACE_S
    api_key: str = ""  # the batch manager's accepted keys, comma-separated ("": none asked for)
    api_key_file: str = ""  # ... and a file of them, one a line
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = 0  # 0: the verifier device's default
    data_plane_backend: str = "gloo"
    log_dir: Path | None = None
    target_cpu: str = ""
    draft_cpu: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    process_env: dict[str, dict[str, str]] = field(default_factory=dict)  # by process name, e.g. {"draft": {...}}
    # Module run with `python -m` for the verifier and draft processes; the GPU benchmark swaps in
    # minedraft.bench.synthetic_workers (same flags, a synthetic model loader).
    worker_module: str = "minedraft.cli.main"
    draft_kind: str = "model"  # "eagle": `draft` is an EAGLE head folder for `target`


MAX_BACKOFF_S = 30.0
STABLE_S = 60.0  # a child that ran this long starts its backoff over
STOP_MARGIN_S = 15.0  # beyond the drain grace, before stop() kills what is left


@dataclass(slots=True)
class Restarts:
    """One group's crash history: when it may start again."""

    failures: int = 0
    due: float | None = None  # monotonic time of the next start; None while running

    def failed(self, ran_s: float) -> float:
        """Count a crash; returns the delay before the next start."""
        self.failures = 0 if ran_s >= STABLE_S else self.failures + 1
        delay = min(MAX_BACKOFF_S, 0.5 * 2 ** self.failures)
        self.due = time.monotonic() + delay
        return delay


class LocalStack:
    """Starts verifier, draft service and batch manager as separate processes."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.target_port = free_port()
        self.draft_port = free_port()
        self.admin_port = cfg.admin_port or free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self.started_at: dict[str, float] = {}
        self.restarts: dict[str, Restarts] = {}
        self.exits: list[tuple[str, int]] = []  # every exit supervise() reaped, in order

    def _spawn(self, name: str, args: list[str], module: str = "minedraft.cli.main",
               env_extra: dict[str, str] | None = None) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MINEDRAFT_DRAIN_GRACE_S": str(self.cfg.drain_grace_s),
               **self.cfg.extra_env, **(env_extra or {}), **self.cfg.process_env.get(name, {})}
        log = None
        if self.cfg.log_dir is not None:
            self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
            log = open(self.cfg.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=env, stdout=log, stderr=subprocess.STDOUT
            if log else None, start_new_session=True
        )
        self.started_at[name] = time.monotonic()

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
                "--tp-addr", tp_addr, *self._eagle("--draft-head", c.draft)], c.worker_module)

    def start_draft(self) -> None:
        c = self.cfg
        self._spawn("draft", ["draft", "--model", c.draft, "--host", "127.0.0.1", "--port", str(self.draft_port),
                              "--device", c.draft_device, "--threads", str(c.threads),
                              "--num-blocks", str(c.num_blocks), "--cpu", c.draft_cpu, "--dtype", c.dtype,
                              *self._eagle("--target-model", c.target)], c.worker_module)

    def _eagle(self, flag: str, folder: str) -> list[str]:
        """With an EAGLE head, what each worker needs to know of the other's model; nothing otherwise (so a
        process_env MINEDRAFT_DRAFT_KIND is not overridden)."""
        return ["--draft-kind", "eagle", flag, folder] if self.cfg.draft_kind == "eagle" else []

    def manager_command(self) -> tuple[list[str], dict[str, str]]:
        """The batch manager's arguments and the environment it gets beyond ours: an API key travels in the
        environment (MINEDRAFT_API_KEY), never on a command line that any local user can list."""
        c = self.cfg
        env = {"MINEDRAFT_API_KEY": c.api_key} if c.api_key else {}
        keys_file = ["--api-key-file", c.api_key_file] if c.api_key_file else []
        return [
            "batch-manager", "--tokenizer", c.tokenizer or c.target, "--host", c.host, "--grpc-port", str(c.grpc_port),
            "--http-port", str(c.http_port), "--mode", c.mode, "--k", str(c.k),
            "--max-num-seqs", str(c.max_num_seqs), "--data-plane-backend", c.data_plane_backend,
            "--admin-port", str(self.admin_port), "--max-num-batched-tokens", str(c.max_num_batched_tokens),
            "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching",
            "--verifier-address", f"127.0.0.1:{self.target_port}",
            "--draft-address", f"127.0.0.1:{self.draft_port}" if c.mode != "ar" else "", *keys_file,
        ], env

    def start_manager(self) -> None:
        args, env = self.manager_command()
        self._spawn("batch-manager", args, env_extra=env)

    def start(self, timeout: float = 120.0) -> None:
        self.start_verifier()
        if self.cfg.mode != "ar":
            self.start_draft()
        self.start_manager()
        self.wait_ready(timeout)

    def health(self) -> dict[str, object] | None:
        """GET /health while it answers 200 (ok or degraded); None otherwise."""
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

    def signal_all(self, sig: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, sig)

    def stop(self, grace: float | None = None) -> dict[str, int]:
        """SIGTERM to every service at once (they drain: the batch manager finishes what is in flight,
        the workers serve it until it closes their streams), wait up to `grace` (default: the drain
        grace plus a margin), then SIGKILL what is left. Returns each process's exit code."""
        grace = self.cfg.drain_grace_s + STOP_MARGIN_S if grace is None else grace
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        codes: dict[str, int] = {}
        for name in list(self.procs):
            proc = self.procs[name]
            try:
                codes[name] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(name)
                codes[name] = proc.returncode
        self.procs.clear()
        return codes

    def first_exit(self) -> tuple[str, int] | None:
        """A verifier or manager that died (the draft may come and go)."""
        for name, proc in self.procs.items():
            if name != "draft" and proc.poll() is not None:
                return name, proc.returncode
        return None

    def _group(self, name: str) -> str:
        return "verifier" if name.startswith("verifier") else name

    def _starter(self, group: str) -> Callable[[], None]:
        return {"verifier": self.start_verifier, "draft": self.start_draft, "batch-manager": self.start_manager}[group]

    def supervise(self) -> list[str]:
        """Reap children that exited and restart them, each group after its backoff (call it often).
        Returns what it did, one line per event, for the launcher's output."""
        events: list[str] = []
        now = time.monotonic()
        for name, proc in list(self.procs.items()):
            if name not in self.procs or proc.poll() is None:  # killed with its group above, or running
                continue
            group = self._group(name)
            for other in [n for n in self.procs if self._group(n) == group]:
                if other != name:
                    self.kill(other)  # a verifier rank alone cannot serve: restart all of them
            del self.procs[name]
            self.exits.append((name, proc.returncode))
            delay = self.restarts.setdefault(group, Restarts()).failed(now - self.started_at.get(name, now))
            events.append(f"{name} exited with code {proc.returncode}; restarting it in {delay:.1f} s")
        for group, history in self.restarts.items():
            if history.due is not None and now >= history.due:
                history.due = None
                self._starter(group)()
                events.append(f"{group} restarted (restart {history.failures or 1} in a row)")
        return events
