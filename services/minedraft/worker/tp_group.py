"""The verifier's tensor-parallel group and how rank 0 hands each step to the other ranks.

The group is a bare c10d backend (ProcessGroupGloo on CPU, ProcessGroupNCCL on GPUs) built
on its own store, so it lives beside the default process group that the data plane with the
draft service re-forms at every epoch. Only rank 0 talks to the batch manager and the draft
service; it broadcasts every step (the plan, and the drafts it will judge) so the other
ranks run the same verify in lockstep: after each row-parallel all-reduce every rank holds
identical activations, hence identical logits and identical accept/reject decisions.

Wire format. Every step is one broadcast of a frame of FRAME_SLOTS int64 slots:

    slot 0..5  header: kind, plan byte length, batch B, draft length k, vocab V, flags
    then       the plan's protobuf bytes, zero-padded to a multiple of 8 and packed into
               ceil(len / 8) int64 slots (native byte order)       -- unless FLAG_PLAN_FOLLOWS
    then       the draft tokens [B, k], row-major, one token a slot -- unless FLAG_TOKENS_FOLLOW
    the rest   unused (not initialised)

Flags: FLAG_PLAN (a plan was sent, even one that serialises to no bytes), FLAG_DRAFTS (a
proposal was sent), FLAG_PROBS (it carries draft distributions). Whatever does not fit the
frame follows in its own broadcast, in this order, sized by the header: the plan as
`plan byte length` uint8 (FLAG_PLAN_FOLLOWS), the tokens as [B, k] int64 (FLAG_TOKENS_FOLLOW),
and the probs as [B, k, V] float32 (FLAG_PROBS; they never fit). So a greedy step costs one
broadcast and the follower one host synchronisation: the single copy of the frame to the host,
from which it reads the header and the plan. The tokens stay on the device as a view into the
received frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from minedraft.engine.drafter import Proposal
from minedraft.engine.tensor_parallel import TPContext
from minedraft.proto import control_pb2
from minedraft.worker.rendezvous import host_store

KIND_PLAN = 1
KIND_RESET = 2
KIND_STOP = 3
KINDS = (KIND_PLAN, KIND_RESET, KIND_STOP)

HEADER_SLOTS = 6  # kind, plan byte length, batch, k, vocab, flags
# 16384 slots = 128 KiB, moved in microseconds over NVLink and copied to the host in one go. A
# steady-state plan of 256 sequences holds two id lists (~2 KiB of varints) and its drafts
# 256 x 8 = 2048 slots (16 KiB), so ~110 KiB stay free for sequences admitted in that step
# (their prompts: ~35k tokens at <= 3 bytes a token). Only a larger admission wave spills.
FRAME_SLOTS = 16384

FLAG_PLAN = 1
FLAG_DRAFTS = 2
FLAG_PROBS = 4
FLAG_PLAN_FOLLOWS = 8
FLAG_TOKENS_FOLLOW = 16


def join_tp_group(host: str, port: int, rank: int, size: int, device: torch.device,
                  timeout_s: float = 300.0) -> tuple[TPContext, dist.Store]:
    """Rank 0 hosts the store on `port` (listening on `host` only); the others connect. Returns the
    context and the store."""
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        store = host_store(host, port, timeout_s)
    else:
        store = dist.TCPStore(host, port, size, False, timeout=timeout, wait_for_workers=False)
    prefixed = dist.PrefixStore("tp", store)
    if device.type == "cuda":
        group = dist.ProcessGroupNCCL(prefixed, rank, size)
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    return TPContext(rank, size, group), store


@dataclass(slots=True)
class StepMessage:
    kind: int
    plan: control_pb2.StepPlan | None = None
    proposal: Proposal | None = None


def plan_slots(nbytes: int) -> int:
    """int64 slots that hold `nbytes` plan bytes."""
    return (nbytes + 7) // 8


def frame_flags(has_plan: bool, nbytes: int, proposal: Proposal | None) -> int:
    """What the frame holds and what follows it. The tokens claim the frame first: they are
    wanted on the device, and a plan that spills only costs the follower a second host copy."""
    flags = FLAG_PLAN * has_plan
    ntokens = 0
    if proposal is not None:
        flags |= FLAG_DRAFTS | FLAG_PROBS * (proposal.probs is not None)
        ntokens = proposal.tokens.numel()
        if HEADER_SLOTS + ntokens > FRAME_SLOTS:
            flags |= FLAG_TOKENS_FOLLOW
            ntokens = 0
    if HEADER_SLOTS + plan_slots(nbytes) + ntokens > FRAME_SLOTS:
        flags |= FLAG_PLAN_FOLLOWS
    return flags


class StepBroadcast:
    """Rank 0 sends each step to the followers; followers receive it."""

    def __init__(self, tp: TPContext, device: torch.device) -> None:
        self.group = tp.group
        self.device = device

    def _bcast(self, tensor: torch.Tensor) -> torch.Tensor:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()  # type: ignore[union-attr]
        return tensor

    def send(self, kind: int, plan: control_pb2.StepPlan | None = None, proposal: Proposal | None = None) -> None:
        body = plan.SerializeToString() if plan is not None else b""
        flags = frame_flags(plan is not None, len(body), proposal)
        batch, k = proposal.tokens.shape if proposal is not None else (0, 0)
        probs = proposal.probs if proposal is not None else None
        vocab = probs.shape[-1] if probs is not None else 0
        head = [kind, len(body), batch, k, vocab, flags]
        packed = np.zeros(0, dtype=np.int64)
        if body and not flags & FLAG_PLAN_FOLLOWS:
            packed = np.frombuffer(body + bytes(-len(body) % 8), dtype=np.int64)
        at = HEADER_SLOTS + packed.size
        # Pinned staging and an asynchronous copy: a blocking copy would make rank 0 wait for its
        # queued GPU work (the caching host allocator keeps the buffer until the copy is done).
        pinned = self.device.type == "cuda"
        staging = torch.empty(at, dtype=torch.int64, pin_memory=pinned)
        staging.numpy()[:HEADER_SLOTS] = head
        staging.numpy()[HEADER_SLOTS:] = packed
        frame = torch.empty(FRAME_SLOTS, dtype=torch.int64, device=self.device)
        frame[:at].copy_(staging, non_blocking=pinned)
        if proposal is not None and not flags & FLAG_TOKENS_FOLLOW:
            frame[at:at + batch * k].view(batch, k).copy_(proposal.tokens)  # stays on the device
        self._bcast(frame)
        if flags & FLAG_PLAN_FOLLOWS:
            self._bcast(torch.frombuffer(bytearray(body), dtype=torch.uint8).to(self.device))
        if proposal is not None and flags & FLAG_TOKENS_FOLLOW:
            self._bcast(proposal.tokens.to(self.device, torch.int64).contiguous())
        if probs is not None:
            self._bcast(probs.to(self.device, torch.float32).contiguous())

    def receive(self) -> StepMessage:
        frame = self._bcast(torch.empty(FRAME_SLOTS, dtype=torch.int64, device=self.device))
        host = frame.cpu().numpy()  # the step's one host synchronisation
        kind, nbytes, batch, k, vocab, flags = (int(v) for v in host[:HEADER_SLOTS])
        if kind not in KINDS:
            raise RuntimeError(f"tensor-parallel step frame of unknown kind {kind}: the ranks are out of step")
        at = HEADER_SLOTS
        plan = None
        if flags & FLAG_PLAN_FOLLOWS:
            raw = self._bcast(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
            plan = control_pb2.StepPlan.FromString(raw.cpu().numpy().tobytes())
        elif flags & FLAG_PLAN:
            plan = control_pb2.StepPlan.FromString(host[at:at + plan_slots(nbytes)].tobytes()[:nbytes])
            at += plan_slots(nbytes)
        proposal = None
        if flags & FLAG_DRAFTS:
            if flags & FLAG_TOKENS_FOLLOW:
                tokens = self._bcast(torch.empty((batch, k), dtype=torch.int64, device=self.device))
            else:
                tokens = frame[at:at + batch * k].view(batch, k)
            probs = self._bcast(torch.empty((batch, k, vocab), dtype=torch.float32, device=self.device)) \
                if flags & FLAG_PROBS else None
            proposal = Proposal(tokens, probs)
        return StepMessage(kind, plan, proposal)
