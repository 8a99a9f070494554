"""The verifier's tensor-parallel group and how rank 0 hands each step to the other ranks.

The group is a bare c10d backend (ProcessGroupGloo on CPU, ProcessGroupNCCL on GPUs) built
on its own store, so it lives beside the default process group that the data plane with the
draft service re-forms at every epoch. Only rank 0 talks to the batch manager and the draft
service; it broadcasts every step (the plan, and the drafts it will judge) so the other
ranks run the same verify in lockstep: after each row-parallel all-reduce every rank holds
identical activations, hence identical logits and identical accept/reject decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.engine.drafter import Proposal
from minedraft.engine.tensor_parallel import TPContext
from minedraft.proto import control_pb2
from minedraft.worker.data_plane import host_store

KIND_PLAN = 1
KIND_RESET = 2
KIND_STOP = 3
_HEADER = 6  # kind, plan bytes, batch, k, vocab, has_drafts (bit 0) | has_probs (bit 1)


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
        batch, k = proposal.tokens.shape if proposal is not None else (0, 0)
        probs = proposal.probs if proposal is not None else None
        vocab = probs.shape[-1] if probs is not None else 0
        flags = int(proposal is not None) | (int(probs is not None) << 1)
        self._bcast(torch.tensor([kind, len(body), batch, k, vocab, flags], dtype=torch.int64, device=self.device))
        if body:
            self._bcast(torch.frombuffer(bytearray(body), dtype=torch.uint8).to(self.device))
        if proposal is not None:
            self._bcast(proposal.tokens.to(self.device, torch.int64).contiguous())
        if probs is not None:
            self._bcast(probs.to(self.device, torch.float32).contiguous())

    def receive(self) -> StepMessage:
        header = self._bcast(torch.zeros(_HEADER, dtype=torch.int64, device=self.device)).tolist()
        kind, nbytes, batch, k, vocab, flags = header
        plan = None
        if nbytes:
            raw = self._bcast(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
            plan = control_pb2.StepPlan.FromString(raw.cpu().numpy().tobytes())
        proposal = None
        if flags & 1:
            tokens = self._bcast(torch.empty((batch, k), dtype=torch.int64, device=self.device))
            probs = self._bcast(torch.empty((batch, k, vocab), dtype=torch.float32, device=self.device)) \
                if flags & 2 else None
            proposal = Proposal(tokens, probs)
        return StepMessage(kind, plan, proposal)
