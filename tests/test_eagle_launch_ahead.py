"""PSD with an EAGLE head, the verifier launching verifies ahead and the draft service drafting from verdicts
still on its device (CPU, gloo, the bundled trained pair).

A verify launched ahead sends its verdict before the step before it is committed; with a head that verdict must
carry its target states too, or the draft side feeds zeros for those positions: output stays exact (the target
judges every draft) but acceptance falls. The draft service's head, drafting ahead, must feed the states it
received behind the verdict and stash them as a host-side commit would. So the test asserts both: AR's greedy
tokens, and the acceptance of the same requests without launch-ahead; seeded sampled rows launch too and draw
what they draw without it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager.config import ManagerConfig
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from tests.conftest import engine_from_folders, serve_requests
from tests.eagle_support import BUNDLED_PROMPTS as PROMPTS
from tests.eagle_support import TINY_EAGLE, bundled_head_stack


def psd_run(log_dir: Path, launch_ahead: str, sampled: bool = False) -> tuple[list[list[int]], dict, str, str]:
    """PSD over the bundled prompts, greedy or (`sampled`) drawn at temperature 0.8 with a seed per request."""
    env = {"MINEDRAFT_LAUNCH_AHEAD": launch_ahead}
    stack = bundled_head_stack(log_dir, {"verifier": env, "draft": env})
    reqs = [(p, SamplingParams(max_tokens=16, ignore_eos=True, **({"temperature": 0.8, "seed": 40 + i} if sampled
                                                                    else {})), None)
            for i, p in enumerate(PROMPTS)]
    try:
        results, status = asyncio.run(asyncio.wait_for(
            serve_requests(stack, TINY_TARGET, ManagerConfig(mode="psd", k=3), False, reqs), 240))
    finally:
        stack.stop()
    tokens = [[t for chunk in chunks for t in chunk.token_ids] for chunks in results]
    return tokens, status, (log_dir / "verifier.log").read_text(), (log_dir / "draft.log").read_text()


@pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")
def test_verifies_launched_ahead_carry_the_heads_states(tmp_path: Path) -> None:
    ar = engine_from_folders(TINY_TARGET, None, "ar", block_size=16, num_blocks=1024).generate(
        PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    ahead, ahead_status, log, draft_log = psd_run(tmp_path / "on", "on")
    plain, plain_status, plain_log, plain_draft_log = psd_run(tmp_path / "off", "off")
    assert ahead == plain == [r.output_ids for r in ar]
    assert "verifies are launched ahead" in log and "verifies are launched ahead" not in plain_log
    drafted_ahead = "drafts are launched from verdicts on the device"
    assert drafted_ahead in draft_log and drafted_ahead not in plain_draft_log
    assert ahead_status["steps_by_kind"]["psd"] > 0
    rate, plain_rate = ahead_status["acceptance_rate"], plain_status["acceptance_rate"]
    assert plain_rate > 0.2, "the trained head drafts well from the target's states"
    assert rate > 0.8 * plain_rate, (rate, plain_rate)


@pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")
def test_sampled_verifies_launched_ahead_with_a_head_draw_the_host_paths_tokens(tmp_path: Path) -> None:
    """Seeded sampled rows with the head: their drafts' probabilities are received into the device behind the
    frame, the verifies launched ahead carry the head's states, and every row draws the tokens it draws when
    every frame is read on the host first."""
    ahead, ahead_status, log, _ = psd_run(tmp_path / "on", "on", sampled=True)
    plain, _, plain_log, _ = psd_run(tmp_path / "off", "off", sampled=True)
    assert ahead == plain and all(len(t) == 16 for t in ahead)
    assert "verifies are launched ahead" in log and "verifies are launched ahead" not in plain_log
    assert ahead_status["steps_by_kind"]["psd"] > 0 and ahead_status["accepted_total"] > 0
