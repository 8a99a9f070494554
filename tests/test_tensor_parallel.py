"""Tensor-parallel target on two CPU ranks (gloo) equals the single-process model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.errors import ModelLoadError
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.tensor_parallel import TPContext
from minedraft.engine.verifier import Verifier
from tests.conftest import grpc_stream, make_hf_model, worker_info
from tests.eagle_support import write_eagle_head

PROMPTS = [[5, 9, 13, 2, 7], [3] * 9, [11, 12]]
IDS = [4, 8, 15, 16, 23, 42, 7, 1, 9, 30, 31]


def run_model(model_dir: Path, tp: TPContext) -> tuple[torch.Tensor, list[list[int]], int]:
    model = load_model(model_dir, "cpu", torch.float32, tp=tp)
    logits = ModelRunner(model, 64, 4).forward([0], [IDS], [0], last_n=len(IDS))
    engine = LLMEngine(Verifier(ModelRunner(model, 128, 4)), None, Tokenizer(model_dir), EngineConfig(mode="ar"))
    reqs = engine.generate(PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    return logits, [r.output_ids for r in reqs], model.config.num_kv_heads


def tp_rank(rank: int, world: int, init_file: str, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        logits, tokens, kv_heads = run_model(Path(model_dir), TPContext(rank, world, dist.group.WORLD))
        torch.save({"logits": logits, "tokens": tokens, "kv_heads": kv_heads}, f"{out}.{rank}")
        dist.barrier()  # nobody tears the group down while the other rank still uses it
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_two_rank_tensor_parallel_matches_single_process(tmp_path: Path, arch: str) -> None:
    make_hf_model(tmp_path / "m", arch, seed=9, **({"head_dim": 16} if arch == "qwen3" else {}))
    ref_logits, ref_tokens, ref_kv = run_model(tmp_path / "m", TPContext())
    out = tmp_path / "tp"
    mp.start_processes(tp_rank, args=(2, str(tmp_path / "init"), str(tmp_path / "m"), str(out)), nprocs=2,
                       start_method="spawn")
    for rank in range(2):
        got = torch.load(f"{out}.{rank}")
        assert float((got["logits"] - ref_logits).norm() / ref_logits.norm()) < 1e-5
        assert got["tokens"] == ref_tokens
        assert got["kv_heads"] == ref_kv // 2  # each rank caches only its own kv heads


def test_indivisible_shapes_are_refused(tmp_path: Path) -> None:
    make_hf_model(tmp_path / "m", "llama", num_key_value_heads=1)
    with pytest.raises(ModelLoadError, match=r"num_key_value_heads \(1\) is not divisible"):
        load_model(tmp_path / "m", tp=TPContext(rank=0, size=2))


def tp_pair_stack(tmp_path: Path, head: str | None = None, **fields: object) -> LocalStack:
    """A random qwen2 target served with a two-rank tensor-parallel verifier (not started), drafting with a random
    one-layer draft model or, with `head` (a layout of tests/eagle_support.py), a random EAGLE head for it."""
    make_hf_model(tmp_path / "target", "qwen2", seed=21)
    draft = tmp_path / "draft"
    if head is None:
        make_hf_model(draft, "qwen2", seed=22, num_hidden_layers=1)
    else:
        draft = write_eagle_head(tmp_path / "head", tmp_path / "target", head, seed=4, draft_vocab=70)
        fields["draft_kind"] = "eagle"
    return LocalStack(StackConfig(target=str(tmp_path / "target"), draft=str(draft),
                                  grpc_port=free_port(), http_port=free_port(), k=3, num_blocks=256, tp_size=2,
                                  log_dir=tmp_path / "logs", **fields))  # type: ignore[arg-type]


STACK_PROMPTS = [[3 + i, 7, 9 + i] for i in range(6)]


def single_process_ar(tmp_path: Path) -> list[list[int]]:
    """What the stack's target gives for STACK_PROMPTS in one process, greedy, 24 tokens each."""
    engine = LLMEngine.from_folders(tmp_path / "target", None, EngineConfig(mode="ar"))
    return [r.output_ids for r in engine.generate(STACK_PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))]


