"""`minedraft verifier`: the target verifier service on its own."""

from __future__ import annotations

import argparse
import logging

from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import TargetWorker
from minedraft.verifier.executor import VerifierExecutor
from minedraft.worker.data_plane import host_store
from minedraft.worker.process import run_worker
from minedraft.worker.settings import add_worker_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verifier", help="run the target verifier service")
    add_worker_flags(p, "target")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    def make_executor(runner: ModelRunner) -> VerifierExecutor:
        store = host_store(args.host, args.data_port)
        logging.info("data plane rendezvous store on %s:%d", args.host, store.port)
        return VerifierExecutor(TargetWorker(runner), store, args.host, store.port)

    return run_worker(args, "verifier", make_executor)
