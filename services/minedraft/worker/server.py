"""gRPC control server shared by the draft service and the verifier.

Plans arrive on a bidi stream and are executed in order by one loop thread; the loop
never waits on gRPC except to read the next plan, and the batch manager keeps plans
queued ahead of it. Events go back through a queue the gRPC handler drains.

Shutting down (SIGTERM) is a drain: health turns NOT_SERVING and new streams are refused,
but a batch manager already connected keeps being served until it closes its stream (it
does so after its own drain, after the last step), then the process exits 0.
"""

from __future__ import annotations

import cProfile
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minedraft.observability import control_trace
from minedraft.observability.worker_telemetry import WorkerTelemetry
from minedraft.proto import control_pb2, control_pb2_grpc
from minedraft.worker.torch_profile import StepProfiler

log = logging.getLogger(__name__)
PROFILE_ENV = "MINEDRAFT_PROFILE_DIR"
LOOP_EXIT_TIMEOUT_S = 60.0  # a step blocked on the data plane gives up within its own timeout
PROFILE_FROM_ENV = "MINEDRAFT_PROFILE_FROM_STEP"


class StepExecutor(Protocol):
    role: str
    device: torch.device

    def handle_plan(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent: ...

    def handle_setup(self, setup: control_pb2.DataPlaneSetup) -> control_pb2.WorkerEvent: ...

    def reset(self) -> None: ...

    def info(self) -> control_pb2.WorkerInfo: ...

    def graph_capture_ms(self) -> float: ...


class WorkerServicer(control_pb2_grpc.WorkerServicer):
    """One batch manager at a time drives the executor; a new stream resets its state."""

    def __init__(self, executor: StepExecutor, telemetry: WorkerTelemetry | None = None) -> None:
        self.executor = executor
        self.telemetry = telemetry
        self._lock = threading.Lock()  # held for the whole life of a batch manager's stream
        self._draining = threading.Event()

    def Info(self, request: control_pb2.InfoRequest, context: grpc.ServicerContext) -> control_pb2.WorkerInfo:
        info = self.executor.info()
        info.manager_connected = self._lock.locked()
        return info

    def Control(
        self, request_iterator: Iterator[control_pb2.ControlMessage], context: grpc.ServicerContext
    ) -> Iterator[control_pb2.WorkerEvent]:
        if self._draining.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "this worker is shutting down")
        if not self._lock.acquire(blocking=False):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "another batch manager is already connected")
        loop: threading.Thread | None = None
        try:
            self.executor.reset()
            events: queue.Queue[control_pb2.WorkerEvent | None] = queue.Queue()
            loop = threading.Thread(target=self._run, args=(request_iterator, events), daemon=True)
            loop.start()
            while (event := events.get()) is not None:
                control_trace.mark("out", event.step)
                yield event
                control_trace.mark("sent", event.step)
        finally:
            # A cancelled stream can leave the loop inside a step: let it finish before the
            # reset frees its sequences and closes its data plane under it.
            if loop is not None:
                loop.join(timeout=LOOP_EXIT_TIMEOUT_S)
            self.executor.reset()
            self._lock.release()

    def drain(self, grace_s: float) -> bool:
        """Refuse new streams; wait up to `grace_s` for the connected batch manager to close its
        stream (and its last step to end). True when it did."""
        self._draining.set()
        deadline = time.monotonic() + grace_s
        while self._lock.locked() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._lock.locked()

    def _run(self, messages: Iterator[control_pb2.ControlMessage], events: queue.Queue) -> None:
        bind_thread_to_device(self.executor.device)
        control_trace.set_role(self.executor.role)
        profiler = start_host_profile()
        window = StepProfiler.from_env(self.executor.role, self.executor.device)
        idle_since: float | None = None
        inbox = Inbox(messages, getattr(self.executor, "abort_data_plane", None))
        if hasattr(self.executor, "upcoming"):
            self.executor.upcoming = inbox.next_plan  # either worker may launch the next plan ahead
        try:
            while (msg := inbox.get()) is not None:
                kind = msg.WhichOneof("body")
                if kind == "plan":
                    control_trace.mark("begin", msg.plan.step)
                    waited = (time.perf_counter() - idle_since) * 1000.0 if idle_since is not None else 0.0
                    queued = inbox.queued_ms(msg.plan.step)
                    if profiler is not None and msg.plan.step == profile_from_step():
                        profiler.enable()
                    started_ns = time.time_ns()
                    captured_before = self.executor.graph_capture_ms()
                    if window is not None:
                        window.before_step(msg.plan.step)
                    event = self.executor.handle_plan(msg.plan)
                    if window is not None:
                        window.after_step()
                    event.timing.plan_wait_ms = waited
                    event.timing.plan_queued_ms = queued
                    event.timing.graph_capture_ms = self.executor.graph_capture_ms() - captured_before
                    if self.telemetry is not None:
                        self.telemetry.step(msg.plan, event, started_ns, time.time_ns())
                    events.put(event)
                    control_trace.mark("end", msg.plan.step)
                    idle_since = time.perf_counter()
                elif kind == "setup":
                    events.put(self.executor.handle_setup(msg.setup))
            if inbox.closed_by_peer:
                log.info("batch manager stream closed")
        except Exception as exc:
            log.exception("worker loop failed")
            events.put(control_pb2.WorkerEvent(error=f"{type(exc).__name__}: {exc}"))
        finally:
            if profiler is not None:
                dump_host_profile(profiler, self.executor.role)
            control_trace.flush()
            events.put(None)


