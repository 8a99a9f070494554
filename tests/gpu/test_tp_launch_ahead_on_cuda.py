"""A two-rank tensor-parallel verifier in PSD on GPUs, launching verifies ahead on both ranks.

Rank 1 learns each plan over its host channel and queues the verify behind the one its GPU still
runs; the drafts reach it by a broadcast ordered on its stream. Checks that nothing deadlocks, every
request completes with the single-GPU AR output (two rows may differ: the all-reduce sums in another
order than one GPU does, which can flip a near-tie), and that verifies were launched ahead; prints
the throughput with launch-ahead off and on, one stack after the other. The draft service shares
GPU 1 with rank 1 (two GPUs here), so the times are not a placement benchmark."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import torch

from minedraft.bench.client import generate_all
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from tests.gpu.stacks import running, two_gpu_stack

PROMPTS = [[1, 5 + i, 9, 13 + 2 * i, 4] for i in range(16)]
MAX_TOKENS = 96


def run_stack(logs: Path, launch_ahead: str) -> tuple[list[list[int]], float, str]:
    env = {"MINEDRAFT_LAUNCH_AHEAD": launch_ahead}
    stack = two_gpu_stack(logs, tp_size=2, target_device="cuda:0,cuda:1", process_env={"verifier": env, "draft": env})
    with running(stack, timeout=300):
        asyncio.run(generate_all(stack.cfg.grpc_port, PROMPTS, 16))  # warm-up: graphs at each batch size, communicators
        runs = []
        for _ in range(2):
            start = time.perf_counter()
            got = asyncio.run(generate_all(stack.cfg.grpc_port, PROMPTS, MAX_TOKENS))[0]
            runs.append(time.perf_counter() - start)
    return got, min(runs), (logs / "verifier.log").read_text(errors="ignore")


def test_tp2_psd_launches_ahead_on_both_ranks(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    common = {"device": "cuda:0", "dtype": torch.float32, "max_num_seqs": 32, "num_blocks": 1024}
    ar = LLMEngine.from_folders(TINY_TARGET, None, EngineConfig(mode="ar", **common))
    expected = [r.output_ids for r in ar.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]
    del ar
    results = {}
    for mode in os.environ.get("TP_LAUNCH_AHEAD_MODES", "off,on").split(","):
        got, seconds, log = run_stack(tmp_path / mode, mode)
        same = sum(g == e for g, e in zip(got, expected, strict=True))
        tokens = sum(len(g) for g in got)
        print(f"launch-ahead {mode}: {tokens / seconds:.0f} tok/s, rows equal to single-GPU AR {same} of 16")
        assert [len(g) for g in got] == [MAX_TOKENS] * len(PROMPTS)
        assert same >= len(PROMPTS) - 2
        assert ("verifies are launched ahead" in log) == (mode == "on"), log[-2000:]
        results[mode] = tokens / seconds
    if len(results) == 2:
        print(f"TP=2 PSD launch-ahead on/off: {results['on'] / results['off']:.3f}x")
