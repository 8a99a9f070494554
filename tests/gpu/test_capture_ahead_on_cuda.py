"""--capture-batch on a GPU: a colocated verifier (the bundled pair, SD without a draft service) that
captured every steady shape at start-up captures nothing while it serves AR, SD at each k and auto, not
even for the prefill of a short prompt (the set is closed: other shapes run eagerly); one that captures
on first use reports the time it spent (StepTiming.graph_capture_ms, /health's totals). Both produce the
target's greedy output."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from minedraft.bench.client import fetch_status, generate_all, put_policy
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port

# Longer than a graph's widest window (16): their prefill runs eagerly in any case.
PROMPTS = [[(37 * i + 11 * j) % 1900 + 40 for j in range(24 + i)] for i in range(8)]
# Sent on their own, short prompts make a prefill that fits a graph (3 rows of up to 9 tokens), a shape no
# steady step has: captured on first use, or run eagerly once the set is closed.
SHORT = [[(29 * i + 7 * j) % 1900 + 40 for j in range(5 + 2 * i)] for i in range(3)]
MAX_K = 4


def colocated(logs: Path, capture: bool) -> LocalStack:
    env = {"MINEDRAFT_COLOCATED_DRAFT": str(TINY_DRAFT)}
    if capture:
        env |= {"MINEDRAFT_CAPTURE_BATCH": str(len(PROMPTS)), "MINEDRAFT_CAPTURE_K": str(MAX_K)}
    return LocalStack(StackConfig(target=str(TINY_TARGET), draft=str(TINY_DRAFT), grpc_port=free_port(),
                                  http_port=free_port(), target_device="cuda:0", mode="sd", k=MAX_K,
                                  max_num_seqs=len(PROMPTS), num_blocks=1024, dtype="float32", log_dir=logs,
                                  extra_env={"NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")},
                                  process_env={"verifier": env}))


@pytest.mark.parametrize("capture", [True, False], ids=["at-start", "on-first-use"])
def test_capture_ahead_leaves_nothing_to_capture_while_serving(capture: bool, cuda_device, tmp_path: Path) -> None:
    stack = colocated(tmp_path, capture)
    stack.start_verifier()
    stack.start_manager()
    try:
        stack.wait_ready(300)
        outputs = {}
        for mode, k in [("ar", MAX_K), *(("sd", k) for k in range(1, MAX_K + 1)), ("auto", MAX_K)]:
            put_policy(stack.admin_port, mode=mode, k=k, max_num_seqs=len(PROMPTS))
            long, _ = asyncio.run(generate_all(stack.cfg.grpc_port, PROMPTS, 40))
            short, _ = asyncio.run(generate_all(stack.cfg.grpc_port, SHORT, 40))
            outputs[(mode, k)] = long + short
        totals = fetch_status(stack.cfg.http_port)["timing_totals"]
    finally:
        stack.stop(grace=20)
    captured_ms = totals.get("verify_graph_capture_ms", 0.0)
    if capture:
        assert captured_ms == 0.0, totals
        # the short prompts' prefill ran eagerly (and said so), as no step of the closed set has its shape
        assert "runs eagerly" in (tmp_path / "verifier.log").read_text()
    else:
        assert captured_ms > 0.0, totals
    ar = outputs[("ar", MAX_K)]
    for key, rows in outputs.items():
        same = sum(a == b for a, b in zip(rows, ar, strict=True))
        assert same >= len(ar) - 1, (key, same)  # fp32; a GPU kernel may flip one near-tie
