"""The placements the sweep compares, each through the real services, and one timed cell on them.

- colocated: one verifier on GPU 0 with the draft model loaded beside the target
  (`--colocated-draft`), no draft service: AR (mode ar) and standard SD (mode sd) on one GPU;
- split: verifier on GPU 0 (or 0..tp-1), draft service on the next GPU, NCCL data plane:
  SD with the draft on its own GPU (sequential), PSD, and auto (adaptive k).
Every cell is warmed up at its own (mode, k, concurrency) with one full untimed run (every CUDA
graph bucket the timed runs pass through is captured there, every Triton kernel compiled), then
timed `reps` times; throughput is reported as the median with the min and max.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from minedraft.bench.client import fetch_status, generate_all, plans_delta, put_policy, step_delta
from minedraft.bench.gpu.pairs import SYNTHETIC_WORKERS
from minedraft.bundled import TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}


@dataclass(frozen=True, slots=True)
class PairSpecs:
    target: str
    draft: str  # the draft model, or with draft_kind "eagle" an EAGLE head's folder
    draft_kind: str = "model"
    tokenizer: str = str(TINY_TARGET)  # the bundled tiny target's: its 2048 ids fit the 8B shape's vocabulary


def capture_env(max_num_seqs: int, capture_k: int) -> dict[str, str]:
    """Workers capture every steady shape up to these bounds at start-up (--capture-batch); 0: on first use."""
    return {"MINEDRAFT_CAPTURE_BATCH": str(max_num_seqs), "MINEDRAFT_CAPTURE_K": str(capture_k)} if capture_k else {}


def devices(device_type: str, tp_size: int) -> tuple[str, str]:
    """(the target's devices, comma-separated by rank; the draft service's device): on CUDA the target over GPUs
    0..N-1 and the draft on GPU N; on the CPU (the same sweep at a tiny shape) everything on the CPU."""
    if device_type == "cpu":
        return ",".join(["cpu"] * tp_size), "cpu"
    return ",".join(f"cuda:{r}" for r in range(tp_size)), f"cuda:{tp_size}"


def colocated_stack(pair: PairSpecs, num_blocks: int, max_num_seqs: int, tp_size: int = 1,
                    capture_k: int = 0, device_type: str = "cuda") -> LocalStack:
    """SD colocated on N = tp_size GPUs: the target over GPUs 0..N-1, the draft (or head) beside rank 0."""
    target_device, _ = devices(device_type, tp_size)
    cfg = StackConfig(target=pair.target, draft=pair.draft, worker_module=SYNTHETIC_WORKERS, grpc_port=free_port(),
                      http_port=free_port(), tp_size=tp_size, target_device=target_device, mode="sd", k=4, threads=4,
                      max_num_seqs=max_num_seqs, num_blocks=num_blocks, dtype="bfloat16",
                      tokenizer=pair.tokenizer, log_dir=Path(tempfile.mkdtemp(prefix="minedraft_colocated_")),
                      extra_env=capture_env(max_num_seqs, capture_k), draft_kind=pair.draft_kind,
                      process_env={"verifier": {"MINEDRAFT_COLOCATED_DRAFT": pair.draft}})
    return LocalStack(cfg)


def split_stack(pair: PairSpecs, num_blocks: int, max_num_seqs: int, tp_size: int = 1,
                capture_k: int = 0, device_type: str = "cuda") -> LocalStack:
    """The verifier on GPUs 0..N-1, the draft service on GPU N, the NCCL data plane (gloo on the CPU)."""
    target_device, draft_device = devices(device_type, tp_size)
    cuda = device_type == "cuda"
    cfg = StackConfig(target=pair.target, draft=pair.draft, worker_module=SYNTHETIC_WORKERS, grpc_port=free_port(),
                      http_port=free_port(), tp_size=tp_size, target_device=target_device, draft_device=draft_device,
                      mode="psd", k=4, threads=4, max_num_seqs=max_num_seqs, num_blocks=num_blocks,
                      dtype="bfloat16", data_plane_backend="nccl" if cuda else "gloo", tokenizer=pair.tokenizer,
                      extra_env={**(NCCL_ENV if cuda else {}), **capture_env(max_num_seqs, capture_k)},
                      draft_kind=pair.draft_kind, log_dir=Path(tempfile.mkdtemp(prefix="minedraft_split_")))
    return LocalStack(cfg)


def start_together(colocated: LocalStack, split: LocalStack | None, timeout: float = 400.0) -> None:
    """Both stacks load at once (the models build on different processes); the colocated one has no draft service."""
    colocated.start_verifier()
    if split is not None:
        split.start_verifier()
        split.start_draft()
    colocated.start_manager()
    if split is not None:
        split.start_manager()
    colocated.wait_ready(timeout)
    if split is not None:
        split.wait_ready(timeout)


def log_tails(stack: LocalStack, lines: int = 20) -> dict[str, list[str]]:
    folder = stack.cfg.log_dir
    if folder is None:
        return {}
    return {f.name: f.read_text(errors="ignore").splitlines()[-lines:] for f in folder.glob("*.log")}


def measure(stack: LocalStack, mode: str, k: int, prompts: list[list[int]], max_tokens: int | Sequence[int],
            reps: int, pipeline_depth: int = 2, max_num_seqs: int = 0, policy: dict[str, object] | None = None
            ) -> tuple[dict, list[list[int]]]:
    """One cell: policy, one full warm-up run, `reps` timed runs. Returns the row and the first run's outputs.
    `max_num_seqs`: the batch's bound (0: every prompt at once; fewer: the rest queue for a place); `policy`:
    further policy fields (draft_selection is fixed unless it says otherwise, e.g. tetris). A stack
    started with `capture_k` has every width auto may pick captured already; the row's `graph_capture_ms`
    says whether a timed run captured anything."""
    cfg = stack.cfg
    seqs = max_num_seqs or len(prompts)
    put_policy(stack.admin_port, mode=mode, k=k, max_num_seqs=seqs, pipeline_depth=pipeline_depth,
               **{"draft_selection": "fixed", **(policy or {})})
    asyncio.run(generate_all(cfg.grpc_port, prompts, max_tokens))  # warm-up at this cell's own shape
    before = fetch_status(cfg.http_port)
    rates: list[float] = []
    first: list[list[int]] = []
    for _ in range(reps):
        outputs, seconds = asyncio.run(generate_all(cfg.grpc_port, prompts, max_tokens))
        rates.append(sum(len(o) for o in outputs) / seconds)
        first = first or outputs
    after = fetch_status(cfg.http_port)
    per_step = step_delta(after, before)
    wall = per_step.get("wall_ms", 0.0)
    # Busy: the GPU time the workers measured (CUDA events), the host clock where they did not; a verify
    # launched ahead is queued long before it runs, so only its GPU time says how long it took.
    verify_busy = per_step.get("verify_busy_ms", per_step.get("verify_compute_ms", 0.0))
    draft_busy = per_step.get("draft_busy_ms", per_step.get("draft_compute_ms", 0.0))
    busiest = max(verify_busy, draft_busy)
    median = statistics.median(rates)
    # Per batch, not per plan: sequential SD gives each worker a batch every other plan only.
    verify_share = per_step.get("verify_busy_steps", 0.0) or 1.0
    draft_share = per_step.get("draft_busy_steps", 0.0) or 1.0
    row = {
        "tokens_per_s": median, "tokens_per_s_min": min(rates), "tokens_per_s_max": max(rates),
        "spread": (max(rates) - min(rates)) / median, "reps": reps, "concurrency": len(prompts),
        "latency_per_request_s": sum(len(o) for o in first) / median / len(prompts),  # set time / requests
        "steps": per_step["steps"], "acceptance": per_step["acceptance"],
        "mean_accepted_length": per_step["mean_accepted_length"], "step_ms": wall,
        "draft_ms": per_step.get("draft_compute_ms", 0.0), "verify_ms": per_step.get("verify_compute_ms", 0.0),
        "verify_busy_ms": verify_busy, "draft_busy_ms": draft_busy,
        "verify_ms_per_batch": verify_busy / verify_share, "draft_ms_per_batch": draft_busy / draft_share,
        "verify_busy_fraction": per_step.get("verify_busy_steps", 0.0),
        "verify_wait_ms": per_step.get("verify_recv_wait_ms", 0.0),
        "verify_plan_wait_ms": per_step.get("verify_plan_wait_ms", 0.0),
        # How long the verifier's next plan sat in its inbox before the step began: ~0 means the plans come
        # just in time (the batch manager's round trip is as long as a step), not a step ahead.
        "verify_plan_queued_ms": per_step.get("verify_plan_queued_ms", 0.0),
        "data_plane_ms": per_step.get("verify_send_ms", 0.0) + per_step.get("draft_send_ms", 0.0),
        "overlap_efficiency": busiest / wall if wall else 0.0,
        # CUDA graphs captured inside the timed runs (both workers): should be 0 (--capture-batch, warm-ups)
        "graph_capture_ms": (per_step.get("verify_graph_capture_ms", 0.0)
                             + per_step.get("draft_graph_capture_ms", 0.0)) * per_step["steps"],
        **plans_delta(after, before),  # auto: the k its timed runs drafted
    }
    return row, first


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict[str, float]:
    """Token-for-token comparison with AR on the rows both have: exact rows, per-position agreement."""
    pairs = list(zip(outputs, reference, strict=False))
    same = sum(a == b for a, b in pairs)
    positions = sum(sum(x == y for x, y in zip(a, b, strict=False)) / max(len(b), 1) for a, b in pairs)
    return {"rows_equal_ar": same, "rows_compared": len(pairs), "agreement_with_ar": positions / max(len(pairs), 1)}
