"""Rank 0 hands each step to a tensor-parallel follower over a real gloo pair: the plan in one host
frame, the drafts on the device group.

The two ranks run as threads of this process, each holding its own groups formed by join_tp_group
and StepBroadcast. Each group is wrapped only to count the broadcasts that go through it.
"""

from __future__ import annotations

import time
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
    FLAG_AHEAD,
    FLAG_DROP,
    FLAG_PLAN_FOLLOWS,
    HEADER_SLOTS,
    HOST_FRAME_SLOTS,
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
    counters: list[CountingGroup]  # leader host, leader device, follower host, follower device
    pool: ThreadPoolExecutor


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    port = free_port()
    pool = ThreadPoolExecutor(2)
    joins = [pool.submit(join_tp_group, "127.0.0.1", port, rank, 2, CPU, 30.0) for rank in (0, 1)]
    (tp0, store0), (tp1, store1) = (j.result(timeout=60) for j in joins)
    made = [pool.submit(StepBroadcast, TPContext(tp.rank, tp.size, tp.group), CPU, store)
            for tp, store in ((tp0, store0), (tp1, store1))]
    channels = [m.result(timeout=60) for m in made]
    counters = []
    for channel in channels:
        channel.host, channel.group = CountingGroup(channel.host), CountingGroup(channel.group)
        counters += [channel.host, channel.group]
    yield Pair(channels[0], channels[1], counters, pool)
    pool.shutdown()
    del store0, store1


def round_trip(pair: Pair, kind: int, plan: control_pb2.StepPlan | None = None,
               proposal: Proposal | None = None, **flags: bool) -> tuple[StepMessage, tuple[int, int], tuple[int, int]]:
    """Send on rank 0 while rank 1 receives; the message and each side's (host, device) broadcast counts."""
    for counter in pair.counters:
        counter.broadcasts = 0
    received = pair.pool.submit(pair.follower.receive)
    pair.leader.send(kind, plan, proposal, **flags)
    msg = received.result(timeout=30)
    counts = [c.broadcasts for c in pair.counters]
    return msg, (counts[0], counts[1]), (counts[2], counts[3])


def small_plan(step: int = 7) -> control_pb2.StepPlan:
    sampling = control_pb2.SeqSampling(temperature=0.7, top_p=0.9, top_k=20, seed=1234)
    return control_pb2.StepPlan(step=step, add=[control_pb2.SeqSpec(seq_id=12, tokens=[5, 9, 13, 150000],
                                                                    sampling=sampling)],
                                remove=[3], draft_batch=[12, 40, 41], verify_batch=[40, 41, 44], k=4,
                                with_drafts=True, send_verdict=True)


def draft_tokens(batch: int, k: int, seed: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.randint(0, 151_000, (batch, k), generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_plan_without_proposal_is_one_host_broadcast(pair: Pair) -> None:
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan())
    assert (msg.kind, msg.plan, msg.proposal, msg.ahead, msg.drop) == (KIND_PLAN, small_plan(), None, False, False)
    assert sent == received == (1, 0)


def test_greedy_drafts_travel_on_the_device_group(pair: Pair) -> None:
    tokens = draft_tokens(3, 4, seed=1)
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan(8), Proposal(tokens, None))
    assert msg.plan == small_plan(8)
    assert msg.proposal is not None and msg.proposal.probs is None
    assert msg.proposal.tokens.dtype == torch.int64 and msg.proposal.tokens.device == CPU
    assert torch.equal(msg.proposal.tokens, tokens)
    assert sent == received == (1, 1)


def test_a_receive_posted_before_the_plan_is_sent_gets_it(pair: Pair) -> None:
    """The follower posts its next receive before it waits for its own verdict; a frame rank 0 sends meanwhile
    is there when the follower comes for it (one host broadcast on each side)."""
    for counter in pair.counters:
        counter.broadcasts = 0
    pending = pair.follower.post()
    pair.pool.submit(pair.leader.send, KIND_PLAN, small_plan(11)).result(timeout=30)
    deadline = time.monotonic() + 10
    while not pending.work.is_completed() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)  # gloo marks the work done on its own thread, just after the copy
    assert pending.work.is_completed()  # type: ignore[attr-defined]  # landed before the follower asked for it
    msg = pair.follower.receive(pending)
    assert (msg.kind, msg.plan, msg.proposal) == (KIND_PLAN, small_plan(11), None)
    assert [c.broadcasts for c in pair.counters] == [1, 0, 1, 0]


