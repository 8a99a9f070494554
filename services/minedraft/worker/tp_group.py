"""The verifier's tensor-parallel group and how rank 0 hands each step to the other ranks.

The group is a bare c10d backend (ProcessGroupGloo on CPU, ProcessGroupNCCL on GPUs) built
on its own store, so it lives beside the data plane with the draft service, which re-forms at
every epoch. Only rank 0 talks to the batch manager and the draft service; it hands every step
(the plan, and the drafts it will judge) to the other ranks so they run the same verify in
lockstep: after each row-parallel all-reduce every rank holds identical activations, hence
identical logits and identical accept/reject decisions.

Two channels, so a follower's host never waits for its GPU. The plan travels host to host, over
a gloo group of its own on the same store: a follower learns the next step while its GPU still
runs the current one, queues it behind, and only then reads the current verdict back, as rank 0
does when it launches a verify ahead (verifier/launch_ahead.py). The drafts stay on the devices:
one broadcast over the tensor-parallel group, queued on each rank's stream in step order (the
same order as the verify's all-reduces), never read by a host.

Host frame, one gloo broadcast of HOST_FRAME_SLOTS int64 slots:

    slot 0..5  header: kind, plan byte length, batch B, draft length k, vocab V, flags
    then       the plan's protobuf bytes, zero-padded to a multiple of 8 and packed into
               ceil(len / 8) int64 slots (native byte order)       -- unless FLAG_PLAN_FOLLOWS

Flags: FLAG_PLAN (a plan was sent, even one that serialises to no bytes), FLAG_DRAFTS (a
proposal follows on the device group: the tokens as [B, k] int64), FLAG_PROBS (then the draft
distributions as [B, k, V] float32), FLAG_PLAN_FOLLOWS (a plan too large for the frame follows it
as `plan byte length` uint8 on the host group), FLAG_LENGTHS (the drafts are ragged: each row's draft count
follows as [B] int64 on the host group, after the plan, since the verify's host side shapes its inputs by them;
the tokens past a row's count are -1), FLAG_AHEAD (rank 0 queued this verify before
committing the previous one: the follower does the same), FLAG_DROP (rank 0 dropped the step it had
queued ahead without committing it: so does the follower).
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
from minedraft.worker.rendezvous import bare_group, host_store

KIND_PLAN = 1
KIND_RESET = 2
KIND_STOP = 3
KINDS = (KIND_PLAN, KIND_RESET, KIND_STOP)

HEADER_SLOTS = 6  # kind, plan byte length, batch, k, vocab, flags
# 4096 slots = 32 KiB over loopback TCP. A steady-state plan of 256 sequences holds two id lists
# (~2 KiB of varints), so ~30 KiB stay free for the prompts of sequences admitted in that step
# (~10k tokens at <= 3 bytes a token). Only a larger admission wave spills.
HOST_FRAME_SLOTS = 4096

FLAG_PLAN = 1
FLAG_DRAFTS = 2
FLAG_PROBS = 4
FLAG_PLAN_FOLLOWS = 8
FLAG_LENGTHS = 16
FLAG_AHEAD = 32
FLAG_DROP = 64
# A follower may wait for its next step as long as the server idles: a host channel that times out
# would end it. A dead rank 0 still ends the wait (its socket closes).
IDLE_WAIT = timedelta(days=365)


TP_TIMEOUT_S = 300.0  # the group's collectives and rendezvous; also how long a rank waits for its GPU


def join_tp_group(host: str, port: int, rank: int, size: int, device: torch.device,
                  timeout_s: float = TP_TIMEOUT_S) -> tuple[TPContext, dist.Store]:
    """Rank 0 hosts the store on `port` (listening on `host` only); the others connect. Returns the
    context and the store."""
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        store = host_store(host, port, timeout_s)
    else:
        store = dist.TCPStore(host, port, size, False, timeout=timeout, wait_for_workers=False)
    group = bare_group("nccl" if device.type == "cuda" else "gloo", dist.PrefixStore("tp", store), rank, size,
                       timeout, "tensor-parallel")
    return TPContext(rank, size, group), store


@dataclass(slots=True)
class StepMessage:
    kind: int
    plan: control_pb2.StepPlan | None = None
    proposal: Proposal | None = None
    ahead: bool = False  # queue this verify, then commit the previous one
    drop: bool = False  # forget the previous step uncommitted


@dataclass(slots=True)
class PendingFrame:
    """A host frame whose receive is posted."""

    frame: torch.Tensor
    work: object  # the gloo broadcast's Work


def plan_slots(nbytes: int) -> int:
    """int64 slots that hold `nbytes` plan bytes."""
    return (nbytes + 7) // 8


def frame_flags(has_plan: bool, nbytes: int, proposal: Proposal | None, ahead: bool = False,
                drop: bool = False) -> int:
    """What the host frame holds and what follows it."""
    flags = FLAG_PLAN * has_plan | FLAG_AHEAD * ahead | FLAG_DROP * drop
    if proposal is not None:
        flags |= FLAG_DRAFTS | FLAG_PROBS * (proposal.probs is not None) | FLAG_LENGTHS * (proposal.lengths is not None)
    if HEADER_SLOTS + plan_slots(nbytes) > HOST_FRAME_SLOTS:
        flags |= FLAG_PLAN_FOLLOWS
    return flags


class StepBroadcast:
    """Rank 0 sends each step to the followers; followers receive it."""

    def __init__(self, tp: TPContext, device: torch.device, store: dist.Store) -> None:
        self.group = tp.group  # the drafts, on the devices
        self.device = device
        self.host = bare_group("gloo", dist.PrefixStore("tp-steps", store), tp.rank, tp.size, IDLE_WAIT)

    @staticmethod
    def _start(group: dist.ProcessGroup, tensor: torch.Tensor) -> object:
        """Start a broadcast from rank 0; returns its Work."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return group.broadcast([tensor], opts)  # type: ignore[union-attr]

    @classmethod
    def _bcast(cls, group: dist.ProcessGroup, tensor: torch.Tensor) -> torch.Tensor:
        """Broadcast from rank 0. On NCCL the wait only orders the rank's stream after it (no host wait)."""
        cls._start(group, tensor).wait()  # type: ignore[attr-defined]
        return tensor

    def send(self, kind: int, plan: control_pb2.StepPlan | None = None, proposal: Proposal | None = None,
             ahead: bool = False, drop: bool = False) -> None:
        body = plan.SerializeToString() if plan is not None else b""
        flags = frame_flags(plan is not None, len(body), proposal, ahead, drop)
        batch, k = proposal.tokens.shape if proposal is not None else (0, 0)
        probs = proposal.probs if proposal is not None else None
        vocab = probs.shape[-1] if probs is not None else 0
        frame = torch.zeros(HOST_FRAME_SLOTS, dtype=torch.int64)
        slots = frame.numpy()
        slots[:HEADER_SLOTS] = [kind, len(body), batch, k, vocab, flags]
        if body and not flags & FLAG_PLAN_FOLLOWS:
            packed = np.frombuffer(body + bytes(-len(body) % 8), dtype=np.int64)
            slots[HEADER_SLOTS:HEADER_SLOTS + packed.size] = packed
        self._bcast(self.host, frame)
        if flags & FLAG_PLAN_FOLLOWS:
            self._bcast(self.host, torch.frombuffer(bytearray(body), dtype=torch.uint8))
        if flags & FLAG_LENGTHS:
            assert proposal is not None and proposal.lengths is not None
            self._bcast(self.host, torch.tensor(proposal.lengths, dtype=torch.int64))
        if proposal is not None:
            self._bcast(self.group, proposal.tokens.to(self.device, torch.int64).contiguous())
        if probs is not None:
            self._bcast(self.group, probs.to(self.device, torch.float32).contiguous())

    def post(self) -> PendingFrame:
        """Start receiving the next host frame: gloo fills it in the background while this rank's GPU still
        runs the current step, so the frame is there when the host comes for it."""
        frame = torch.empty(HOST_FRAME_SLOTS, dtype=torch.int64)
        return PendingFrame(frame, self._start(self.host, frame))

    def receive(self, pending: PendingFrame | None = None) -> StepMessage:
        """The next step: from a frame posted earlier, or received now."""
        pending = pending if pending is not None else self.post()
        pending.work.wait()
        host = pending.frame.numpy()
        kind, nbytes, batch, k, vocab, flags = (int(v) for v in host[:HEADER_SLOTS])
        if kind not in KINDS:
            raise RuntimeError(f"tensor-parallel step frame of unknown kind {kind}: the ranks are out of step")
        plan = None
        if flags & FLAG_PLAN_FOLLOWS:
            raw = self._bcast(self.host, torch.empty(nbytes, dtype=torch.uint8))
            plan = control_pb2.StepPlan.FromString(raw.numpy().tobytes())
        elif flags & FLAG_PLAN:
            packed = host[HEADER_SLOTS:HEADER_SLOTS + plan_slots(nbytes)]
            plan = control_pb2.StepPlan.FromString(packed.tobytes()[:nbytes])
        lengths = self._bcast(self.host, torch.empty(batch, dtype=torch.int64)).tolist() \
            if flags & FLAG_LENGTHS else None
        proposal = None
        if flags & FLAG_DRAFTS:
            tokens = self._bcast(self.group, torch.empty((batch, k), dtype=torch.int64, device=self.device))
            probs = self._bcast(self.group, torch.empty((batch, k, vocab), dtype=torch.float32, device=self.device)) \
                if flags & FLAG_PROBS else None
            proposal = Proposal(tokens, probs, lengths=lengths)
        return StepMessage(kind, plan, proposal, bool(flags & FLAG_AHEAD), bool(flags & FLAG_DROP))