def stream_all(stack: LocalStack) -> list[list[int]]:
    """STACK_PROMPTS streamed over gRPC at once (staggered by 20 ms), 24 tokens each."""

    async def run_all() -> list[list[int]]:
        return await asyncio.gather(*(grpc_stream(stack, p, 24, 0.02 * i) for i, p in enumerate(STACK_PROMPTS)))

    return asyncio.run(run_all())


@pytest.mark.parametrize("launch_ahead", ["off", "on"])
def test_psd_stack_with_a_two_rank_tensor_parallel_verifier(tmp_path: Path, launch_ahead: str) -> None:
    """Verifier rank 0 drives rank 1 step by step; greedy PSD output is still exactly AR. With launch-ahead
    both ranks queue the next verify before committing the current one (rank 1 told over its host channel)."""
    stack = tp_pair_stack(tmp_path, process_env={name: {"MINEDRAFT_LAUNCH_AHEAD": launch_ahead}
                                                 for name in ("verifier", "draft")})
    expected = single_process_ar(tmp_path)
    try:
        stack.start(timeout=120)
        assert "verifier-tp1" in stack.procs
        assert stream_all(stack) == expected
        assert worker_info(stack.target_port).num_blocks == 256
        launched = "verifies are launched ahead" in (tmp_path / "logs" / "verifier.log").read_text()
        assert launched == (launch_ahead == "on")
    finally:
        stack.stop()


def test_tetris_selection_with_a_two_rank_tensor_parallel_verifier(tmp_path: Path) -> None:
    """Ragged (TETRIS-selected) drafts reach rank 1 with each row's count, so both ranks verify the same
    depths: greedy PSD output is still exactly AR."""
    stack = tp_pair_stack(tmp_path)
    expected = single_process_ar(tmp_path)
    try:
        stack.start(timeout=120)
        url = f"http://127.0.0.1:{stack.admin_port}/admin/policy"
        reply = httpx.put(url, json={"draft_selection": "tetris", "tetris_min_batch": 1, "tetris_extra": 2}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert stream_all(stack) == expected
        assert stack.health()["drafted_total"] > 0  # type: ignore[index]
    finally:
        stack.stop()


def test_ar_stack_with_a_two_rank_tensor_parallel_verifier(tmp_path: Path) -> None:
    """AR through the services with rank 1 following rank 0 (its next frame's receive posted before each
    commit): exactly single-process AR, twice on the same stack."""
    stack = tp_pair_stack(tmp_path, mode="ar")
    expected = single_process_ar(tmp_path)
    try:
        stack.start(timeout=120)
        assert stream_all(stack) == expected
        assert stream_all(stack) == expected  # again, on the same stack
    finally:
        stack.stop()


def test_a_follower_leaves_when_rank_0_dies(tmp_path: Path) -> None:
    """Rank 1 waits for its next step on the host channel without a deadline (a server may idle for
    days); rank 0's death must still end that wait, so the launcher or Kubernetes restarts the group."""
    stack = tp_pair_stack(tmp_path)
    try:
        stack.start(timeout=120)
        follower = stack.procs["verifier-tp1"]
        stack.kill("verifier")
        deadline = time.monotonic() + 30
        while follower.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert follower.poll() not in (None, 0)
        assert "Connection closed by peer" in (tmp_path / "logs" / "verifier-tp1.log").read_text()
    finally:
        stack.stop()


@pytest.mark.parametrize("launch_ahead", ["off", "on"])
def test_psd_with_an_eagle_head_and_a_two_rank_tensor_parallel_verifier(tmp_path: Path, launch_ahead: str) -> None:
    """Rank 0 captures the states the head reads (they are whole on every rank after each all-reduce) and ships
    them with its verdicts, launched ahead or not; greedy PSD output is still exactly AR."""
    env = {"MINEDRAFT_LAUNCH_AHEAD": launch_ahead}
    stack = tp_pair_stack(tmp_path, "speculators-eagle3", process_env={"verifier": env, "draft": env})
    expected = single_process_ar(tmp_path)
    try:
        stack.start(timeout=120)
        assert "verifier-tp1" in stack.procs
        assert stream_all(stack) == expected
        health = stack.health()
        assert health["drafted_total"] > 0 and health["steps_by_kind"]["psd"] > 0  # type: ignore[index]
        launched = "verifies are launched ahead" in (tmp_path / "logs" / "verifier.log").read_text()
        assert launched == (launch_ahead == "on")
    finally:
        stack.stop()