def test_ahead_and_drop_reach_the_follower(pair: Pair) -> None:
    msg, _, _ = round_trip(pair, KIND_PLAN, small_plan(8), Proposal(draft_tokens(3, 4, seed=1), None), ahead=True)
    assert (msg.ahead, msg.drop) == (True, False)
    msg, _, _ = round_trip(pair, KIND_PLAN, small_plan(9), None, drop=True)
    assert (msg.ahead, msg.drop) == (False, True)


def test_int32_drafts_arrive_as_int64(pair: Pair) -> None:
    tokens = draft_tokens(2, 8, seed=2, dtype=torch.int32)
    msg, _, received = round_trip(pair, KIND_PLAN, small_plan(), Proposal(tokens, None))
    assert msg.proposal is not None and msg.proposal.tokens.dtype == torch.int64
    assert msg.proposal.tokens.tolist() == tokens.tolist()
    assert received == (1, 1)


def test_sampled_proposal_sends_probs_after_the_tokens(pair: Pair) -> None:
    tokens = draft_tokens(3, 4, seed=3)
    probs = torch.softmax(torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(3)), dim=-1)
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan(9), Proposal(tokens, probs))
    assert msg.plan == small_plan(9)
    assert msg.proposal is not None and msg.proposal.probs is not None
    assert torch.equal(msg.proposal.tokens, tokens)
    assert msg.proposal.probs.dtype == torch.float32 and torch.equal(msg.proposal.probs, probs)
    assert sent == received == (1, 2)


def test_ragged_drafts_send_their_lengths_on_the_host_group(pair: Pair) -> None:
    """TETRIS-selected drafts: each row's count reaches the follower, which shapes its verify by it."""
    tokens = draft_tokens(3, 5, seed=6)
    lengths = [5, 0, 2]
    for row, n in enumerate(lengths):
        tokens[row, n:] = -1
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan(12), Proposal(tokens, None, lengths=lengths))
    assert msg.plan == small_plan(12)
    assert msg.proposal is not None and msg.proposal.lengths == lengths
    assert torch.equal(msg.proposal.tokens, tokens)
    assert sent == received == (2, 1)


def test_a_plan_larger_than_the_frame_follows_it(pair: Pair) -> None:
    admitted = control_pb2.SeqSpec(seq_id=1, tokens=[100_000 + i for i in range(50_000)])  # 3 bytes a token
    plan = control_pb2.StepPlan(step=10, add=[admitted], verify_batch=[1, 2], k=3, with_drafts=True)
    assert len(plan.SerializeToString()) > HOST_FRAME_SLOTS * 8
    tokens = draft_tokens(2, 3, seed=4)
    msg, sent, received = round_trip(pair, KIND_PLAN, plan, Proposal(tokens, None))
    assert msg.plan == plan
    assert msg.proposal is not None and torch.equal(msg.proposal.tokens, tokens)
    assert sent == received == (2, 1)


def test_many_drafts_are_still_one_device_broadcast(pair: Pair) -> None:
    tokens = draft_tokens(2100, 8, seed=5)
    msg, sent, received = round_trip(pair, KIND_PLAN, small_plan(11), Proposal(tokens, None))
    assert msg.plan == small_plan(11)
    assert msg.proposal is not None and torch.equal(msg.proposal.tokens, tokens)
    assert sent == received == (1, 1)


def test_an_empty_plan_still_arrives_as_a_plan(pair: Pair) -> None:
    msg, _, received = round_trip(pair, KIND_PLAN, control_pb2.StepPlan())
    assert msg.plan == control_pb2.StepPlan()  # serialises to no bytes, yet the follower needs a plan
    assert received == (1, 0)


@pytest.mark.parametrize("kind", [KIND_RESET, KIND_STOP])
def test_reset_and_stop_are_one_host_broadcast(pair: Pair, kind: int) -> None:
    msg, sent, received = round_trip(pair, kind)
    assert (msg.kind, msg.plan, msg.proposal) == (kind, None, None)
    assert sent == received == (1, 0)


def test_the_frame_is_filled_to_its_last_slot_before_the_plan_spills() -> None:
    room = (HOST_FRAME_SLOTS - HEADER_SLOTS) * 8  # plan bytes that exactly fill the frame
    assert not frame_flags(True, room, None) & FLAG_PLAN_FOLLOWS
    assert frame_flags(True, room + 1, None) & FLAG_PLAN_FOLLOWS
    assert frame_flags(True, 0, None, ahead=True, drop=True) & (FLAG_AHEAD | FLAG_DROP) == FLAG_AHEAD | FLAG_DROP
