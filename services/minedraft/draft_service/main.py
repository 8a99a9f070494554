"""`minedraft draft`: the draft service on its own."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from minedraft.worker.settings import add_worker_flags

if TYPE_CHECKING:
    from minedraft.engine.eagle_loader import TargetShared
    from minedraft.worker.process import ModelLoader


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("draft", help="run the draft service")
    add_worker_flags(p, "draft")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, load: ModelLoader | None = None, shared: TargetShared | None = None) -> int:
    """`load` builds --model (a draft model); `shared` gives an EAGLE head what it shares with --target-model
    (default: read from the target's folder). The GPU benchmark injects both for its synthetic pair."""
    if args.supervise:
        return _supervised(args)
    # torch and the engine load here, not on import: `minedraft batch-manager`, whose image has
    # no torch, imports this module for its flags.
    from minedraft.draft_service.executor import DraftExecutor
    from minedraft.engine.drafter import Drafter
    from minedraft.engine.loader import load_model
    from minedraft.engine.runner import ModelRunner
    from minedraft.worker.process import capture_ahead, prepare_process, run_worker

    eagle = args.draft_kind == "eagle"

    def make_executor(runner: ModelRunner) -> DraftExecutor:
        if eagle:  # launch-ahead only when asked (`auto` keeps a head's drafts behind the verdict's readback)
            from minedraft.engine.eagle_drafter import EagleDrafter
            from minedraft.engine.eagle_runner import EagleRunner

            assert isinstance(runner, EagleRunner)
            capture_ahead(runner, args, scoring=False, name="draft service")  # the head's forwards
            return DraftExecutor(EagleDrafter(runner), launch_ahead=args.launch_ahead == "on")
        launch_ahead = args.launch_ahead == "on" or (args.launch_ahead == "auto" and runner.device.type == "cuda")
        capture_ahead(runner, args, scoring=False, name="draft service")
        return DraftExecutor(Drafter(runner), launch_ahead)

    def head_runner() -> ModelRunner:
        from minedraft.engine.eagle_loader import target_shared
        from minedraft.engine.eagle_pair import head_drafter
        from minedraft.engine.loader import parse_dtype

        return head_drafter(args.model, args.target_model, args.num_blocks, args.block_size, args.device,
                            parse_dtype(args.dtype), shared or target_shared).runner

    prepare_process(args, "draft service")
    return run_worker(args, "draft service", make_executor, load=load or load_model,
                      make_runner=head_runner if eagle else None)


def _supervised(args: argparse.Namespace) -> int:
    from minedraft.observability.logs import configure_logging
    from minedraft.worker.supervisor import supervise

    configure_logging("draft supervisor")
    if args.health_port:
        host = "127.0.0.1" if args.health_host in ("0.0.0.0", "") else args.health_host
        address = f"{host}:{args.health_port}"
    else:
        address = f"{args.host}:{args.port}"
    return supervise(args.argv, address, "draft service", args.startup_s)
