"""`minedraft draft`: the draft service on its own."""

from __future__ import annotations

import argparse

from minedraft.draft_service.executor import DraftExecutor
from minedraft.engine.drafter import Drafter
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.worker.process import ModelLoader, prepare_process, run_worker
from minedraft.worker.settings import add_worker_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("draft", help="run the draft service")
    add_worker_flags(p, "draft")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, load: ModelLoader = load_model) -> int:
    def make_executor(runner: ModelRunner) -> DraftExecutor:
        return DraftExecutor(Drafter(runner))

    prepare_process(args, "draft service")
    return run_worker(args, "draft service", make_executor, load=load)
