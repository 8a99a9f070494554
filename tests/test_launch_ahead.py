"""Which next plans the verifier may queue before reading the current verdict back (launch_ahead.py).

The whole path runs in tests/test_psd_stack.py (its verifier launches ahead); here, each rule that keeps a
plan on the ordinary path."""

from __future__ import annotations

from types import SimpleNamespace

from minedraft.core.sampling_params import SamplingParams
from minedraft.core.structured import StructuredOutput
from minedraft.engine.sequence import SeqState
from minedraft.proto import control_pb2
from minedraft.verifier.device_rows import host_free
from minedraft.verifier.launch_ahead import launchable_ids


def worker(**overrides: SeqState) -> SimpleNamespace:
    """Sequences 1-4 in the steady state (one committed token not yet in the KV), greedy."""
    seqs = {s: SeqState(s, [5, 6, 7], SamplingParams(max_tokens=8), cached=2) for s in (1, 2, 3, 4)}
    seqs.update({int(k[1:]): v for k, v in overrides.items()})
    return SimpleNamespace(seqs=seqs)


def plans(**next_fields: object) -> tuple[control_pb2.StepPlan, control_pb2.StepPlan]:
    current = control_pb2.StepPlan(step=7, draft_batch=[3, 4], verify_batch=[1, 2], with_drafts=True, k=4)
    fields = {"step": 8, "draft_batch": [1, 2], "verify_batch": [3, 4], "with_drafts": True, "k": 4,
              **next_fields}
    return current, control_pb2.StepPlan(**fields)


def test_the_plain_psd_step_is_launched_with_the_drafted_batch() -> None:
    current, nxt = plans()
    assert launchable_ids(worker(), current, [1, 2], nxt) == [3, 4]
    current, nxt = plans(add=[control_pb2.SeqSpec(seq_id=9, tokens=[1, 2])], remove=[])
    assert launchable_ids(worker(), current, [1, 2], nxt) == [3, 4]  # a new sequence only drafts next


def test_every_other_plan_takes_the_ordinary_path() -> None:
    w = worker()
    cases = {
        "not the next step": plans(step=9),
        "drafting switched off": plans(with_drafts=False),
        "a different verify batch": plans(verify_batch=[4, 3]),
        "a subset of the drafted batch": plans(verify_batch=[3]),
        "removes a sequence being verified now": plans(remove=[2]),
        "removes a drafted sequence": plans(remove=[4]),
    }
    for why, (current, nxt) in cases.items():
        assert launchable_ids(w, current, [1, 2], nxt) is None, why
    current, nxt = plans()
    no_drafts = control_pb2.StepPlan(step=7, verify_batch=[1, 2], with_drafts=True, k=4)
    assert launchable_ids(w, no_drafts, [1, 2], nxt) is None


def test_a_batch_being_verified_now_is_never_launched_ahead() -> None:
    """Sequential SD drafts and verifies one batch: its next verify starts where this verdict leaves each row,
    which the host learns only at the commit, so it takes the ordinary path however early its plan arrives."""
    current = control_pb2.StepPlan(step=7, draft_batch=[1, 2], verify_batch=[1, 2], with_drafts=True, k=4)
    nxt = control_pb2.StepPlan(step=8, draft_batch=[1, 2], verify_batch=[1, 2], with_drafts=True, k=4)
    assert launchable_ids(worker(), current, [1, 2], nxt) is None
    overlapping = control_pb2.StepPlan(step=7, draft_batch=[2, 3], verify_batch=[1, 2], with_drafts=True, k=4)
    nxt_overlap = control_pb2.StepPlan(step=8, draft_batch=[1], verify_batch=[2, 3], with_drafts=True, k=4)
    assert launchable_ids(worker(), overlapping, [1, 2], nxt_overlap) is None


def test_rows_that_need_their_own_path_are_not_launched() -> None:
    current, nxt = plans()
    prompt_pending = SeqState(4, [5, 6, 7], SamplingParams(max_tokens=8), cached=0)  # first verify: a prefill
    assert launchable_ids(worker(s4=prompt_pending), current, [1, 2], nxt) is None
    # a sampled row launches, its draft probabilities received behind the frame; not where tensor-parallel
    # followers would have to judge a broken step again (sampled=False)
    sampled = SeqState(4, [5, 6, 7], SamplingParams(max_tokens=8, temperature=0.7), cached=2)
    assert launchable_ids(worker(s4=sampled), current, [1, 2], nxt) == [3, 4]
    assert launchable_ids(worker(s4=sampled), current, [1, 2], nxt, sampled=False) is None
    gone = worker()
    del gone.seqs[3]
    assert launchable_ids(gone, current, [1, 2], nxt) is None


def test_penalised_rows_launch_and_rows_that_need_the_host_between_steps_do_not() -> None:
    """Penalties, biases and min_tokens run on the device from the batch's committed history, which is whole
    before the step is queued, and a verify computes its rows' logprobs on the device beside the verdict; a
    grammar advances on the host between steps."""
    current, nxt = plans()
    penalised = SamplingParams(max_tokens=8, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=-0.5,
                               logit_bias={3: 2.0}, min_tokens=4)
    assert launchable_ids(worker(s4=SeqState(4, [5, 6, 7], penalised, cached=2)), current, [1, 2], nxt) == [3, 4]
    logprobs = SamplingParams(max_tokens=8, logprobs=2, prompt_logprobs=1)
    assert launchable_ids(worker(s3=SeqState(3, [5, 6, 7], logprobs, cached=2)), current, [1, 2], nxt) == [3, 4]
    assert host_free(logprobs)
    grammar = SamplingParams(max_tokens=8, structured=StructuredOutput("regex", "[ab]+"))
    assert launchable_ids(worker(s3=SeqState(3, [5, 6, 7], grammar, cached=2)), current, [1, 2], nxt) is None
