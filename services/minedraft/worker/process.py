"""Start-up and shutdown shared by the verifier and draft service processes."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Protocol

import torch
from prometheus_client import start_http_server

from minedraft.batch_manager.config import ManagerConfig
from minedraft.engine.blas_plan import PLAN
from minedraft.engine.loader import load_model, parse_dtype
from minedraft.engine.model import CausalLM
from minedraft.engine.runner import ModelRunner
from minedraft.engine.tensor_parallel import TPContext
from minedraft.observability.logs import configure_logging
from minedraft.observability.tracing import tracer_from_env
from minedraft.observability.worker_telemetry import WorkerTelemetry
from minedraft.worker.nccl_report import nccl_log
from minedraft.worker.server import StepExecutor, serve_worker
from minedraft.worker.settings import DRAIN_MARGIN_S, pin_cpus


def select_device(device: str) -> None:
    """NCCL needs each process's current CUDA device set before the data plane forms."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))


def wait_for_signal() -> None:
    """Block until SIGTERM/SIGINT; Kubernetes sends SIGTERM to drain."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


def prepare_process(args: argparse.Namespace, name: str) -> None:
    configure_logging(name)
    if args.device.startswith("cuda"):
        nccl_log()  # NCCL reads its debug settings once: before any group forms (TP ranks form one early)
    pin_cpus(args.cpu)
    if args.threads:
        torch.set_num_threads(args.threads)
    select_device(args.device)
    if args.device.startswith("cuda"):
        PLAN.configure(args.blas)


class ModelLoader(Protocol):
    """Builds the model `--model` names. The product loads Hugging Face folders (`load_model`);
    the GPU benchmark injects its synthetic pair (`minedraft.bench.synthetic_workers`)."""

    def __call__(self, model: str, device: str, dtype: torch.dtype, /, *, tp: TPContext | None = None) -> CausalLM: ...


def load_runner(args: argparse.Namespace, tp: TPContext | None = None, load: ModelLoader = load_model) -> ModelRunner:
    model: CausalLM = load(args.model, args.device, parse_dtype(args.dtype), tp=tp)
    return ModelRunner(model, args.num_blocks, args.block_size, args.device)


def capture_ahead(runner: ModelRunner, args: argparse.Namespace, scoring: bool, name: str) -> None:
    """--capture-batch: every steady step's CUDA graph now, before the first request (runner.capture_ahead).
    A verifier also captures TETRIS's packed verifies for the policy's default tetris_extra and
    tetris_min_batch (the live policy is the batch manager's: a verifier starts before it knows it; other
    values run those verifies eagerly). Each fixed-width graph keeps its float32 logits (the packed ones share
    one buffer), so the memory they take is logged with them."""
    if args.capture_batch <= 0 or runner.device.type != "cuda":
        return
    policy = ManagerConfig()
    # an EAGLE verifier's step is its own (engine/hidden_capture.py): no packed verifies on rank 0, so none on its
    # tensor-parallel followers either (their captures must match rank 0's all-reduce for all-reduce)
    packed = scoring and getattr(args, "draft_kind", "model") != "eagle"
    selection = (policy.tetris_extra, policy.tetris_min_batch) if packed else None
    packed_graphs = runner.packed_graphs
    started, reserved = time.monotonic(), torch.cuda.memory_reserved(runner.device)
    packed_before = len(packed_graphs.steps) if packed_graphs is not None else 0
    captured = runner.capture_ahead(args.capture_batch, args.capture_k, scoring, selection)
    if captured:
        grown_gb = (torch.cuda.memory_reserved(runner.device) - reserved) / 2**30
        new_packed = (len(packed_graphs.steps) if packed_graphs is not None else 0) - packed_before
        tetris = (f"; {new_packed} of them TETRIS packed verifies, tetris_extra {selection[0]}, batches >= "
                  f"{selection[1]}" if selection is not None and new_packed else "")
        logging.info("%s: %d CUDA graphs captured (up to %d sequences, k <= %d%s) in %.1f s, %.2f GiB more reserved",
                     name, captured, args.capture_batch, args.capture_k, tetris, time.monotonic() - started,
                     grown_gb)


def worker_telemetry(args: argparse.Namespace, executor: StepExecutor) -> WorkerTelemetry | None:
    """Metrics on --metrics-port and sampled step spans when OTEL_* asks; None (no cost) when neither."""
    tracer = tracer_from_env(f"minedraft-{executor.role}")
    if not args.metrics_port and tracer is None:
        return None
    telemetry = WorkerTelemetry(executor.role, executor.info, tracer, args.trace_step_every)
    if args.metrics_port:
        host = args.metrics_host or args.host
        start_http_server(args.metrics_port, host, registry=telemetry.registry)
        logging.info("metrics on http://%s:%d/metrics", host, args.metrics_port)
    return telemetry


def describe_weights(runner: ModelRunner) -> str:
    """What the worker serves, for its log: the model's class, layers, device and weight format (an FP8
    checkpoint that loaded as FP8 says so)."""
    model = runner.model
    cfg = getattr(model, "config", None)
    quant = getattr(cfg, "quantization", None)
    dtype = next(model.parameters()).dtype
    form = f"FP8 ({quant.scheme} scales), the rest {dtype}" if quant is not None else str(dtype)
    layers = getattr(cfg, "num_layers", "?")
    return f"{type(model).__name__} (decoder layers: {layers}) on {runner.device}, weights {form}"


def run_worker(
    args: argparse.Namespace, name: str, make_executor: Callable[[ModelRunner], StepExecutor],
    tp: TPContext | None = None, load: ModelLoader = load_model,
    make_runner: Callable[[], ModelRunner] | None = None,
) -> int:
    """Load the model (`make_runner` when the runner is not the plain one), serve the control plane until a
    signal, then drain: keep serving the connected batch manager until it closes its stream (it drains
    first), and exit 0."""
    runner = make_runner() if make_runner is not None else load_runner(args, tp, load)
    logging.info("%s: %s", name, describe_weights(runner))
    executor = make_executor(runner)
    server = serve_worker(executor, args.host, args.port, worker_telemetry(args, executor), args.health_host,
                          args.health_port)
    probes = f", health also on {args.health_host}:{args.health_port}" if args.health_port else ""
    logging.info("%s ready on %s:%d%s", name, args.host, server.port, probes)
    wait_for_signal()
    started = time.monotonic()
    logging.info("%s: shutting down once the batch manager has closed its stream", name)
    clean = server.shutdown(args.drain_grace_s + DRAIN_MARGIN_S)
    logging.info("%s: stopped after %.1f s (%s)", name, time.monotonic() - started,
                 "drained" if clean else "the batch manager did not close its stream in time")
    return 0
