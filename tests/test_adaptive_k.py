"""Adaptive k (auto mode): acceptance by position and step costs in, the best expected tokens per ms out;
and the step loop drafting the chosen k, with exact greedy output."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from minedraft.batch_manager.adaptive_k import AdaptiveK
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.plan_k import PlanK
from minedraft.batch_manager.step_costs import StepCosts
from minedraft.core.errors import InvalidRequestError
from minedraft.core.sampling_params import SamplingParams
from minedraft.proto import control_pb2
from tests.fake_worker_links import FakeCluster, FakeDraft, FakeVerifier, greedy
from tests.step_driver_support import drive, word_tokenizer


def accepted_counts(p: float, k: int, sequences: int, rng: random.Random) -> list[int]:
    """How many of k drafts each sequence accepts when each is right with probability p (i.i.d.)."""
    counts = []
    for _ in range(sequences):
        n = 0
        while n < k and rng.random() < p:
            n += 1
        counts.append(n)
    return counts


def feed(est: AdaptiveK, p: float, k: int, sequences: int, rng: random.Random) -> None:
    """Verdicts of such sequences, 16 per verify."""
    for _ in range(sequences // 16):
        est.observe_verdicts(k, accepted_counts(p, k, 16, rng))


def best_by_brute_force(p: float, k_max: int, draft_ms: float, verify_ms: float, overlapped: bool) -> int:
    def rate(k: int) -> float:
        tokens = sum(p**i for i in range(k + 1))
        ms = max(draft_ms * k, verify_ms) if overlapped else draft_ms * k + verify_ms
        return tokens / ms
    return max(range(1, k_max + 1), key=rate)


def test_acceptance_by_position_is_measured_from_verdicts() -> None:
    est = AdaptiveK(k_max=6)
    feed(est, 0.6, 6, 4000, random.Random(1))
    p = est.acceptance()
    assert all(abs(x - 0.6) < 0.08 for x in p[:3]) and all(abs(x - 0.6) < 0.12 for x in p)  # deep: fewer tries
    assert abs(est.expected_tokens(3) - (1 + 0.6 + 0.36 + 0.216)) < 0.15


@pytest.mark.parametrize(("p", "overlapped"), [(0.3, True), (0.6, True), (0.9, True), (0.6, False), (0.95, False)])
def test_choice_maximises_expected_tokens_per_ms(p: float, overlapped: bool) -> None:
    est = AdaptiveK(k_max=8)
    feed(est, p, 8, 6000, random.Random(2))
    for k in range(1, 9):
        est.draft.add(k, 1.0 * k)
    for k in (1, 8):  # the verify's cost at the other k: the line through these two
        est.verify.add(k, 5.0)
    assert est.choose(overlapped) == best_by_brute_force(p, 8, 1.0, 5.0, overlapped)


def test_choice_stays_at_k_max_until_both_sides_were_measured() -> None:
    est = AdaptiveK(k_max=5)
    feed(est, 0.1, 5, 800, random.Random(3))
    est.verify.add(5, 4.0)
    assert est.choose() == 5
    est.draft.add(5, 5.0)
    assert est.choose() < 5  # low acceptance: shorter drafts pay once the costs are known


def test_costs_of_unmeasured_k_follow_the_measured_ones() -> None:
    costs = StepCosts()
    assert costs.estimate(3, grows_with_k=True) is None
    costs.add(4, 8.0)
    assert costs.estimate(2, grows_with_k=True) == 4.0 and costs.estimate(2, grows_with_k=False) == 8.0
    costs.add(2, 5.0)
    assert costs.estimate(6, grows_with_k=True) == pytest.approx(11.0)


def test_plan_k_is_the_policy_k_outside_auto_and_bounded_inside() -> None:
    plan = PlanK()
    assert plan.for_plan(0, "psd", 4, True) == 4
    assert plan.judged(1) == 4 and plan.for_plan(1, "ar", 4, False) == 4 and plan.judged(2) == 0
    assert plan.for_plan(2, "auto", 6, True) == 6  # nothing measured yet
    assert plan.adaptive is not None and plan.adaptive.k_max == 6
    with pytest.raises(ValueError):
        AdaptiveK(k_max=3, k_min=4)


def test_fixed_k_modes_teach_the_estimate_so_auto_starts_from_what_was_measured() -> None:
    """A deployment in psd at k = 4 with a draft that costs 4 ms per token, a flat 6 ms verify and acceptance
    0.3: the first auto plan after a policy change already drafts less (k = 1 is best), instead of k_max."""
    plan = PlanK()
    assert plan.for_plan(0, "ar", 4, False) == 4 and plan.snapshot() is None  # nothing drafted: nothing learnt
    rng = random.Random(5)
    for step in range(1, 60):
        assert plan.for_plan(step, "psd", 4, True, draft_batch=[1, 2, 3, 4], verify_batch=[5, 6, 7, 8]) == 4
        plan.on_draft(step, 16.0, 4)
        plan.on_verify(step, 4, accepted_counts(0.3, 4, 4, rng), 6.0)
    learnt = plan.snapshot()
    assert learnt is not None and learnt["plans_by_k"] == {}  # auto chose nothing yet
    assert learnt["draft_ms_by_batch_and_k"] == {4: {4: 16.0}} and learnt["verify_ms_by_tokens"] == {20: 6.0}
    assert all(abs(p - 0.3) < 0.12 for p in learnt["acceptance_by_position"][:2])
    assert plan.for_plan(60, "psd", 6, True, draft_batch=[1, 2, 3, 4]) == 6 and plan.adaptive.k_max == 6
    assert plan.for_plan(61, "auto", 6, True, draft_batch=[1, 2, 3, 4], verify_batch=[5, 6, 7, 8]) == 1


def test_draft_costs_are_kept_per_batch_size_and_verify_costs_by_the_tokens_checked() -> None:
    """A draft step's cost by k and batch size (a size not seen borrows the nearest): what the tail's small batches
    cost must not stand for full ones. A verify's by the tokens it checks, b(k+1), shaped like two H200s' 8B
    verify: flat while the weights' read dominates, then rising."""
    est = AdaptiveK(k_max=6)
    for k in (1, 2, 3, 4):
        est.draft.add(k, 1.0 * k, batch=16)
        est.draft.add(k, 0.2 * k, batch=2)
    assert est.draft.estimate(3, True, batch=12) == 3.0 and est.draft.estimate(3, True, batch=48) == 3.0
    assert est.draft.estimate(3, True, batch=3) == pytest.approx(0.6)  # bucket 4 is unseen: 2 is nearer than 16
    for batch, k, ms in ((16, 2, 5.9), (16, 6, 6.2), (32, 6, 8.2)):  # 48, 112 and 224 tokens
        est.verify.add(k, ms, batch)
    assert est.verify.estimate(1, batch=8) == 5.9  # 16 tokens: below the smallest count, its cost
    assert est.verify.estimate(4, batch=32) == pytest.approx(6.2 + 2.0 * 48 / 112)  # 160 tokens: between
    assert est.verify.estimate(6, batch=64) == pytest.approx(8.2 + 2.0 * 224 / 112)  # 448: the last slope on
    assert est.verify.measured(4, batch=32) and not est.verify.measured(6, batch=64)
    assert est.step_ms(4, True, batch=16) == pytest.approx(5.9 + 0.3 * 32 / 64)  # verify-bound (80 tokens)
    assert est.step_ms(4, True, batch=2) == 5.9  # a draft of 0.8 ms hides behind the floor of the verify


