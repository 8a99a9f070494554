"""Adaptive k near the end of a batch: with nothing waiting, auto picks the k whose running sequences are
expected to end soonest (adaptive_k.py's T(k)), from each sequence's own acceptance and tokens to go.

The closed batch below is simulated with step costs shaped like the H200's colocated 8B pair (a full
batch's step grows steeply with k, a nearly empty one gently) and sequences whose acceptance differs,
as the synthetic pair's do (an equal-length batch ended 1.23x after its mean sequence at k = 5)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from minedraft.batch_manager.adaptive_k import AdaptiveK
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.plan_k import PlanK
from minedraft.proto import control_pb2
from tests.fake_worker_links import FakeCluster, greedy
from tests.step_driver_support import drive, word_tokenizer
from tests.test_adaptive_k import TimedDraft, TimedVerifier, generate_each


def cycle_ms(k: int, batch: int) -> float:
    """A fused SD cycle: the weights' read, k draft forwards, and per-sequence work that grows with k."""
    return 5.0 + 0.9 * k + batch * (0.02 + 0.018 * k)


PSD_STEP_OVERHEAD_MS = 0.3


def psd_ms(k: int, batch: int) -> tuple[float, float]:
    """Draft and verify ms of a PSD step on two H200s (8B-shaped pair): k draft forwards at ~1 ms each, and a
    verify of b(k+1) tokens, flat to ~100 tokens and then compute-bound (measured: 5.9-6.2 ms at 48-112 tokens,
    6.8 at 160, 8.2 at 224)."""
    tokens = batch * (k + 1)
    return 0.15 + 0.97 * k + 0.002 * batch * k, 5.7 + 0.003 * tokens + 0.012 * max(0, tokens - 96)


def run_batch(policy: int | str, acceptance: list[float], lengths: list[int], seed: int,
              bound: int | None = None, psd: bool = False) -> tuple[float, dict]:
    """Simulated ms until every sequence has its tokens; `policy` a fixed k, 'auto' (nothing waits, so
    the end counts) or 'auto-rate' (the steady rate only, as if requests waited). Whether the draft of a
    sequence's i-th token is right is drawn once, as with greedy decoding: every policy meets the same luck.
    `bound`: what auto is told each running sequence has to go (its max_tokens, where an end of sequence
    comes first), instead of the truth. Fused SD (`cycle_ms`) on a deployment that has measured every k
    and size, or with `psd`, PSD from a cold start (`psd_ms`: a step is the longer of draft and verify)."""
    rng = random.Random(seed)
    right = [[rng.random() < p for _ in range(n + 8)] for p, n in zip(acceptance, lengths, strict=True)]
    done = [0] * len(lengths)
    to_go = dict(enumerate(lengths))
    told = to_go.get if bound is None else lambda s: bound if to_go[s] > 0 else 0
    plan = PlanK(lambda: not psd, told, lambda: policy == "auto-rate")
    if not psd:
        plan.adaptive = AdaptiveK(k_max=6)  # a deployment that has served at every batch size and k
        measured(plan.adaptive, range(1, 65))
    mode, k_policy = ("auto", 6) if isinstance(policy, str) else ("sd", policy)
    total_ms, removed = 0.0, []
    for step in range(10_000):
        live = [s for s, r in to_go.items() if r > 0]
        if not live:
            return total_ms, plan.snapshot() or {}
        k = plan.for_plan(step, mode, k_policy, True, draft_batch=live, verify_batch=live, removed=removed)
        draft_ms, verify_ms = psd_ms(k, len(live)) if psd else (cycle_ms(k, len(live)), 0.0)
        total_ms += max(draft_ms, verify_ms) + PSD_STEP_OVERHEAD_MS * psd
        if psd:
            plan.on_draft(step, draft_ms, len(live))
        accepted = []
        for s in live:
            n = 0
            while n < k and right[s][done[s] + n]:
                n += 1
            accepted.append(n)
            done[s] += n + 1
            to_go[s] = max(0, to_go[s] - n - 1)
        plan.on_verify(step, k, accepted, verify_ms if psd else draft_ms, live)
        removed = [s for s in live if to_go[s] == 0]
    raise AssertionError("the batch never ended")


def mixed_batch(m: int, seed: int, mean: float = 0.9) -> list[float]:
    rng = random.Random(seed)
    return [min(0.99, max(0.5, rng.gauss(mean, 0.05))) for _ in range(m)]


def measured(est: AdaptiveK, batch_sizes: range) -> None:
    for b in batch_sizes:
        for k in range(1, est.k_max + 1):
            est.draft.add(k, cycle_ms(k, b), b)
            est.verify.add(k, 0.0, b)


