"""Rank 0 hands each step to a tensor-parallel follower over a real gloo pair: one frame, one broadcast.

The two ranks run as threads of this process, each holding its own ProcessGroupGloo formed by
join_tp_group. Each group is wrapped only to count the broadcasts that go through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch

from minedraft.cli.local_stack import free_port
from minedraft.engine.drafter import Proposal
from minedraft.engine.tensor_parallel import TPContext
from minedraft.proto import control_pb2
from minedraft.worker.tp_group import (
    FLAG_PLAN_FOLLOWS,
    FLAG_TOKENS_FOLLOW,
    FRAME_SLOTS,
    HEADER_SLOTS,
    KIND_PLAN,
    KIND_RESET,
    KIND_STOP,
    StepBroadcast,
    StepMessage,
    frame_flags,
    join_tp_group,
)

CPU = torch.device("cpu")


class CountingGroup:
    """The rank's real gloo group; counts the broadcasts issued through it."""

    def __init__(self, group: object) -> None:
        self.group = group
        self.broadcasts = 0

    def broadcast(self, tensors: list[torch.Tensor], opts: object) -> object:
        self.broadcasts += 1
        return self.group.broadcast(tensors, opts)  # type: ignore[attr-defined]


@dataclass
class Pair:
    leader: StepBroadcast
    follower: StepBroadcast
    leader_group: CountingGroup
    follower_group: CountingGroup
    pool: ThreadPoolExecutor


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    port = free_port()
    pool = ThreadPoolExecutor(2)
    joins = [pool.submit(join_tp_group, "127.0.0.1", port, rank, 2, CPU, 30.0) for rank in (0, 1)]
    (tp0, store0), (tp1, store1) = (j.result(timeout=60) for j in joins)
    groups = CountingGroup(tp0.group), CountingGroup(tp1.group)
    channels = [StepBroadcast(TPContext(tp.rank, tp.size, g), CPU) for tp, g in zip((tp0, tp1), groups, strict=True)]
    yield Pair(channels[0], channels[1], groups[0], groups[1], pool)
    pool.shutdown()
    del store0, store1


def round_trip(pair: Pair, kind: int, plan: control_pb2.StepPlan | None = None,
               proposal: Proposal | None = None) -> tuple[StepMessage, int, int]:
    """Send on rank 0 while rank 1 receives; the message and each side's broadcast count."""
    pair.leader_group.broadcasts = pair.follower_group.broadcasts = 0
    received = pair.pool.submit(pair.follower.receive)
    pair.leader.send(kind, plan, proposal)
    msg = received.result(timeout=30)
    return msg, pair.leader_group.broadcasts, pair.follower_group.broadcasts


def small_plan(step: int = 7) -> control_pb2.StepPlan:
    sampling = control_pb2.SeqSampling(temperature=0.7, top_p=0.9, top_k=20, seed=1234)
    return control_pb2.StepPlan(step=step, add=[control_pb2.SeqSpec(seq_id=12, tokens=[5, 9, 13, 150000],
                                                                    sampling=sampling)],
                                remove=[3], draft_batch=[12, 40, 41], verify_batch=[40, 41, 44], k=4,
                                with_drafts=True, send_verdict=True)


def draft_tokens(batch: int, k: int, seed: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.randint(0, 151_000, (batch, k), generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_in_frame(tokens: torch.Tensor) -> None:
    """The follower's tokens are a view into the received frame, not a separate copy."""
    assert tokens.untyped_storage().nbytes() == FRAME_SLOTS * 8


def test_plan_without_proposal_is_one_broadcast(pair: Pair) -> None:
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan())
    assert (msg.kind, msg.plan, msg.proposal) == (KIND_PLAN, small_plan(), None)
    assert (sent, received) == (1, 1)


def test_greedy_proposal_rides_in_the_frame(pair: Pair) -> None:
    tokens = draft_tokens(3, 4, seed=1)
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan(8), Proposal(tokens, None))
    assert msg.plan == small_plan(8)
    assert msg.proposal is not None and msg.proposal.probs is None
    assert msg.proposal.tokens.dtype == torch.int64 and msg.proposal.tokens.device == CPU
    assert torch.equal(msg.proposal.tokens, tokens)
    assert_in_frame(msg.proposal.tokens)
    assert (sent, received) == (1, 1)


