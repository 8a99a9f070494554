"""An EAGLE head drafting for TETRIS selection (the bundled trained head, whose confidence differs from row to
row): greedy output equals AR in one process (selection on the device, with and without a floor), through PSD
(the draft service selects) and through SD colocated (the verifier's own head selects on its device), while
rows are verified to their own depths."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager.config import ManagerConfig
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from tests.conftest import serve_requests
from tests.eagle_support import BUNDLED_PROMPTS as PROMPTS
from tests.eagle_support import TINY_EAGLE, bundled_head_stack
from tests.test_tetris_services import verify_lengths_into

K, EXTRA = 2, 2
bundled = pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")


def ar_tokens(max_tokens: int) -> list[list[int]]:
    engine = LLMEngine.from_folders(TINY_TARGET, None, EngineConfig(mode="ar"))
    return [r.output_ids for r in engine.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, ignore_eos=True))]


@bundled
@pytest.mark.parametrize("floor", [0.0, 0.3])
def test_a_head_with_tetris_in_one_process_equals_ar(floor: float) -> None:
    engine = LLMEngine.from_folders(TINY_TARGET, TINY_EAGLE, EngineConfig(mode="sd", k=K, draft_kind="eagle",
                                                                          tetris_extra=EXTRA, tetris_min_prob=floor))
    out = engine.generate(PROMPTS, SamplingParams(max_tokens=20, ignore_eos=True))
    assert [r.output_ids for r in out] == ar_tokens(20)
    assert engine.capacity.steps > 0, "the head's drafts were selected on the device"
    assert sum(r.stats.accepted for r in out) > 0
    assert sum(r.stats.drafted for r in out) < (K + EXTRA) * sum(r.stats.steps for r in out)  # pruned


@bundled
@pytest.mark.parametrize("colocated", [False, True], ids=["psd", "sd-colocated"])
def test_a_head_with_tetris_through_the_services_equals_ar(tmp_path: Path, colocated: bool) -> None:
    env = {"verifier": {"MINEDRAFT_COLOCATED_DRAFT": str(TINY_EAGLE)}} if colocated else {}
    stack = bundled_head_stack(tmp_path, env, draft_service=not colocated)
    seen: list[list[int] | None] = []
    watch = verify_lengths_into(seen)
    config = ManagerConfig(mode="psd" if not colocated else "sd", k=K, draft_selection="tetris", tetris_extra=EXTRA,
                           tetris_min_batch=1)
    reqs = [(p, SamplingParams(max_tokens=16, ignore_eos=True), None) for p in PROMPTS]
    try:
        results, status = asyncio.run(asyncio.wait_for(
            serve_requests(stack, TINY_TARGET, config, colocated, reqs, watch), 240))
    finally:
        stack.stop()
    assert [[t for chunk in chunks for t in chunk.token_ids] for chunks in results] == ar_tokens(16)
    assert status["accepted_total"] > 0
    ragged = [lengths for lengths in seen if lengths]
    assert ragged and any(len(set(lengths)) > 1 for lengths in ragged), "rows verified to their own depths"
    assert all(0 <= n <= K + EXTRA for lengths in ragged for n in lengths)