def test_a_closed_batch_ends_sooner_than_with_the_rate_and_about_as_soon_as_with_the_best_fixed_k() -> None:
    """Six batches of 48 equal requests: auto (which cannot know which fixed k would have been best) ends
    within 1.5% of the best fixed k's time, and 1.5% sooner than choosing by the steady rate (measured:
    0.992 and 0.967 of the best fixed k's speed)."""
    totals: dict[int | str, float] = {}
    for policy in (1, 2, 3, 4, 5, 6, "auto-rate", "auto"):
        totals[policy] = sum(run_batch(policy, mixed_batch(48, seed), [256] * 48, seed)[0] for seed in range(6))
    best_fixed = min(totals[k] for k in range(1, 7))
    assert totals["auto"] <= best_fixed * 1.015, totals
    assert totals["auto"] < totals["auto-rate"] * 0.985, totals  # the rate alone: too long a window for the tail


def test_lengths_that_differ_end_no_later_than_with_the_rate() -> None:
    """Requests of 32..480 tokens: the rate's k is nearly right here (the end matters less when most requests
    leave early); weighing the end does not cost anything (measured 0.994 vs the rate's 0.988)."""
    rng = random.Random(7)
    lengths = [rng.randint(32, 480) for _ in range(32)]
    auto = sum(run_batch("auto", mixed_batch(32, s), lengths, s)[0] for s in range(6))
    rate = sum(run_batch("auto-rate", mixed_batch(32, s), lengths, s)[0] for s in range(6))
    best_fixed = min(sum(run_batch(k, mixed_batch(32, s), lengths, s)[0] for s in range(6)) for k in range(1, 7))
    assert auto <= rate and auto <= best_fixed * 1.015, (auto, rate, best_fixed)


def test_requests_that_end_before_their_max_tokens_cost_nothing() -> None:
    """Requests ended by an end-of-sequence token (lengths ~ exponential, mean 200) while auto believes each has
    2000 tokens to go: it plans for a tail that never comes, and still ends the batch no later than the rate
    rule does (measured: in 0.934 of the rate rule's time)."""
    batches = [(mixed_batch(48, s), [max(8, int(random.Random(s).expovariate(1 / 200))) for _ in range(48)])
               for s in range(6)]
    told_max = sum(run_batch("auto", acc, lengths, s, bound=2000)[0] for s, (acc, lengths) in enumerate(batches))
    rate = sum(run_batch("auto-rate", acc, lengths, s)[0] for s, (acc, lengths) in enumerate(batches))
    assert told_max <= rate * 1.005, (told_max, rate)


def test_while_requests_wait_auto_keeps_to_the_steady_rate() -> None:
    _, seen = run_batch("auto-rate", mixed_batch(16, 1), [128] * 16, 1)
    assert seen["plans_for_the_end"] == 0 and sum(seen["plans_by_k"].values()) > 0  # type: ignore[union-attr]
    _, seen = run_batch("auto", mixed_batch(16, 1), [128] * 16, 1)
    assert seen["plans_for_the_end"] == sum(seen["plans_by_k"].values())  # type: ignore[union-attr]


def test_equal_sequences_at_an_even_cost_pick_the_rate_choice() -> None:
    """Equal sequences end together, so T(k) = steps(k) * c(k, b): the steady rate's k."""
    est = AdaptiveK(k_max=6)
    measured(est, range(1, 33))
    est.track(range(16))
    rng = random.Random(3)
    for _ in range(40):
        est.observe_verdicts(6, [min(6, int(rng.expovariate(0.3))) for _ in range(16)], range(16))
    est.by_seq = {s: [60.0, 80.0] for s in range(16)}  # the same acceptance for each
    for r in (64, 256, 4096):
        finish = est.choose_to_finish(dict.fromkeys(range(16), r))
        assert finish == est.choose(batch=16) or r < 256, (r, finish, est.choose(batch=16))


def test_the_slowest_sequence_sets_the_choice() -> None:
    """One sequence that rejects most drafts, with as far to go as the rest: its steps set the batch's end, and
    a long window buys it little while every step pays for it."""
    est = AdaptiveK(k_max=6)
    measured(est, range(1, 65))
    est.track(range(64))
    rng = random.Random(4)
    for _ in range(30):
        est.observe_verdicts(6, [sum(1 for _ in iter(lambda: rng.random() < 0.95, False)) % 7 for _ in range(64)],
                             range(64))
    fast = est.choose_to_finish(dict.fromkeys(range(64), 200))
    est.by_seq[0] = [10.0, 100.0]  # sequence 0 accepts one draft in ten
    slow = est.choose_to_finish(dict.fromkeys(range(64), 200))
    assert slow < fast, (slow, fast)
    assert est.choose_to_finish({**dict.fromkeys(range(1, 64), 200), 0: 5}) == fast  # almost done: it no longer counts


def test_a_retired_sequence_is_forgotten_even_when_its_last_verdict_comes_late() -> None:
    plan = PlanK(lambda: True, lambda s: 100, lambda: False)
    plan.for_plan(0, "auto", 4, True, draft_batch=[1, 2], verify_batch=[])
    plan.on_verify(1, 4, [4, 0], 8.0, [1, 2])
    assert plan.adaptive is not None and plan.adaptive.by_seq == {1: [4.0, 4.0], 2: [0.0, 1.0]}
    plan.for_plan(1, "auto", 4, True, draft_batch=[1], verify_batch=[1, 2], removed=[2])
    plan.on_verify(2, 4, [1, 3], 8.0, [1, 2])  # 2's verdict from a plan in flight when it retired
    assert plan.adaptive.by_seq == {1: [5.0, 6.0]}


