"""TETRIS through the services: PSD, SD and SD colocated give AR's greedy tokens with penalties, logprobs and
n > 1 (siblings sharing a prompt) on, while rows are verified to ragged depths; so do plans with a floor on the
drafts' estimated acceptance, with no extra drafts (the draft service prunes) and with some (the colocated
drafter prunes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from minedraft.batch_manager import draft_budget
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from tests.conftest import engine_from_folders, pair_stack, serve_requests
from tests.test_logprobs_penalties_modes import PENALTIES, PROMPTS


def requests() -> list[tuple[list[int], SamplingParams, str | None]]:
    out: list[tuple[list[int], SamplingParams, str | None]] = [
        (pr, SamplingParams(max_tokens=14, logprobs=2, ignore_eos=True), None) for pr in PROMPTS]
    out += [(pr, SamplingParams(max_tokens=12, **extra), None) for extra in PENALTIES for pr in PROMPTS[:2]]
    out += [(PROMPTS[0], SamplingParams(max_tokens=16, ignore_eos=True), "n2") for _ in range(2)]  # n = 2
    out += [([(5 * i + j) % 90 + 2 for j in range(2 + i % 5)], SamplingParams(max_tokens=20, ignore_eos=True), None)
            for i in range(10)]
    return out


def verify_lengths_into(seen: list[list[int] | None]) -> Callable[[Coordinator], None]:
    """A `serve_requests` watch that appends each verify's per-row draft counts (None: all k) to `seen`, as the
    step driver hands them on to adaptive k."""

    def watch(coordinator: Coordinator) -> None:
        plan_k = coordinator.driver.k_plan
        on_verify = plan_k.on_verify

        def spy(step: int, drafted: int, accepted: list[int], compute_ms: float | None, seq_ids: Sequence[int] = (),
                lengths: Sequence[int] | None = None) -> None:
            seen.append(None if lengths is None else list(lengths))
            on_verify(step, drafted, accepted, compute_ms, seq_ids, lengths)
        plan_k.on_verify = spy  # type: ignore[method-assign]
    return watch


@pytest.mark.parametrize(("mode", "colocated", "extra", "floor"),
                         [("psd", False, 3, 0.0), ("sd", False, 3, 0.0), ("sd", True, 3, 0.0), ("psd", False, 0, 0.3),
                          ("sd", True, 2, 0.3)],
                         ids=["psd", "sd", "sd-colocated", "psd-prune-only", "sd-colocated-floor"])
@pytest.mark.skipif(not (TINY_TARGET / "config.json").exists(), reason="bundled pair not built")
def test_tetris_services_equal_ar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, colocated: bool,
                                  extra: int, floor: float) -> None:
    target, draft = TINY_TARGET, TINY_DRAFT  # a trained pair: its draft's confidence differs from row to row
    reqs = requests()
    config = ManagerConfig(mode=mode, k=2, draft_selection="tetris", tetris_extra=extra, tetris_min_batch=1)
    if floor:  # the floor the plans carry, as if learnt from measured costs
        monkeypatch.setattr(draft_budget, "min_prob", lambda adaptive, batch, k, overlapped: floor)
    seen: list[list[int] | None] = []
    watch = verify_lengths_into(seen)
    stack = pair_stack(target, draft, tmp_path, colocated)
    try:
        results, status = asyncio.run(asyncio.wait_for(serve_requests(stack, target, config, colocated, reqs, watch),
                                                       240))
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
    ragged = [lengths for lengths in seen if lengths]  # the verifier reports each row's count with the verdict
    assert ragged and any(len(set(lengths)) > 1 for lengths in ragged)
    assert all(0 <= n <= 2 + extra for lengths in ragged for n in lengths)
