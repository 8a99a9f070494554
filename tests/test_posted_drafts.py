"""Verifies queued before their drafts reach the host (verifier/posted_drafts.py).

The rules first (which plans may read their drafts unread from the posted frame), then sequential SD through
the real worker processes with the draft service drafting on its own device (gloo data plane): with launch-ahead
on, every verify of the steady state takes this path, and the output is still AR's, token for token, for plain
and penalised greedy rows alike; seeded sampled rows take it too (their draft probabilities received behind the
frame) and draw the in-process engine's tokens, and a broken sampled step is judged again without drafts."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import SimpleNamespace

from minedraft.batch_manager.config import ManagerConfig
from minedraft.core.sampling_params import SamplingParams, StructuredOutput
from minedraft.engine.sequence import SeqState
from minedraft.proto import control_pb2
from minedraft.verifier.device_rows import samples
from minedraft.verifier.posted_drafts import DraftedBatch, posted_ids
from tests.conftest import engine_from_folders, pair_stack, serve_requests


def worker(**overrides: SeqState) -> SimpleNamespace:
    """Sequences 1-3 in the steady state (one committed token not yet in the KV), greedy."""
    seqs = {s: SeqState(s, [5, 6, 7], SamplingParams(max_tokens=8), cached=2) for s in (1, 2, 3)}
    seqs.update({int(k[1:]): v for k, v in overrides.items()})
    return SimpleNamespace(seqs=seqs)


DRAFTED = DraftedBatch.of(control_pb2.StepPlan(step=4, draft_batch=[1, 2, 3], with_drafts=True, k=3))


def verify_plan(**fields: object) -> control_pb2.StepPlan:
    return control_pb2.StepPlan(**{"step": 5, "verify_batch": [1, 2, 3], "with_drafts": True, "k": 3, **fields})


def test_the_plan_after_the_drafting_one_reads_its_drafts_on_the_device() -> None:
    assert posted_ids(worker(), DRAFTED, verify_plan()) == [1, 2, 3]
    penalised = SamplingParams(max_tokens=8, repetition_penalty=1.2, logit_bias={4: 1.0})
    assert posted_ids(worker(s2=SeqState(2, [5, 6, 7], penalised, cached=2)), DRAFTED, verify_plan()) == [1, 2, 3]
    # a new sequence joins by drafting first: it is not in this verify
    assert posted_ids(worker(), DRAFTED, verify_plan(add=[control_pb2.SeqSpec(seq_id=9, tokens=[1])])) == [1, 2, 3]
    # a sampled row: its draft probabilities are received into the device behind the frame, except where a
    # tensor-parallel follower would have to judge a broken step again (sampled=False)
    sampled = worker(s3=SeqState(3, [5, 6, 7], SamplingParams(max_tokens=8, temperature=0.8), cached=2))
    assert posted_ids(sampled, DRAFTED, verify_plan()) == [1, 2, 3] and samples(sampled, [1, 2, 3])
    assert posted_ids(sampled, DRAFTED, verify_plan(), sampled=False) is None
    assert posted_ids(worker(), DRAFTED, verify_plan(), sampled=False) == [1, 2, 3] and not samples(worker(), [1, 2])
    # logprobs: the verify computes them on the device beside its verdict
    logprobs = SamplingParams(max_tokens=8, logprobs=1)
    assert posted_ids(worker(s2=SeqState(2, [5, 6, 7], logprobs, cached=2)), DRAFTED, verify_plan()) == [1, 2, 3]


def test_plans_and_rows_whose_frame_the_host_must_read_take_the_ordinary_path() -> None:
    w = worker()
    cases = {
        "not the next step": (DRAFTED, verify_plan(step=6)),
        "drafting switched off": (DRAFTED, verify_plan(with_drafts=False)),
        "another order": (DRAFTED, verify_plan(verify_batch=[2, 1, 3])),
        "a subset": (DRAFTED, verify_plan(verify_batch=[1, 2])),
        "removes a verified sequence": (DRAFTED, verify_plan(remove=[2])),
        "TETRIS-selected drafts": (DraftedBatch(4, (1, 2, 3), 3, True), verify_plan()),
    }
    for why, (drafted, plan) in cases.items():
        assert posted_ids(w, drafted, plan) is None, why
    grammar = SamplingParams(max_tokens=8, structured=StructuredOutput("regex", "[ab]+"))  # advances on the host
    assert posted_ids(worker(s3=SeqState(3, [5, 6, 7], grammar, cached=2)), DRAFTED, verify_plan()) is None
    prefill = SeqState(3, [5, 6, 7], SamplingParams(max_tokens=8), cached=0)
    assert posted_ids(worker(s3=prefill), DRAFTED, verify_plan()) is None
    gone = worker()
    del gone.seqs[3]
    assert posted_ids(gone, DRAFTED, verify_plan()) is None


def test_sequential_sd_queues_each_verify_before_its_drafts_arrive_and_stays_exact(random_pair, tmp_path: Path
                                                                                   ) -> None:
    prompts = [[5, 17, 33, 8, 60, 2, 9], [44, 3], [12, 12, 12, 70, 71, 72], [90, 91]]
    params = [SamplingParams(max_tokens=14, ignore_eos=True), SamplingParams(max_tokens=10, ignore_eos=True),
              SamplingParams(max_tokens=12, ignore_eos=True), SamplingParams(max_tokens=9, ignore_eos=True)]
    ar = engine_from_folders(random_pair[0], None, "ar").generate(prompts, params)
    stack = pair_stack(random_pair[0], random_pair[1], tmp_path, colocated=False, launch_ahead=True)
    try:
        results, status = asyncio.run(asyncio.wait_for(serve_requests(
            stack, random_pair[0], ManagerConfig(mode="sd", k=3), False,
            [(p, sp, None) for p, sp in zip(prompts, params, strict=True)]), 240))
    finally:
        stack.stop()
    assert [[t for c in chunks for t in c.token_ids] for chunks in results] == [r.output_ids for r in ar]
    assert status["steps_by_kind"]["sd"] > 0 and status["steps_by_kind"]["psd"] == 0
    log = (tmp_path / "verifier.log").read_text()
    counts = re.search(r"(\d+) of (\d+) verify steps were launched ahead, (\d+) queued before", log)
    assert counts is not None, "the verifier reports its verify paths when the manager leaves"
    launched, verified, posted = map(int, counts.groups())
    assert launched == 0 and 2 * posted >= verified > 0, (launched, verified, posted)  # prefills read the frame
    assert "re-syncing the draft service" not in log



def sampled_requests(count: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Seeded sampled rows with a greedy one among every four."""
    prompts = [[(7 * i + j) % 90 + 2 for j in range(2 + i % 6)] for i in range(count)]
    params = [SamplingParams(max_tokens=10 + i % 5, ignore_eos=True, temperature=0.9, seed=11 + i) if i % 4 != 3
              else SamplingParams(max_tokens=10, ignore_eos=True) for i in range(count)]
    return prompts, params


