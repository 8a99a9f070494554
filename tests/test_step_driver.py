"""The step loop's exact plans and outputs in psd, sd and ar, with pipelining, cancel,
rebalancing after aborts and a live policy change, over in-memory fake workers.

Prompts are submitted in order, so request i is sequence i. Unless a test says otherwise,
the fake draft service's k drafts are all right, so a verify with drafts commits k+1 tokens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager.backend import UnavailableError
from minedraft.batch_manager.config import ManagerConfig
from minedraft.core.errors import InvalidRequestError
from minedraft.core.tokenizer import Tokenizer
from tests.fake_worker_links import greedy
from tests.step_driver_support import Plan, Stack, drive, word_tokenizer

PROMPTS = [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]]


def all_right(seq_id: int, step: int) -> int:
    return 99


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return word_tokenizer(Path(tmp_path_factory.mktemp("tok")))


def config(mode: str = "psd", k: int = 2, depth: int = 1, **extra: object) -> ManagerConfig:
    return ManagerConfig(mode=mode, k=k, pipeline_depth=depth, draft_retry_s=0.0, **extra)  # type: ignore[arg-type]


async def run_all(stack: Stack, max_tokens: list[int]) -> list[list[int]]:
    return await asyncio.gather(*(stack.run(p, m) for p, m in zip(PROMPTS, max_tokens, strict=False)))


def test_psd_alternates_two_batches_then_shrinks_to_sd_as_requests_finish(tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd"), all_right)
        await stack.coordinator.start()
        assert await run_all(stack, [6] * 4) == [greedy(p, 6) for p in PROMPTS]
        await stack.settle()
        assert stack.plans() == [
            Plan(0, draft=(1, 3), add=(1, 2, 3, 4)),
            Plan(1, draft=(2, 4), verify=(1, 3)),
            Plan(2, draft=(1, 3), verify=(2, 4)),
            Plan(3, draft=(2, 4), verify=(1, 3)),  # 1 and 3 reach 6 tokens
            Plan(4, verify=(2, 4), remove=(1, 3)),  # batch 0 is empty: a standard SD step
            Plan(5, remove=(2, 4)),
        ]
        assert stack.plans(stack.draft) == stack.plans()
        status = stack.coordinator.status()
        assert status["steps_by_kind"] == {"psd": 3, "sd": 2, "ar": 0}
        assert (status["drafted_total"], status["accepted_total"], status["tokens_total"]) == (16, 16, 24)
        assert status["reserved_blocks"] == 0 and stack.verifier.seqs == {} and stack.draft.seqs == {}
        await stack.coordinator.stop()

    drive(scenario)


def test_pipelined_plans_run_ahead_of_verdicts_and_rebalance_the_survivors(tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd", depth=2), all_right)
        await stack.coordinator.start()
        assert await run_all(stack, [6] * 4) == [greedy(p, 6) for p in PROMPTS]
        await stack.settle()
        assert stack.plans() == [
            Plan(0, draft=(1, 3), add=(1, 2, 3, 4)),
            Plan(1, draft=(2, 4), verify=(1, 3)),  # issued before step 0's verdict
            Plan(2, draft=(1, 3), verify=(2, 4)),
            Plan(3, draft=(2, 4), verify=(1, 3)),
            Plan(4, verify=(2, 4), remove=(1, 3)),
            # 2 and 4 wait to draft in batch 1, batch 0 is empty: 2 moves over (step 4's verdict,
            # which finishes both, is not back yet)
            Plan(5, draft=(4,)),
            Plan(6, remove=(2, 4)),
        ]
        await stack.coordinator.stop()

    drive(scenario)


def test_sd_drafts_then_verifies_one_batch_and_commits_what_was_accepted(tokenizer) -> None:
    script = {0: 3, 2: 0, 4: 1, 6: 2}  # seq 1's right drafts per draft step; seq 2 always 1

    def accept(seq_id: int, step: int) -> int:
        return script[step] if seq_id == 1 else 1

    async def scenario() -> None:
        stack = Stack(tokenizer, config("sd", k=3), accept)
        await stack.coordinator.start()
        out = await asyncio.gather(stack.run(PROMPTS[0], 10), stack.run(PROMPTS[1], 8))
        assert out == [greedy(PROMPTS[0], 10), greedy(PROMPTS[1], 8)]
        await stack.settle()
        k3 = {"k": 3}
        assert stack.plans() == [
            Plan(0, draft=(1, 2), add=(1, 2), **k3),
            Plan(1, verify=(1, 2), **k3),  # seq 1: 4 tokens, seq 2: 2
            Plan(2, draft=(1, 2), **k3),
            Plan(3, verify=(1, 2), **k3),  # 1 + 2
            Plan(4, draft=(1, 2), **k3),
            Plan(5, verify=(1, 2), **k3),  # 2 + 2
            Plan(6, draft=(1, 2), **k3),
            Plan(7, verify=(1, 2), **k3),  # 3 + 2: seq 1 has 10 tokens, seq 2 has 8
            Plan(8, remove=(1, 2), **k3),
        ]
        status = stack.coordinator.status()
        assert (status["drafted_total"], status["accepted_total"], status["tokens_total"]) == (24, 10, 18)
        assert status["acceptance_rate"] == round(10 / 24, 4) and status["mean_accepted_length"] == 2.25
        assert status["steps_by_kind"] == {"psd": 0, "sd": 8, "ar": 0}
        # Each side has a batch every other plan: per-batch times divide by these, not by the plans.
        totals = status["timing_totals"]
        assert (totals["verify_busy_steps"], totals["draft_busy_steps"]) == (4, 4)
        await stack.coordinator.stop()

    drive(scenario)


def test_ar_without_a_draft_service_verifies_every_sequence_every_step(tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("ar", depth=2), accept=None)
        await stack.coordinator.start()
        out = await asyncio.gather(stack.run(PROMPTS[0], 3), stack.run(PROMPTS[1], 5))
        assert out == [greedy(PROMPTS[0], 3), greedy(PROMPTS[1], 5)]
        await stack.settle()
        ar = {"drafts": False, "to_draft": False}
        assert stack.plans() == [
            Plan(0, verify=(1, 2), add=(1, 2), **ar),
            Plan(1, verify=(1, 2), **ar),
            Plan(2, verify=(1, 2), **ar),  # seq 1 reaches 3 tokens
            Plan(3, verify=(1, 2), **ar),  # issued before step 2's verdict: seq 1's token is dropped
            Plan(4, verify=(2,), remove=(1,), **ar),  # seq 2 reaches 5
            Plan(5, verify=(2,), **ar),
            Plan(6, remove=(2,), **ar),
        ]
        assert stack.coordinator.status()["draft_state"] == "absent"
        with pytest.raises(InvalidRequestError, match="no draft service"):
            await stack.coordinator.apply_policy(mode="psd")
        await stack.coordinator.stop()

    drive(scenario)


def test_cancel_frees_the_kv_reservation_at_once_and_removes_the_sequence_in_the_next_plan(tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd", depth=2), all_right)
        await stack.coordinator.start()
        stack.verifier.pause_at(2)
        first = stack.stream(PROMPTS[0], 30)
        first_chunk = asyncio.ensure_future(anext(first))
        other = asyncio.create_task(stack.run(PROMPTS[1], 30))
        assert (await first_chunk).token_ids == greedy(PROMPTS[0], 3)  # step 1's verdict
        await stack.verifier.paused.wait()
        assert stack.coordinator.admission.reserved_blocks > 0
        await first.aclose()  # the client goes away
        assert stack.coordinator.status()["running"] == 1
        issued = len(stack.verifier.plans)
        stack.verifier.resume()
        assert await other == greedy(PROMPTS[1], 30)
        await stack.settle()
        assert issued == 4 and stack.plans()[:6] == [
            Plan(0, draft=(1,), add=(1, 2)),
            Plan(1, draft=(2,), verify=(1,)),
            Plan(2, draft=(1,), verify=(2,)),
            Plan(3, draft=(2,), verify=(1,)),  # issued before the cancel: its verdict for 1 is dropped
            Plan(4, verify=(2,), remove=(1,)),  # the next plan frees 1's KV on both workers
            Plan(5, draft=(2,)),  # one sequence left: standard SD
        ]
        assert 1 not in stack.verifier.seqs and 1 not in stack.draft.seqs
        assert stack.coordinator.admission.reserved_blocks == 0
        await stack.coordinator.stop()

    drive(scenario)


def test_aborts_that_empty_a_batch_are_rebalanced_and_psd_resumes(tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd"), all_right)
        await stack.coordinator.start()
        stack.verifier.pause_at(2)
        one, three = stack.stream(PROMPTS[0], 12), stack.stream(PROMPTS[2], 12)
        # the four requests join in one plan, in this order
        first = asyncio.ensure_future(anext(one))
        others = [asyncio.create_task(stack.run(PROMPTS[i], 12)) for i in (1,)]
        third = asyncio.ensure_future(anext(three))
        others.append(asyncio.create_task(stack.run(PROMPTS[3], 12)))
        await asyncio.gather(first, third)
        await stack.verifier.paused.wait()
        await one.aclose()
        await three.aclose()  # all of batch 0 is gone
        stack.verifier.resume()
        assert await asyncio.gather(*others) == [greedy(PROMPTS[1], 12), greedy(PROMPTS[3], 12)]
        await stack.settle()
        assert stack.plans()[:8] == [
            Plan(0, draft=(1, 3), add=(1, 2, 3, 4)),
            Plan(1, draft=(2, 4), verify=(1, 3)),
            Plan(2, draft=(1, 3), verify=(2, 4)),
            Plan(3, draft=(4,), remove=(1, 3)),  # 2 moved to the empty batch 0; it drafts at even steps
            Plan(4, draft=(2,), verify=(4,)),
            Plan(5, draft=(4,), verify=(2,)),
            Plan(6, draft=(2,), verify=(4,)),
            Plan(7, draft=(4,), verify=(2,)),
        ]
        await stack.coordinator.stop()

    drive(scenario)


def test_a_live_policy_change_drains_the_loop_then_plans_with_the_new_mode_and_k(tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd", depth=2), all_right)
        await stack.coordinator.start()
        stack.verifier.pause_at(2)
        runs = asyncio.ensure_future(run_all(stack, [12] * 4))
        await stack.verifier.paused.wait()
        change = asyncio.create_task(stack.coordinator.apply_policy(mode="sd", k=3))
        for _ in range(100):
            await asyncio.sleep(0)
        assert not change.done() and len(stack.verifier.plans) == 4  # waits for steps 2 and 3
        stack.verifier.resume()
        assert (await change)["mode"] == "sd"
        assert await runs == [greedy(p, 12) for p in PROMPTS]
        await stack.settle()
        sd = {"k": 3}
        assert stack.plans() == [
            Plan(0, draft=(1, 3), add=(1, 2, 3, 4)),
            Plan(1, draft=(2, 4), verify=(1, 3)),
            Plan(2, draft=(1, 3), verify=(2, 4)),
            Plan(3, draft=(2, 4), verify=(1, 3)),  # 1, 3: 6 tokens; 2, 4: 3
            Plan(4, draft=(1, 2, 3, 4), **sd),  # one batch, every sequence starts from a draft
            Plan(5, verify=(1, 2, 3, 4), **sd),  # k+1 = 4 tokens each
            Plan(6, draft=(1, 2, 3, 4), **sd),
            Plan(7, verify=(1, 2, 3, 4), **sd),  # 1 and 3 reach 12
            Plan(8, draft=(2, 4), remove=(1, 3), **sd),
            Plan(9, verify=(2, 4), **sd),
            Plan(10, remove=(2, 4), **sd),
        ]
        assert stack.coordinator.config.policy()["k"] == 3
        await stack.coordinator.stop()

    drive(scenario)


def test_a_lost_verifier_aborts_running_requests_and_refuses_new_ones_without_hanging(tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd"), all_right)
        await stack.coordinator.start()
        stack.verifier.pause_at(2)
        stream = stack.stream(PROMPTS[0], 30)
        assert (await anext(stream)).token_ids == greedy(PROMPTS[0], 3)
        await stack.verifier.paused.wait()
        stack.verifier.crash()  # step 2's verdict never comes
        with pytest.raises(UnavailableError, match="the verifier was lost"):  # a clear error, at once
            await anext(stream)
        with pytest.raises(UnavailableError, match="verifier"):
            await anext(stack.stream(PROMPTS[1], 5))
        assert (await stack.coordinator.apply_policy(k=3))["k"] == 3  # nothing in flight to wait for
        status = stack.coordinator.status()
        assert (status["running"], status["reserved_blocks"]) == (0, 0)
        k_plan = stack.coordinator.driver.k_plan  # nothing kept of the lost sequence (no plan removes it)
        assert k_plan.adaptive is not None and k_plan.adaptive.by_seq == {} and not k_plan.unverified
        await stack.coordinator.stop()

    drive(scenario)
