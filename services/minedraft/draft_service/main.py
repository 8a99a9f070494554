"""`minedraft draft`: the draft service on its own."""

from __future__ import annotations

import argparse
import logging

import torch

from minedraft.draft_service.executor import DraftExecutor
from minedraft.engine.drafter import DraftWorker
from minedraft.engine.loader import load_model, parse_dtype
from minedraft.engine.runner import ModelRunner
from minedraft.verifier.main import select_device, wait_for_signal
from minedraft.worker.server import serve_worker
from minedraft.worker.settings import add_worker_flags, pin_cpus


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("draft", help="run the draft service")
    add_worker_flags(p, "draft")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s draft %(levelname)s %(message)s")
    pin_cpus(args.cpu)
    if args.threads:
        torch.set_num_threads(args.threads)
    select_device(args.device)
    model = load_model(args.model, args.device, parse_dtype(args.dtype))
    worker = DraftWorker(ModelRunner(model, args.num_blocks, args.block_size, args.device))
    server, port = serve_worker(DraftExecutor(worker), args.host, args.port)
    logging.info("draft service ready on %s:%d", args.host, port)
    wait_for_signal()
    server.stop(grace=2).wait()
    return 0
