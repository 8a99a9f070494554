"""`minedraft verifier`: the target verifier service on its own (one process per TP rank)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import TYPE_CHECKING

from minedraft.worker.settings import DRAIN_MARGIN_S, add_worker_flags

if TYPE_CHECKING:
    from minedraft.engine.runner import ModelRunner
    from minedraft.engine.tensor_parallel import TPContext
    from minedraft.verifier.colocated import ColocatedDrafter
    from minedraft.worker.process import ModelLoader


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verifier", help="run the target verifier service (one process per TP rank)")
    add_worker_flags(p, "verifier")
    p.set_defaults(run=run)


def exit_if_rank0_never_stops(grace_s: float) -> None:
    """A rank > 0 leaves when rank 0 tells it to (after rank 0's drain); SIGTERM, which every
    container of the pod gets, only starts a watchdog in case rank 0 is gone."""

    def on_signal(*_: object) -> None:
        watchdog = threading.Timer(grace_s, lambda: os._exit(0))
        watchdog.daemon = True
        watchdog.start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


def colocated_drafter(args: argparse.Namespace, load: ModelLoader, target: ModelRunner) -> ColocatedDrafter | None:
    """--colocated-draft: the draft model (or EAGLE head) on rank 0's GPU, with its own KV cache of --num-blocks."""
    if not args.colocated_draft:
        return None
    if args.draft_kind == "eagle":
        from minedraft.engine.eagle_pair import head_beside
        from minedraft.engine.loader import parse_dtype
        from minedraft.verifier.colocated import ColocatedDrafter
        from minedraft.worker.process import capture_ahead

        drafter = head_beside(target.model, args.colocated_draft, args.num_blocks, args.block_size, args.device,
                              parse_dtype(args.dtype))
        capture_ahead(drafter.runner, args, scoring=False, name="colocated head")  # its feedback forwards
        return ColocatedDrafter(drafter)
    from minedraft.engine.drafter import Drafter
    from minedraft.engine.loader import parse_dtype
    from minedraft.engine.runner import ModelRunner
    from minedraft.verifier.colocated import ColocatedDrafter
    from minedraft.worker.process import capture_ahead

    model = load(args.colocated_draft, args.device, parse_dtype(args.dtype))
    logging.info("colocated draft %s on %s: standard SD without a draft service", args.colocated_draft, args.device)
    runner = ModelRunner(model, args.num_blocks, args.block_size, args.device)
    capture_ahead(runner, args, scoring=False, name="colocated draft")
    return ColocatedDrafter(Drafter(runner))


def target_runner(args: argparse.Namespace, tp: TPContext | None, load: ModelLoader, keeps: bool = True
                  ) -> ModelRunner:
    """The target's runner: with --draft-kind eagle one that captures what the head reads (rank 0 keeps and ships
    it; a tensor-parallel follower, `keeps` False, runs the same forwards so that its all-reduces match)."""
    from minedraft.worker.process import load_runner

    if args.draft_kind != "eagle":
        return load_runner(args, tp, load)
    from minedraft.engine.eagle_pair import capturing_runner
    from minedraft.engine.loader import parse_dtype
    from minedraft.worker.settings import draft_head_dir

    model = load(args.model, args.device, parse_dtype(args.dtype), tp=tp)
    return capturing_runner(model, draft_head_dir(args), args.num_blocks, args.block_size, args.device, keeps)


def run(args: argparse.Namespace, load: ModelLoader | None = None) -> int:
    # torch and the engine load here, not on import: `minedraft batch-manager`, whose image has
    # no torch, imports this module for its flags.
    import torch

    from minedraft.engine.loader import load_model
    from minedraft.engine.verifier import Verifier
    from minedraft.verifier.executor import VerifierExecutor
    from minedraft.verifier.tp_follower import follow
    from minedraft.worker.process import capture_ahead, prepare_process, run_worker
    from minedraft.worker.rendezvous import host_store
    from minedraft.worker.stall_watch import StallWatch
    from minedraft.worker.tp_group import KIND_STOP, TP_TIMEOUT_S, StepBroadcast, join_tp_group

    load = load or load_model
    prepare_process(args, "verifier" if args.tp_rank == 0 else f"verifier-tp{args.tp_rank}")
    tp = None
    channel = None
    if args.tp_size > 1:
        host, _, port = args.tp_addr.rpartition(":")
        tp, tp_store = join_tp_group(host, int(port), args.tp_rank, args.tp_size, torch.device(args.device))
        channel = StepBroadcast(tp, torch.device(args.device), tp_store)
    # On GPUs a dead peer leaves the survivors' all-reduces (replayed in CUDA graphs) waiting with no deadline;
    # on CPUs gloo reports it, and the watch never fires.
    stall = StallWatch(TP_TIMEOUT_S) if tp is not None else None
    if tp is not None and tp.rank > 0:
        assert channel is not None
        worker = Verifier(target_runner(args, tp, load, keeps=False))
        capture_ahead(worker.runner, args, scoring=True, name=f"verifier-tp{tp.rank}")  # in step with rank 0
        logging.info("tensor-parallel rank %d of %d following rank 0", tp.rank, tp.size)
        exit_if_rank0_never_stops(args.drain_grace_s + DRAIN_MARGIN_S)
        follow(worker, channel, f"verifier-tp{tp.rank}", stall)
        return 0

    def make_executor(runner: ModelRunner) -> VerifierExecutor:
        capture_ahead(runner, args, scoring=True, name="verifier")
        store = host_store(args.host, args.data_port)
        logging.info("data plane rendezvous store listening on %s:%d only", args.host, store.port)
        # auto: one GPU and a draft model; with tensor-parallel followers it has not paid yet, and with an EAGLE
        # head (whose states travel with each launched verdict too) it is not measured yet: "on" asks for it
        auto = runner.device.type == "cuda" and args.tp_size == 1 and args.draft_kind == "model"
        launch_ahead = args.launch_ahead == "on" or (args.launch_ahead == "auto" and auto)
        return VerifierExecutor(Verifier(runner), store, args.host, store.port, channel,
                                colocated_drafter(args, load, runner), launch_ahead, stall)

    try:
        return run_worker(args, "verifier", make_executor, tp, load, make_runner=lambda: target_runner(args, tp, load))
    finally:
        if channel is not None:
            channel.send(KIND_STOP)
