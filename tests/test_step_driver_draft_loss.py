"""The draft service's state machine in the running loop: loss mid-step, AR steps, recovery
with a fresh data-plane epoch and every sequence re-added; auto mode's pause and probe."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.draft_state import DraftLinkState, DraftState, IllegalTransitionError
from minedraft.batch_manager.draft_supervisor import link_transport
from minedraft.core.tokenizer import Tokenizer
from tests.fake_worker_links import greedy
from tests.step_driver_support import Plan, Stack, drive, until, word_tokenizer

PROMPTS = [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]]
S = DraftState


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return word_tokenizer(Path(tmp_path_factory.mktemp("tok")))


def test_draft_lost_mid_step_falls_back_to_ar_and_recovers_with_every_sequence_re_added(tokenizer) -> None:
    async def scenario() -> None:
        cfg = ManagerConfig(mode="psd", k=2, pipeline_depth=1, draft_retry_s=0.0)
        stack = Stack(tokenizer, cfg, lambda seq, step: 99)
        await stack.coordinator.start()
        draft = stack.draft
        stack.verifier.pause_at(3)
        runs = asyncio.ensure_future(asyncio.gather(*(stack.run(p, 12) for p in PROMPTS)))
        await stack.verifier.paused.wait()
        draft.kill()  # drafts of step 3 were sent; the verifier has yet to receive them at step 4
        stack.verifier.resume()
        stack.verifier.pause_at(5)
        await stack.verifier.paused.wait()
        status = stack.coordinator.status()
        assert (status["draft_state"], status["draft_connected"], status["fallbacks"]) == ("lost_ar", False, 1)
        assert status["draft_link_transport"] == "" and status["mode"] == "ar"
        # The verifier is told at once to abort that epoch's data plane (over NCCL a receive from a dead
        # peer would otherwise wait out the communicator's timeout).
        assert [(a.epoch, a.reason) for a in stack.verifier.aborts] == [(1, "draft service lost")]
        draft.restart()
        await until(lambda: stack.driver._holds == 1)  # it answers: the recovery waits for step 5
        assert stack.coordinator.status()["draft_state"] == "lost_ar"
        held_tokens = {seq_id: list(tokens) for seq_id, tokens in stack.verifier.seqs.items()}
        stack.verifier.resume()
        assert await runs == [greedy(p, 12) for p in PROMPTS]
        await stack.settle()

        ar = {"drafts": False, "to_draft": False}
        assert stack.plans() == [
            Plan(0, draft=(1, 3), add=(1, 2, 3, 4)),
            Plan(1, draft=(2, 4), verify=(1, 3)),
            Plan(2, draft=(1, 3), verify=(2, 4)),
            Plan(3, draft=(2, 4), verify=(1, 3)),  # 1, 3: 6 tokens; 2, 4: 3
            Plan(4, verify=(1, 2, 3, 4), **ar),  # the verifier finds the data plane gone
            Plan(5, verify=(1, 2, 3, 4), **ar),
            Plan(6, draft=(1, 3)),  # epoch 2 formed while drained; drafting resumes
            Plan(7, draft=(2, 4), verify=(1, 3)),
            Plan(8, draft=(1, 3), verify=(2, 4)),
            Plan(9, draft=(2, 4), verify=(1, 3)),  # 1 and 3 reach 12
            Plan(10, verify=(2, 4), remove=(1, 3)),
            Plan(11, draft=(4,)),  # 2 moves to the empty batch 0
            Plan(12, draft=(2,), verify=(4,)),
            Plan(13, verify=(2,), remove=(4,)),
            Plan(14, remove=(2,)),
        ]
        # The new draft process got every running sequence, exactly as the verifier holds it.
        back = draft.plans[4]
        assert back.step == 6 and {a.seq_id: list(a.tokens) for a in back.add} == held_tokens
        assert [p.step for p in draft.plans] == [0, 1, 2, 3, *range(6, 15)]
        assert [s.epoch for s in stack.verifier.setups] == [1, 2] == [s.epoch for s in draft.setups]
        assert len(stack.verifier.aborts) == 1 and not draft.aborts
        assert draft.streams_opened == 2
        assert stack.driver.draft.state.history == [S.CONNECTING, S.DRAFTING, S.LOST_AR, S.RECOVERING, S.DRAFTING]
        status = stack.coordinator.status()
        assert (status["recoveries"], status["fallbacks"], status["data_plane_epoch"]) == (1, 1, 2)
        assert status["draft_link_transport"] == "gloo" and status["steps_by_kind"]["ar"] == 2
        await stack.coordinator.stop()

    drive(scenario)


def test_a_data_plane_failure_reported_by_the_verifier_alone_also_recovers(tokenizer) -> None:
    """The draft process lives on (its stream stays up) but the process group broke."""

    async def scenario() -> None:
        cfg = ManagerConfig(mode="sd", k=2, pipeline_depth=1, draft_retry_s=0.0)
        stack = Stack(tokenizer, cfg, lambda seq, step: 99)
        await stack.coordinator.start()
        stack.verifier.pause_at(0)
        run = asyncio.ensure_future(stack.run(PROMPTS[0], 9))
        await stack.verifier.paused.wait()
        stack.verifier.cluster.plane.broken = True  # step 0's drafts are lost in transit
        stack.verifier.resume()
        stack.verifier.pause_at(2)
        await until(lambda: stack.driver._holds == 1)  # step 1 reported the loss; the draft answers
        stack.verifier.resume()
        assert await run == greedy(PROMPTS[0], 9)
        await stack.settle()
        assert stack.plans() == [
            Plan(0, draft=(1,), add=(1,)),
            Plan(1, verify=(1,)),  # no drafts arrive: one token, data_plane_lost
            Plan(2, verify=(1,), drafts=False, to_draft=False),
            Plan(3),  # epoch 2 formed; the draft gets 1 back with this plan; its batch drafts at even steps
            Plan(4, draft=(1,)),
            Plan(5, verify=(1,)),
            Plan(6, draft=(1,)),
            Plan(7, verify=(1,)),
            Plan(8, draft=(1,)),
            Plan(9, verify=(1,)),  # 2 + 3 * 3 tokens, cut at 9
            Plan(10, remove=(1,)),
        ]
        assert [a.seq_id for a in stack.draft.plans[2].add] == [1] and stack.draft.plans[2].step == 3
        status = stack.coordinator.status()
        assert (status["fallbacks"], status["recoveries"], status["data_plane_epoch"]) == (1, 1, 2)
        assert stack.driver.draft.state.history[-3:] == [S.LOST_AR, S.RECOVERING, S.DRAFTING]
        await stack.coordinator.stop()

    drive(scenario)


def test_auto_mode_pauses_drafting_that_does_not_pay_and_probes_after_auto_probe_steps(tokenizer) -> None:
    async def scenario() -> None:
        cfg = ManagerConfig(mode="auto", k=2, pipeline_depth=1, auto_min_tokens_per_step=1.5, auto_probe_steps=3)
        stack = Stack(tokenizer, cfg, lambda seq, step: 0)  # every draft token wrong: 1 token per verify
        await stack.coordinator.start()
        assert await asyncio.gather(*(stack.run(p, 14) for p in PROMPTS)) == [greedy(p, 14) for p in PROMPTS]
        await stack.settle()
        plans = stack.plans()
        # 32 speculative sequence-verifies (steps 1..16, two sequences each) before the first judgement
        assert all(p.drafts for p in plans[:17]) and plans[16] == Plan(16, draft=(1, 3), verify=(2, 4))
        assert plans[17:20] == [Plan(s, verify=(1, 2, 3, 4), drafts=False) for s in (17, 18, 19)]
        assert plans[20] == Plan(20, draft=(1, 3))  # the probe: drafting again from a draft step
        assert stack.driver.draft.state.history[:4] == [S.CONNECTING, S.DRAFTING, S.PAUSED_AUTO, S.DRAFTING]
        await stack.coordinator.stop()

    drive(scenario)


@pytest.mark.parametrize(("path", "illegal"), [
    ([], S.RECOVERING),  # CONNECTING: only forming or failing
    ([S.DRAFTING], S.RECOVERING),  # a live link must be lost first
    ([S.DRAFTING, S.LOST_AR], S.DRAFTING),  # no drafting without a new epoch
    ([S.DRAFTING, S.LOST_AR], S.PAUSED_AUTO),
    ([S.LOST_AR, S.RECOVERING], S.PAUSED_AUTO),
    ([S.STOPPING], S.DRAFTING),  # stopping is final
])
def test_moves_outside_the_state_machine_raise(path: list[DraftState], illegal: DraftState) -> None:
    state = DraftLinkState(has_draft=True)
    for step in path:
        state.to(step)
    with pytest.raises(IllegalTransitionError, match=illegal.name):
        state.to(illegal)


def test_without_a_draft_service_the_only_move_is_stopping() -> None:
    state = DraftLinkState(has_draft=False)
    assert state.state is S.ABSENT and not state.connected
    with pytest.raises(IllegalTransitionError):
        state.to(S.DRAFTING)
    state.to(S.STOPPING)


@pytest.mark.parametrize(("reported", "backend", "expected"), [
    (["P2P", "P2P"], "nccl", "P2P"),
    (["nccl", "SHM"], "nccl", "SHM"),  # a TP>1 verifier may not see NCCL's report; the draft did
    (["nccl", "nccl"], "nccl", "nccl"),
    (["gloo", "gloo"], "gloo", "gloo"),
    (["", ""], "gloo", "gloo"),  # workers that do not report: the configured backend
])
def test_the_link_transport_prefers_what_a_worker_read_from_nccl(reported: list[str], backend: str,
                                                                  expected: str) -> None:
    assert link_transport(reported, backend) == expected