class Inbox:
    """The batch manager's messages, read by a thread of their own so the loop can see the next plan
    (`next_plan`) while it still works on the current one."""

    def __init__(self, messages: Iterator[control_pb2.ControlMessage],
                 on_abort: Callable[[control_pb2.DataPlaneAbort], None] | None = None) -> None:
        self.queue: queue.Queue[control_pb2.ControlMessage | None] = queue.Queue()
        self.arrived: dict[int, float] = {}  # plan step -> when the reader took it off the stream
        self.closed_by_peer = False
        self.on_abort = on_abort  # runs on the reader thread as the message arrives, ahead of queued plans
        threading.Thread(target=self._read, args=(messages,), daemon=True).start()

    def _read(self, messages: Iterator[control_pb2.ControlMessage]) -> None:
        try:
            for msg in messages:
                kind = msg.WhichOneof("body")
                if kind == "abort":
                    if self.on_abort is not None:
                        self.on_abort(msg.abort)
                    continue
                if kind == "plan":
                    control_trace.mark("arrive", msg.plan.step)
                    self.arrived[msg.plan.step] = time.perf_counter()
                self.queue.put(msg)
            self.closed_by_peer = True
        except grpc.RpcError:
            self.closed_by_peer = True
        except Exception:
            log.exception("reading the control stream failed")
        finally:
            self.queue.put(None)

    def get(self) -> control_pb2.ControlMessage | None:
        return self.queue.get()

    def queued_ms(self, step: int) -> float:
        """How long the plan of `step` has been waiting here (taken once, as its step begins)."""
        arrived = self.arrived.pop(step, None)
        return (time.perf_counter() - arrived) * 1000.0 if arrived is not None else 0.0

    def next_plan(self) -> control_pb2.StepPlan | None:
        """The plan after the current one when it has already arrived (None otherwise); never blocks."""
        with self.queue.mutex:
            head = self.queue.queue[0] if self.queue.queue else None
        return head.plan if head is not None and head.WhichOneof("body") == "plan" else None


def start_host_profile() -> cProfile.Profile | None:
    """With MINEDRAFT_PROFILE_DIR set, profile the loop thread's Python (where a step's host
    time goes) from step MINEDRAFT_PROFILE_FROM_STEP on; the stats are written when the batch
    manager's stream ends."""
    if not os.environ.get(PROFILE_ENV):
        return None
    return cProfile.Profile()


def profile_from_step() -> int:
    """Steps before this one (warm-up, graph capture) stay out of the profile."""
    return int(os.environ.get(PROFILE_FROM_ENV, "0"))


def dump_host_profile(profiler: cProfile.Profile, role: str) -> None:
    profiler.disable()
    folder = Path(os.environ[PROFILE_ENV])
    folder.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(folder / f"{role}-{os.getpid()}.pstats"))


def bind_thread_to_device(device: torch.device) -> None:
    """The CUDA current device is per host thread: the loop thread must select the worker's GPU,
    or kernels launch against GPU 0 with pointers on another GPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


@dataclass(slots=True)
class WorkerServer:
    """The control server, its health service and (optionally) a health-only server for probes."""

    server: grpc.Server
    port: int
    servicer: WorkerServicer
    health: health.HealthServicer
    probe_server: grpc.Server | None = None

    def shutdown(self, grace_s: float) -> bool:
        """NOT_SERVING, then serve the connected batch manager until it leaves (up to `grace_s`), then
        stop. True when it left in time (a clean drain)."""
        self.health.enter_graceful_shutdown()
        clean = self.servicer.drain(grace_s)
        for server in (self.server, self.probe_server):
            if server is not None:
                server.stop(grace=2).wait()
        return clean


def serve_worker(executor: StepExecutor, host: str, port: int, telemetry: WorkerTelemetry | None = None,
                 health_host: str = "0.0.0.0", health_port: int = 0) -> WorkerServer:
    """Start the control server (with gRPC health checking) on host:port, and with `health_port`
    a second server answering only grpc.health.v1 there (the control port can stay on loopback
    while the kubelet probes the pod IP)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    servicer = WorkerServicer(executor, telemetry)
    control_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the control port {host}:{port}")
    probe_server = None
    if health_port:
        probe_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, probe_server)
        if probe_server.add_insecure_port(f"{health_host}:{health_port}") == 0:
            raise OSError(f"cannot bind the health port {health_host}:{health_port}")
        probe_server.start()
    server.start()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return WorkerServer(server, bound, servicer, health_servicer, probe_server)
