"""A verify's commit keeps the KV blocks the next verify of the same width writes (engine/verifier.py), so
rejected drafts at a block boundary do not free a block that the next step allocates again; the stale KV in
it never changes an output token, and every block comes back when the sequence goes."""

from __future__ import annotations

from pathlib import Path

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier

K = 3
BLOCK = 4


PROMPT = [5, 9, 2, 40, 7, 11]


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=1 << 10, ignore_eos=True)


def pair(cls: type, folder: Path) -> tuple:
    """The host under test holding sequence 1 (with the free-block count before it), and a second one."""
    tested, other = cls(ModelRunner(load_model(folder), 64, BLOCK)), cls(ModelRunner(load_model(folder), 64, BLOCK))
    free = tested.runner.allocator.num_free
    tested.add(1, list(PROMPT), greedy())
    return tested, other, free


def test_rejected_drafts_keep_the_next_verifys_blocks_and_change_no_token(random_pair: tuple[Path, Path]) -> None:
    sd, ar, free_at_start = pair(Verifier, random_pair[0])
    alloc = sd.runner.allocator
    ar.add(1, list(PROMPT), greedy())
    sd.verify([1], None)  # the prefill emits the first token
    gen = torch.Generator().manual_seed(3)
    grown, churn = 0, 0
    for _ in range(12):
        st = sd.seqs[1]
        start, before = st.cached, list(alloc.table(1))
        drafts = torch.randint(0, sd.vocab_size, (1, K), generator=gen)
        drafts[0, 0] = -1 if st.length % 2 else drafts[0, 0]  # half the steps reject the first draft for sure
        sd.verify([1], Proposal(drafts.clamp(min=0), None))
        after = alloc.table(1)
        assert len(after) == alloc.blocks_for(start + K + 1)  # all this verify wrote, however many were rejected
        assert after[: len(before)] == before  # blocks are only ever added, never released and re-taken
        grown += len(after) > len(before)
        churn += len(after) < len(before)
    assert grown > 0 and churn == 0
    while len(ar.seqs[1].tokens) < len(sd.seqs[1].tokens):
        ar.verify([1], None)
    assert sd.seqs[1].tokens == ar.seqs[1].tokens[: len(sd.seqs[1].tokens)]  # exact despite the stale KV
    sd.remove(1)
    assert alloc.num_free == free_at_start


def test_the_drafter_keeps_its_next_proposals_blocks_and_drafts_as_from_scratch(random_pair: tuple[Path, Path]) -> None:
    drafter, fresh, free_at_start = pair(Drafter, random_pair[1])
    alloc = drafter.runner.allocator
    gen = torch.Generator().manual_seed(4)
    churn = 0
    for step in range(10):
        proposal = drafter.propose([1], K)
        tokens = proposal.tokens[0].tolist()
        fresh.add(100 + step, list(drafter.seqs[1].tokens), greedy())  # the same history, no KV before it
        assert fresh.propose([100 + step], K).tokens[0].tolist() == tokens
        fresh.remove(100 + step)
        before = list(alloc.table(1))
        accepted = int(torch.randint(0, K + 1, (1,), generator=gen))
        bonus = int(torch.randint(0, drafter.vocab_size, (1,), generator=gen))
        drafter.commit(1, [*tokens[:accepted], bonus], accepted)
        after = alloc.table(1)
        assert len(after) == alloc.blocks_for(drafter.seqs[1].length + K - 1) or after == before
        churn += len(after) < len(before)
    assert churn == 0
    drafter.remove(1)
    assert alloc.num_free == free_at_start