def specs(*seq_ids: int) -> list[control_pb2.SeqSpec]:
    return [control_pb2.SeqSpec(seq_id=s) for s in seq_ids]


def test_auto_chooses_within_k_min_and_k() -> None:
    """Costs that favour k = 1 (draft 4 ms per token, verify flat 6 ms, acceptance 0.5): auto stays at k_min."""
    plan = PlanK()
    for step in range(40):
        chosen = plan.for_plan(step, "auto", 6, True, k_min=3)
        assert 3 <= chosen <= 6
        plan.on_draft(step, 4.0 * chosen)
        plan.on_verify(step, chosen, [1, 0, 2, 1], 6.0)
    assert plan.for_plan(40, "auto", 6, True, k_min=3) == 3
    assert plan.for_plan(41, "auto", 6, True, k_min=1) == 1  # a policy change widens the range at once
    with pytest.raises(InvalidRequestError, match="k_min"):
        ManagerConfig(mode="auto", k=2, k_min=3).validate()


def test_steps_that_compute_a_prompt_teach_acceptance_but_not_costs() -> None:
    """The first verify (draft) of a sequence also computes its prompt: a prefill-sized time must not enter
    the per-k cost of the k in use, or auto leaves the best k after every burst of new requests."""
    plan = PlanK()
    plan.for_plan(0, "auto", 4, True, draft_batch=[1, 2], verify_batch=[], added=specs(1, 2, 3, 4))
    plan.for_plan(1, "auto", 4, True, draft_batch=[3, 4], verify_batch=[1, 2])
    plan.for_plan(2, "auto", 4, True, draft_batch=[1, 2], verify_batch=[3, 4])
    plan.for_plan(3, "auto", 4, True, draft_batch=[3, 4], verify_batch=[1, 2])
    assert plan.adaptive is not None
    plan.on_draft(0, 50.0)  # drafts 1 and 2 for the first time: prompt included
    plan.on_draft(1, 40.0)  # 3 and 4 likewise
    plan.on_verify(1, 4, [2, 2], 90.0)  # 1 and 2's first verify
    plan.on_verify(2, 4, [3, 1], 80.0)  # 3 and 4's
    assert plan.adaptive.draft.buckets == {} and plan.adaptive.verify.bins == {}
    assert sum(plan.adaptive.tried) > 0  # their verdicts still count
    plan.on_draft(2, 4.0)
    plan.on_verify(3, 4, [4, 0], 6.0)  # steady state: measured
    draft_costs = plan.adaptive.draft.buckets
    assert draft_costs[0].by_k == {4: 4.0} and plan.adaptive.verify.view() == {10: 6.0}  # 2 sequences, 5 tokens each
    plan.for_plan(4, "auto", 4, True, draft_batch=[1, 2, 5], verify_batch=[3, 4], added=specs(5), removed=[])
    plan.on_draft(4, 30.0)  # 5's prompt rides along in the draft batch
    assert draft_costs[0].by_k == {4: 4.0} and set(draft_costs) == {0}
    # A recovered draft service recomputes every prompt it is sent again.
    plan.for_plan(5, "auto", 4, True, draft_batch=[3, 4], verify_batch=[1, 2, 5], redrafted=specs(3, 4))
    plan.on_draft(5, 30.0)
    assert draft_costs[0].by_k == {4: 4.0} and set(draft_costs) == {0}


