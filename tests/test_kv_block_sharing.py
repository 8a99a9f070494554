"""Shared KV blocks for n > 1 inside one worker: the allocator's reference counts, and a real drafter forking a
sibling (the same drafts, the shared blocks never written). The batch manager's side: test_prompt_sharing.py."""

from __future__ import annotations

import pytest
import torch

from minedraft.bundled import TINY_DRAFT
from minedraft.core.errors import OutOfBlocksError
from minedraft.engine.drafter import Drafter
from minedraft.engine.kv_cache import BlockAllocator
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.proto import control_pb2
from minedraft.worker.membership import apply_membership

BS = 16

# ----- the allocator -------------------------------------------------------------------------


def test_share_gives_the_child_the_parents_full_blocks_before_its_last_prompt_token() -> None:
    alloc = BlockAllocator(10, BS)
    alloc.ensure(1, 40)  # 3 blocks
    parent = alloc.table(1)
    assert alloc.share(1, 2, 40) == 32  # floor(39 / 16) = 2 blocks
    assert alloc.table(2) == parent[:2] and [alloc.refs(b) for b in parent] == [2, 2, 1]
    assert alloc.num_free == 7
    assert alloc.share(1, 3, 33) == 32 and alloc.share(1, 4, 32) == 16 and alloc.share(1, 5, 16) == 0
    assert alloc.table(5) == [] and alloc.refs(parent[0]) == 4 and alloc.num_free == 7
    alloc.ensure(2, 41)  # the child grows with blocks of its own, after the shared ones
    assert alloc.table(2)[:2] == parent[:2] and alloc.refs(alloc.table(2)[2]) == 1 and alloc.num_free == 6
    with pytest.raises(ValueError):
        alloc.share(1, 2, 40)  # a child that holds blocks already
    with pytest.raises(ValueError):
        alloc.share(1, 6, 65)  # more than the parent holds


def test_freeing_the_parent_first_keeps_the_shared_blocks_until_the_child_goes() -> None:
    alloc = BlockAllocator(8, BS)
    alloc.ensure(1, 40)
    shared = alloc.table(1)[:2]
    alloc.share(1, 2, 40)
    alloc.ensure(2, 40)
    assert alloc.num_free == 4
    alloc.free(1)
    assert alloc.num_free == 5 and [alloc.refs(b) for b in shared] == [1, 1]  # only the parent's own block
    alloc.ensure(3, 5 * BS)  # every free block: none of the shared ones is handed out
    assert not set(alloc.table(3)) & set(alloc.table(2))
    with pytest.raises(OutOfBlocksError):
        alloc.ensure(3, 6 * BS)
    alloc.free(3)
    alloc.free(2)
    assert alloc.num_free == 8 and alloc.sequences() == []
    assert all(alloc.refs(b) == 0 for b in range(8))


def test_freeing_the_child_first_and_truncating_release_only_unshared_holds() -> None:
    alloc = BlockAllocator(8, BS)
    alloc.ensure(1, 50)  # 4 blocks
    parent = list(alloc.table(1))
    alloc.share(1, 2, 50)  # 3 shared
    alloc.ensure(2, 60)
    assert alloc.num_free == 3
    alloc.truncate(2, 20)  # drops its own block and one shared hold
    assert alloc.table(2) == parent[:2] and alloc.num_free == 4 and alloc.refs(parent[2]) == 1
    alloc.truncate(1, 17)  # the parent lets go of blocks 2 and 3; block 1 is still the child's too
    assert alloc.num_free == 6 and [alloc.refs(b) for b in parent[:2]] == [2, 2]
    alloc.free(2)
    assert alloc.num_free == 6 and alloc.table(1) == parent[:2]
    alloc.free(1)
    assert alloc.num_free == 8 and sorted(alloc._free) == list(range(8))  # each block back once


# ----- one worker: a real drafter --------------------------------------------------------------


def spec(seq_id: int, tokens: list[int], fork_of: int | None = None) -> control_pb2.SeqSpec:
    out = control_pb2.SeqSpec(seq_id=seq_id, tokens=tokens, sampling=control_pb2.SeqSampling(temperature=0.0),
                              prompt_len=len(tokens))
    if fork_of is not None:
        out.fork_of, out.fork_tokens = fork_of, len(tokens)
    return out


def plan(step: int, add: list[control_pb2.SeqSpec], remove: tuple[int, ...] = ()) -> control_pb2.StepPlan:
    return control_pb2.StepPlan(step=step, add=add, remove=list(remove))


def blocks_content(drafter: Drafter, blocks: list[int]) -> list[torch.Tensor]:
    return [t[blocks].clone() for layer in drafter.runner.cache.layers for t in layer]


def test_a_fork_drafts_what_its_parent_drafted_without_writing_the_shared_blocks() -> None:
    drafter = Drafter(ModelRunner(load_model(TINY_DRAFT), 32, BS))
    prompt = [(5 * i) % 200 + 3 for i in range(40)]
    apply_membership(drafter, plan(0, [spec(1, prompt)]))
    parent_drafts = drafter.propose([1], 4).tokens.tolist()
    shared = drafter.runner.allocator.table(1)[:2]
    before = blocks_content(drafter, shared)
    # The parent leaves in the plan that forks it: it still lends its blocks.
    apply_membership(drafter, plan(1, [spec(2, prompt, fork_of=1), spec(3, prompt, fork_of=99)], remove=[1]))
    assert 1 not in drafter.seqs and drafter.seqs[2].cached == 32 and drafter.seqs[3].cached == 0
    assert drafter.runner.allocator.table(2)[:2] == shared and drafter.shared_tokens == 32
    assert drafter.propose([2, 3], 4).tokens.tolist() == parent_drafts * 2  # the fork and the unshared one agree
    assert all(torch.equal(a, b) for a, b in zip(before, blocks_content(drafter, shared), strict=True))
    apply_membership(drafter, plan(2, [], remove=[2, 3]))
    assert drafter.runner.allocator.num_free == 32


def test_a_fork_of_a_parent_without_the_prompt_cached_computes_it() -> None:
    drafter = Drafter(ModelRunner(load_model(TINY_DRAFT), 32, BS))
    prompt = list(range(3, 43))
    apply_membership(drafter, plan(0, [spec(1, prompt), spec(2, prompt, fork_of=1)]))  # the parent never ran
    assert drafter.seqs[2].cached == 0 and drafter.runner.allocator.table(2) == []
    apply_membership(drafter, plan(1, [spec(1, prompt)]))  # re-added: removed first, then added
    assert drafter.seqs[1].tokens == prompt and drafter.runner.allocator.num_free == 32
