"""TETRIS through the services: PSD, SD and SD colocated give AR's greedy tokens with penalties, logprobs and
n > 1 (siblings sharing a prompt) on, while rows are verified to ragged depths."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from tests.conftest import engine_from_folders
from tests.test_logprobs_penalties_modes import PENALTIES, PROMPTS


def requests() -> list[tuple[list[int], SamplingParams, str | None]]:
    out: list[tuple[list[int], SamplingParams, str | None]] = [
        (pr, SamplingParams(max_tokens=14, logprobs=2, ignore_eos=True), None) for pr in PROMPTS]
    out += [(pr, SamplingParams(max_tokens=12, **extra), None) for extra in PENALTIES for pr in PROMPTS[:2]]
    out += [(PROMPTS[0], SamplingParams(max_tokens=16, ignore_eos=True), "n2") for _ in range(2)]  # n = 2
    out += [([(5 * i + j) % 90 + 2 for j in range(2 + i % 5)], SamplingParams(max_tokens=20, ignore_eos=True), None)
            for i in range(10)]
    return out


async def serve(stack: LocalStack, folder: Path, mode: str, colocated: bool,
                reqs: list[tuple[list[int], SamplingParams, str | None]]) -> tuple[list[list], dict]:
    draft = None if colocated else f"127.0.0.1:{stack.draft_port}"
    config = ManagerConfig(mode=mode, k=2, draft_selection="tetris", tetris_extra=3, tetris_min_batch=1)
    coordinator = Coordinator.over_grpc(Tokenizer(folder), "t", f"127.0.0.1:{stack.target_port}", draft, config)
    await coordinator.start(connect_timeout=120)
    while coordinator.status()["draft_state"] != "drafting":
        await asyncio.sleep(0.05)

    async def one(prompt: list[int], params: SamplingParams, share: str | None) -> list:
        return [chunk async for chunk in coordinator.generate(prompt, params, "r", share_prompt=share)]

    try:
        return await asyncio.gather(*(one(*r) for r in reqs)), coordinator.status()
    finally:
        await coordinator.stop()


@pytest.mark.parametrize(("mode", "colocated"), [("psd", False), ("sd", False), ("sd", True)],
                         ids=["psd", "sd", "sd-colocated"])
@pytest.mark.skipif(not (TINY_TARGET / "config.json").exists(), reason="bundled pair not built")
def test_tetris_services_equal_ar(tmp_path: Path, mode: str, colocated: bool) -> None:
    target, draft = TINY_TARGET, TINY_DRAFT  # a trained pair: its draft's confidence differs from row to row
    reqs = requests()
    env = {"verifier": {"MINEDRAFT_COLOCATED_DRAFT": str(draft)}} if colocated else {}
    stack = LocalStack(StackConfig(target=str(target), draft=str(draft), grpc_port=free_port(),
                                   http_port=free_port(), num_blocks=512, log_dir=tmp_path, process_env=env))
    stack.start_verifier()
    if not colocated:
        stack.start_draft()
    try:
        results, status = asyncio.run(asyncio.wait_for(serve(stack, target, mode, colocated, reqs), 240))
    finally:
        stack.stop()
    ar = engine_from_folders(target, None, "ar", block_size=16, num_blocks=1024).generate(
        [r[0] for r in reqs], [r[1] for r in reqs])
    for ref, chunks in zip(ar, results, strict=True):
        assert [t for c in chunks for t in c.token_ids] == ref.output_ids
        if ref.logprobs is not None:
            got = [e for c in chunks for e in c.logprobs or []]
            assert [e.token_id for e in got] == [e.token_id for e in ref.logprobs]
            assert [e.logprob for e in got] == pytest.approx([e.logprob for e in ref.logprobs], abs=1e-4)
    assert status["accepted_total"] > 0