class TimedVerifier(FakeVerifier):
    """Reports a verify cost flat in k, as a memory-bound verify of a small batch is."""

    def execute(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        event = super().execute(plan)
        event.timing.compute_ms = 6.0 if plan.verify_batch else 0.0
        return event


class TimedDraft(FakeDraft):
    """Reports a draft cost of 4 ms per draft token (from k = 2 on, longer than the verify: in PSD a longer
    draft is no longer hidden behind the other batch's verify)."""

    def execute(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        event = super().execute(plan)
        event.timing.compute_ms = 4.0 * plan.k if plan.with_drafts and plan.draft_batch else 0.0
        return event


async def generate_each(coordinator: Coordinator, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Every prompt at once through the coordinator (ignoring EOS); each one's output tokens."""
    async def one(prompt: list[int]) -> list[int]:
        out: list[int] = []
        async for chunk in coordinator.generate(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), "t"):
            out += chunk.token_ids
        return out

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def test_auto_mode_drafts_the_chosen_k_and_output_stays_exact(tmp_path: Path) -> None:
    """Only the first draft is ever right: after a few steps auto drafts k = 1 (the same expected tokens as
    any longer draft, in the shortest step), while the outputs stay the verifier's greedy tokens."""
    cluster = FakeCluster()
    verifier, draft = TimedVerifier(cluster), TimedDraft(cluster, lambda seq, step: 1)
    cluster.workers = [verifier, draft]
    config = ManagerConfig(mode="auto", k=5, pipeline_depth=1, draft_retry_s=0.0, auto_min_tokens_per_step=1.0)
    coordinator = Coordinator(word_tokenizer(tmp_path / "tok"), "fake", verifier, draft, config)
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]]

    async def scenario() -> list[list[int]]:
        await coordinator.start(connect_timeout=2)
        outputs = await generate_each(coordinator, prompts, 60)
        await coordinator.stop()
        return outputs

    outputs: list[list[int]] = []

    async def run() -> None:
        outputs.extend(await scenario())

    drive(run)
    assert outputs == [greedy(p, 60) for p in prompts]
    ks = [p.k for p in draft.plans if p.with_drafts and p.draft_batch]
    assert ks[0] == 5 and ks[-1] == 1 and set(ks[-5:]) == {1}
    learnt = coordinator.status()["adaptive_k"]  # what /health shows
    assert isinstance(learnt, dict) and (learnt["k_min"], learnt["k_max"]) == (1, 5)
    plans_by_k = learnt["plans_by_k"]
    assert sum(plans_by_k.values()) >= len(ks) and max(plans_by_k, key=plans_by_k.get) == 1
    first, second = learnt["acceptance_by_position"][:2]  # the second shrinks to the pool: seldom tried
    assert first > 0.9 and second < first - 0.2
    verify_costs, draft_costs = learnt["verify_ms_by_tokens"], learnt["draft_ms_by_batch_and_k"]
    assert verify_costs[12] == 6.0 and draft_costs[2][1] == 4.0  # two batches of 2 sequences each