def served(random_pair, tmp_path: Path, mode: str, prompts: list[list[int]], params: list[SamplingParams]
           ) -> tuple[list[list[int]], tuple[int, int, int]]:
    """The requests through the real workers launching ahead; their tokens and the verifier's path counts."""
    stack = pair_stack(random_pair[0], random_pair[1], tmp_path, colocated=False, launch_ahead=True)
    try:
        results, status = asyncio.run(asyncio.wait_for(serve_requests(
            stack, random_pair[0], ManagerConfig(mode=mode, k=3), False,
            [(p, sp, None) for p, sp in zip(prompts, params, strict=True)]), 240))
    finally:
        stack.stop()
    assert status["steps_by_kind"][mode] > 0
    log = (tmp_path / "verifier.log").read_text()
    assert "re-syncing the draft service" not in log
    counts = re.search(r"(\d+) of (\d+) verify steps were launched ahead, (\d+) queued before", log)
    assert counts is not None, "the verifier reports its verify paths when the manager leaves"
    launched, verified, posted = map(int, counts.groups())
    return [[t for c in chunks for t in c.token_ids] for chunks in results], (launched, verified, posted)


def test_sampled_rows_take_their_drafts_and_probabilities_unread_and_draw_the_host_paths_tokens(
        random_pair, tmp_path: Path) -> None:
    """Seeded sampled rows (a greedy one beside them) through sequential SD with the draft service on its own
    device: steady verifies take the drafts and their probabilities from the posted receive, and every row
    draws exactly the tokens of the in-process engine, which reads each proposal on the host (each draw is
    keyed by the row's seed and position)."""
    prompts, params = sampled_requests(4)
    reference = [r.output_ids for r in engine_from_folders(random_pair[0], random_pair[1], "sd").generate(prompts,
                                                                                                          params)]
    tokens, (launched, verified, posted) = served(random_pair, tmp_path, "sd", prompts, params)
    assert tokens == reference
    assert launched == 0 and 2 * posted >= verified > 0, (launched, verified, posted)  # prefills read the frame


def test_sampled_psd_verifies_are_launched_ahead_and_draw_the_host_paths_tokens(random_pair, tmp_path: Path) -> None:
    """The same through PSD under load: verifies of sampled rows are queued before the previous verdict is read
    back (their probabilities received behind their frame), with the in-process engine's tokens."""
    prompts, params = sampled_requests(16)
    reference = [r.output_ids for r in engine_from_folders(random_pair[0], random_pair[1], "sd").generate(prompts,
                                                                                                          params)]
    tokens, (launched, verified, _) = served(random_pair, tmp_path, "psd", prompts, params)
    assert tokens == reference
    assert 0 < launched < verified, (launched, verified)


def test_a_broken_sampled_step_is_judged_again_as_the_targets_own_draw(random_pair) -> None:
    """A frame cut short by an abort leaves garbage where the drafts and their probabilities were: after a
    verify over such a proposal, the step judged again without drafts commits exactly the token a plain AR
    step draws from the same state (and its KV), on a verifier that never saw the garbage."""
    import torch

    from minedraft.engine.drafter import Proposal
    from minedraft.verifier.posted_drafts import judged_without_drafts
    from tests.conftest import workers_for

    params = SamplingParams(max_tokens=8, temperature=0.9, seed=5)
    outcomes = []
    for garbage in (True, False):
        verifier, _, _ = workers_for(random_pair[0], random_pair[1])
        verifier.add(1, [5, 17, 33, 8], params)
        verifier.commit([1], verifier.read_back(verifier.judge([1], None)))  # the prompt: now one token uncached
        if garbage:
            drafts = torch.tensor([[3, 90, 41]])
            probs = torch.rand((1, 3, verifier.vocab_size), generator=torch.Generator().manual_seed(3))
            verifier.read_back(verifier.judge([1], Proposal(drafts, probs)))
            readback = judged_without_drafts(verifier, [1], False)
        else:
            readback = verifier.read_back(verifier.judge([1], None))
        rows, accepted = verifier.commit([1], readback)
        nxt = verifier.commit([1], verifier.read_back(verifier.judge([1], None)))[0]  # its KV: what comes next
        outcomes.append((rows, accepted, nxt))
    assert outcomes[0] == outcomes[1] and outcomes[0][1] == [0] and len(outcomes[0][0][0]) == 1