def test_the_step_loop_weighs_the_end_once_no_request_waits(tmp_path: Path) -> None:
    """Six requests for a batch of two: auto keeps to the rate while some wait and weighs the end for the
    last two; /health counts those plans; each sequence's acceptance is dropped when it retires; the
    output stays the verifier's greedy tokens."""
    cluster = FakeCluster()
    verifier, draft = TimedVerifier(cluster), TimedDraft(cluster, lambda seq, step: 2)
    cluster.workers = [verifier, draft]
    config = ManagerConfig(mode="auto", k=4, pipeline_depth=1, draft_retry_s=0.0, max_num_seqs=2,
                           auto_min_tokens_per_step=1.0)
    coordinator = Coordinator(word_tokenizer(tmp_path / "tok"), "fake", verifier, draft, config)
    prompts = [[5 + 3 * i, 6 + 3 * i, 7 + 3 * i] for i in range(6)]
    outputs: list[list[int]] = []

    async def scenario() -> None:
        await coordinator.start(connect_timeout=2)
        outputs.extend(await generate_each(coordinator, prompts, 40))
        await coordinator.stop()

    drive(scenario)
    assert outputs == [greedy(p, 40) for p in prompts]
    learnt = coordinator.status()["adaptive_k"]
    assert isinstance(learnt, dict)
    drafted_plans = sum(learnt["plans_by_k"].values())
    assert 0 < learnt["plans_for_the_end"] < drafted_plans, learnt
    estimate = coordinator.driver.k_plan.adaptive
    assert estimate is not None and estimate.by_seq == {}  # every sequence retired, none kept


def test_sequences_lost_with_the_verifier_are_forgotten() -> None:
    """A lost verifier takes its sequences along and no plan carries their removal: the driver forgets them."""
    plan = PlanK(lambda: False, lambda s: 100, lambda: False)
    added = [control_pb2.SeqSpec(seq_id=s) for s in (1, 2, 3)]
    plan.for_plan(0, "auto", 4, True, draft_batch=[1, 2, 3], verify_batch=[], added=added)
    assert plan.adaptive is not None and set(plan.adaptive.by_seq) == {1, 2, 3} and plan.unverified == {1, 2, 3}
    plan.forget([1, 2, 3])
    assert plan.adaptive.by_seq == {} and plan.unverified == set() and plan.undrafted == set()


def test_each_auto_plan_explains_its_k_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """MINEDRAFT_LOG_LEVEL=DEBUG: one line per auto plan naming the rule, the rate's k, the slowest sequence
    and each k's score."""
    caplog.set_level(logging.DEBUG, logger="minedraft.batch_manager.plan_k")
    run_batch("auto", [0.95, 0.95, 0.3], [64, 64, 64], 0)
    lines = [r.getMessage() for r in caplog.records if "auto drafts" in r.getMessage()]
    assert lines and all("by the end (the rate's k: " in line for line in lines)
    assert "lowest sequence 2 at" in lines[-1]  # the one accepting 3 drafts in 10
    assert "scores by k (ms to the end) 1:" in lines[-1] and " 6:" in lines[-1]


def test_the_end_rule_is_worked_out_once_every_few_plans_of_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its k stands for the next FINISH_REUSES plans of the same batch (it costs the manager's one core 0.1-0.3 ms
    a plan); a batch that shrank is worked out afresh, and a neighbour drafted to measure it is not kept."""
    to_go = dict.fromkeys(range(8), 100)
    plan = PlanK(lambda: True, to_go.get, lambda: False)
    plan.adaptive = AdaptiveK(k_max=6)
    measured(plan.adaptive, range(1, 9))
    calls = []
    real = AdaptiveK.choose_to_finish
    monkeypatch.setattr(AdaptiveK, "choose_to_finish", lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    ks = [plan.for_plan(step, "auto", 6, True, draft_batch=list(range(8))) for step in range(8)]
    assert len(calls) == 2 and len(set(ks)) == 1  # plans 0 and 4
    plan.for_plan(8, "auto", 6, True, draft_batch=list(range(7)), removed=[7])
    assert len(calls) == 3
    plan.adaptive.draft.buckets[8].by_k.pop(ks[0] - 1)  # the chosen k's neighbour is unmeasured again
    probe = plan.for_plan(9, "auto", 6, True, draft_batch=list(range(7)))
    assert len(calls) == 3 and probe == ks[0]  # still kept from plan 8
    plan.finish_kept.clear()
    probe = plan.for_plan(10, "auto", 6, True, draft_batch=list(range(7)))
    assert probe == ks[0] - 1 and plan.for_plan(11, "auto", 6, True, draft_batch=list(range(7))) == ks[0] - 1
    assert len(calls) == 5  # the probe was not kept: worked out again (and the neighbour is still unmeasured)
