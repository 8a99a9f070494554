"""One fresh stack per arm of a serving comparison (caching on / off, chunked / unchunked), all started
together and stopped together, so no arm inherits another's warm cache and the model loads overlap.

- cpu: the bundled tiny pair in PSD, verifier and draft service pinned to cores 0 and 1 with one torch
  thread each, as `minedraft bench psd` runs it;
- cuda: the peaked synthetic Llama-3-8B-shaped pair in bf16 at a set acceptance, every CUDA graph captured
  at start-up so no timed request pays for a capture; placed `colocated` (one GPU, standard SD with the draft
  model beside the target in the verifier) or `psd` (the verifier on GPU 0, the draft service on GPU 1, PSD
  over NCCL: each arm's stack takes both GPUs, the idle one waiting on its plan streams).
An idle stack's workers wait on their plan streams, so the arm not being measured costs the other nothing.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port

SD_K = 4
W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class Arm:
    """What one side of the comparison sets on its batch manager."""

    name: str
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = 0  # 0: the verifier device's default


def cpu_stack(arm: Arm, max_num_seqs: int, num_blocks: int) -> LocalStack:
    cfg = StackConfig(target=str(TINY_TARGET), draft=str(TINY_DRAFT), grpc_port=free_port(), http_port=free_port(),
                      mode="psd", k=SD_K, threads=1, max_num_seqs=max_num_seqs, num_blocks=num_blocks,
                      target_cpu="0", draft_cpu="1", enable_prefix_caching=arm.enable_prefix_caching,
                      max_num_batched_tokens=arm.max_num_batched_tokens,
                      log_dir=Path(tempfile.mkdtemp(prefix="minedraft_arm_")))
    return LocalStack(cfg)


def cuda_stack(arm: Arm, max_num_seqs: int, num_blocks: int, acceptance: float, placement: str = "colocated"
               ) -> LocalStack:
    from minedraft.bench.gpu.placements import PairSpecs, colocated_stack, split_stack
    from minedraft.bench.peaked_head import agree_for_acceptance
    from minedraft.bench.synthetic_pair import SyntheticSpec

    target, draft = SyntheticSpec("llama3-8b", "target", 0.02, 4, agree_for_acceptance(acceptance, SD_K)).pair()
    place = {"colocated": colocated_stack, "psd": split_stack}[placement]
    stack = place(PairSpecs(str(target), str(draft)), num_blocks, max_num_seqs, capture_k=SD_K)
    stack.cfg.enable_prefix_caching = arm.enable_prefix_caching
    stack.cfg.max_num_batched_tokens = arm.max_num_batched_tokens
    return stack


def placed(args: argparse.Namespace) -> str:
    """Where the arms ran, for the benchmark's header line."""
    if args.device != "cuda":
        return "device cpu (PSD on two cores)"
    return {"colocated": "device cuda, SD colocated on one GPU",
            "psd": "device cuda, PSD: verifier on GPU 0, draft service on GPU 1"}[args.placement]


def build(device: str, arms: list[Arm], max_num_seqs: int, num_blocks: int, acceptance: float,
          placement: str = "colocated") -> list[LocalStack]:
    if device == "cuda":
        return [cuda_stack(arm, max_num_seqs, num_blocks, acceptance, placement) for arm in arms]
    return [cpu_stack(arm, max_num_seqs, num_blocks) for arm in arms]


def colocated(stack: LocalStack) -> bool:
    return "MINEDRAFT_COLOCATED_DRAFT" in stack.cfg.process_env.get("verifier", {})


def compare(args: argparse.Namespace, arms: list[Arm], max_num_seqs: int, warm_up: Callable[[LocalStack], None],
            workload: Callable[[], W], measure: Callable[[LocalStack, W], dict]) -> dict[str, list[dict]]:
    """One stack per arm, each warmed up; then every round a fresh `workload()` measured on every arm, the
    arms' order alternating. Returns each arm's results, round by round."""
    stacks = build(args.device, arms, max_num_seqs, args.num_blocks, args.acceptance, args.placement)
    raw: dict[str, list[dict]] = {arm.name: [] for arm in arms}
    exit_on_sigterm()
    started = time.perf_counter()
    start_all(stacks, timeout=600)
    try:
        print(f"stacks ready in {time.perf_counter() - started:.0f} s", flush=True)
        for stack in stacks:
            warm_up(stack)
        for rnd in range(args.rounds):
            work = workload()
            for arm, stack in list(zip(arms, stacks, strict=True))[:: 1 if rnd % 2 == 0 else -1]:
                raw[arm.name].append(measure(stack, work))
    finally:
        stop_all(stacks)
    return raw


def exit_on_sigterm() -> None:
    """A SIGTERM (`timeout`'s) exits through the benchmark's `finally`, which stops its stacks: their processes
    run in sessions of their own and would outlive it, holding their memory."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def start_all(stacks: list[LocalStack], timeout: float) -> None:
    """Every stack's processes first, then wait for each: their models load at the same time."""
    for stack in stacks:
        stack.start_verifier()
        if not colocated(stack):
            stack.start_draft()
        stack.start_manager()
    try:
        for stack in stacks:
            stack.wait_ready(timeout)
    except BaseException:
        print_log_tails(stacks)
        stop_all(stacks)
        raise


def stop_all(stacks: list[LocalStack]) -> None:
    for stack in stacks:
        stack.signal_all(signal.SIGTERM)
    for stack in stacks:
        stack.stop(grace=30)


def print_log_tails(stacks: list[LocalStack], lines: int = 15) -> None:
    """Where a stack failed to start, what its processes said last."""
    for stack in stacks:
        folder = stack.cfg.log_dir
        for log in sorted(folder.glob("*.log")) if folder else []:
            print(f"--- {log}")
            print("\n".join(log.read_text(errors="ignore").splitlines()[-lines:]))


def prefix_stats(health: dict) -> dict[str, dict[str, int]]:
    """/health's prefix-cache counts (tokens) of both models, when the batch manager reports them."""
    section = health.get("prefix_cache") or {}
    return {model: {key: int((section.get(model) or {}).get(key, 0)) for key in ("queries", "hits")}
            for model in ("target", "draft")}


def stats_delta(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {m: {k: after[m][k] - before[m][k] for k in after[m]} for m in after}


def flags_of(args: argparse.Namespace, add_flags: Callable[[argparse.ArgumentParser], None]) -> dict[str, object]:
    """The benchmark's own flags for a results file: the namespace also holds the `minedraft bench` parser's
    defaults (a model folder, a dtype), which these benchmarks do not read."""
    own = argparse.ArgumentParser(add_help=False)
    add_flags(own)
    return {key: getattr(args, key) for key in vars(own.parse_args([]))}