def test_int32_drafts_arrive_as_int64(pair: Pair) -> None:
    tokens = draft_tokens(2, 8, seed=2, dtype=torch.int32)
    msg, _, received = round_trip(pair, KIND_PLAN, small_plan(), Proposal(tokens, None))
    assert msg.proposal is not None and msg.proposal.tokens.dtype == torch.int64
    assert msg.proposal.tokens.tolist() == tokens.tolist()
    assert received == 1


def test_sampled_proposal_sends_probs_after_the_frame(pair: Pair) -> None:
    tokens = draft_tokens(3, 4, seed=3)
    probs = torch.softmax(torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(3)), dim=-1)
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan(9), Proposal(tokens, probs))
    assert msg.plan == small_plan(9)
    assert msg.proposal is not None and msg.proposal.probs is not None
    assert torch.equal(msg.proposal.tokens, tokens)
    assert_in_frame(msg.proposal.tokens)
    assert msg.proposal.probs.dtype == torch.float32 and torch.equal(msg.proposal.probs, probs)
    assert (sent, received) == (2, 2)


def test_a_plan_larger_than_the_frame_follows_it(pair: Pair) -> None:
    admitted = control_pb2.SeqSpec(seq_id=1, tokens=[100_000 + i for i in range(50_000)])  # 3 bytes a token
    plan = control_pb2.StepPlan(step=10, add=[admitted], verify_batch=[1, 2], k=3, with_drafts=True)
    assert len(plan.SerializeToString()) > FRAME_SLOTS * 8
    tokens = draft_tokens(2, 3, seed=4)
    msg, sent, received = round_trip(pair, KIND_PLAN, plan, Proposal(tokens, None))
    assert msg.plan == plan
    assert msg.proposal is not None and torch.equal(msg.proposal.tokens, tokens)
    assert_in_frame(msg.proposal.tokens)  # the drafts keep their place in the frame
    assert (sent, received) == (2, 2)


def test_drafts_larger_than_the_frame_follow_it(pair: Pair) -> None:
    tokens = draft_tokens(2100, 8, seed=5)  # 16800 tokens > the frame's 16378 free slots
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan(11), Proposal(tokens, None))
    assert msg.plan == small_plan(11)
    assert msg.proposal is not None and torch.equal(msg.proposal.tokens, tokens)
    assert (sent, received) == (2, 2)


def test_an_empty_plan_still_arrives_as_a_plan(pair: Pair) -> None:
    msg, _, received = round_trip(pair, KIND_PLAN, control_pb2.StepPlan())
    assert msg.plan == control_pb2.StepPlan()  # serialises to no bytes, yet the follower needs a plan
    assert received == 1


@pytest.mark.parametrize("kind", [KIND_RESET, KIND_STOP])
def test_reset_and_stop_are_one_broadcast(pair: Pair, kind: int) -> None:
    msg, sent, received = round_trip(pair, kind)
    assert (msg.kind, msg.plan, msg.proposal) == (kind, None, None)
    assert (sent, received) == (1, 1)


def test_the_frame_is_filled_to_its_last_slot_before_anything_spills() -> None:
    proposal = Proposal(torch.zeros(256, 8, dtype=torch.int64), None)
    room = (FRAME_SLOTS - HEADER_SLOTS - 256 * 8) * 8  # plan bytes that exactly fill the frame
    assert not frame_flags(True, room, proposal) & (FLAG_PLAN_FOLLOWS | FLAG_TOKENS_FOLLOW)
    assert frame_flags(True, room + 1, proposal) & FLAG_PLAN_FOLLOWS
    assert not frame_flags(True, room + 1, proposal) & FLAG_TOKENS_FOLLOW
    full = Proposal(torch.zeros(FRAME_SLOTS - HEADER_SLOTS, dtype=torch.int64).view(1, -1), None)
    assert not frame_flags(False, 0, full) & FLAG_TOKENS_FOLLOW
    over = Proposal(torch.zeros(1, FRAME_SLOTS - HEADER_SLOTS + 1, dtype=torch.int64), None)
    assert frame_flags(False, 0, over) & FLAG_TOKENS_FOLLOW
