"""`minedraft verifier`: the target verifier service on its own."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

import torch

from minedraft.engine.loader import load_model, parse_dtype
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import TargetWorker
from minedraft.verifier.executor import VerifierExecutor
from minedraft.worker.data_plane import host_store
from minedraft.worker.server import serve_worker
from minedraft.worker.settings import add_worker_flags, pin_cpus


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verifier", help="run the target verifier service")
    add_worker_flags(p, "target")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s verifier %(levelname)s %(message)s")
    pin_cpus(args.cpu)
    if args.threads:
        torch.set_num_threads(args.threads)
    select_device(args.device)
    model = load_model(args.model, args.device, parse_dtype(args.dtype))
    worker = TargetWorker(ModelRunner(model, args.num_blocks, args.block_size, args.device))
    store = host_store(args.host, args.data_port)
    executor = VerifierExecutor(worker, store, args.host, store.port)
    server, port = serve_worker(executor, args.host, args.port)
    logging.info("verifier ready on %s:%d (data plane store %s:%d)", args.host, port, args.host, store.port)
    wait_for_signal()
    server.stop(grace=2).wait()
    return 0


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
