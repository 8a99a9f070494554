"""Keeps a worker process alive inside its container, so losing it does not make the pod NotReady.

Kubernetes counts a pod Ready only while every container is; a draft service that crashes and waits
in CrashLoopBackOff takes its replica out of the Service and of an endpoint picker's pool although
the batch manager keeps serving exactly without drafts. With `--supervise` the container's process is
this supervisor instead: it runs the worker as a child, restarts it when it exits (backing off from
1 s to a minute, reset after a healthy stretch) and when it stops answering grpc.health.v1 (the
kubelet's liveness probe would otherwise restart the whole container), and on SIGTERM passes the
signal on and exits with the child's status. The batch manager brings the restarted worker back into
the loop by itself. No torch here: the child loads the model.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger("minedraft.supervisor")


@dataclass(frozen=True, slots=True)
class SupervisorTimings:
    """How patient the supervisor is; the defaults suit a model that loads in minutes."""

    startup_s: float = 1800.0  # a child that never answers SERVING within this is restarted
    check_every_s: float = 10.0
    check_timeout_s: float = 5.0
    failures_to_restart: int = 3  # consecutive failed checks of a child that was serving
    first_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    healthy_reset_s: float = 300.0  # serving this long resets the backoff


def health_ok(address: str, timeout_s: float) -> bool:
    """One grpc.health.v1 check of the whole server ("")."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                              timeout=timeout_s)
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


class WorkerSupervisor:
    """Runs `command` until SIGTERM, restarting it as described in the module docstring."""

    def __init__(self, command: Sequence[str], env: dict[str, str], health_address: str, name: str,
                 timings: SupervisorTimings | None = None,
                 check: Callable[[str, float], bool] = health_ok) -> None:
        self.command = list(command)
        self.env = env
        self.health_address = health_address
        self.name = name
        self.timings = timings or SupervisorTimings()
        self.check = check
        self.stopping = threading.Event()
        self.restarts = 0
        self.backoffs: deque[float] = deque(maxlen=64)  # the waits before the latest restarts (seconds)
        self.child: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        """SIGTERM/SIGINT: pass the signal to the running child (it drains) and restart nothing more."""
        self.stopping.set()
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def run(self) -> int:
        backoff = self.timings.first_backoff_s
        while True:
            started = time.monotonic()
            code, why = self._run_once()
            if self.stopping.is_set():
                log.info("%s: stopped (%s)", self.name, why)
                return code
            if time.monotonic() - started >= self.timings.healthy_reset_s:
                backoff = self.timings.first_backoff_s
            self.restarts += 1
            self.backoffs.append(backoff)
            log.warning("%s %s; restarting in %.3g s (restart %d)", self.name, why, backoff, self.restarts)
            if self.stopping.wait(backoff):
                return 0
            backoff = min(backoff * 2, self.timings.max_backoff_s)

    def _run_once(self) -> tuple[int, str]:
        """Start the child and watch it; returns (exit status, why it ended)."""
        child = self.child = subprocess.Popen(self.command, env=self.env)
        if self.stopping.is_set():  # a signal raced the start
            child.send_signal(signal.SIGTERM)
        t = self.timings
        born, serving, failures = time.monotonic(), False, 0
        while True:
            try:
                code = child.wait(timeout=t.check_every_s)
                return code, f"exited with {code}"
            except subprocess.TimeoutExpired:
                pass
            if self.stopping.is_set():
                continue  # draining: the child exits by itself
            healthy = self.check(self.health_address, t.check_timeout_s)
            if healthy:
                serving, failures = True, 0
                continue
            failures += 1
            hung = serving and failures >= t.failures_to_restart
            never_up = not serving and time.monotonic() - born > t.startup_s
            if hung or never_up:
                child.kill()
                child.wait()
                what = f"stopped answering health checks ({failures} in a row)" if hung else \
                    f"did not become ready within {t.startup_s:.0f} s"
                return -signal.SIGKILL, f"{what}: killed"


def child_command(argv: Sequence[str]) -> list[str]:
    """This worker's own command line, run again by the same interpreter, less --supervise (the child
    does not supervise; its environment says MINEDRAFT_SUPERVISE=0)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--supervise":
            skip = True
        elif not arg.startswith("--supervise="):
            kept.append(arg)
    return [sys.executable, "-m", "minedraft.cli.main", *kept]


def supervise(argv: Sequence[str], health_address: str, name: str, startup_s: float) -> int:
    """Entry point of a worker started with --supervise: `argv` are its own arguments."""
    env = {**os.environ, "MINEDRAFT_SUPERVISE": "0"}
    supervisor = WorkerSupervisor(child_command(argv), env, health_address, name,
                                  SupervisorTimings(startup_s=startup_s))
    supervisor.install_signal_handlers()
    return supervisor.run()
