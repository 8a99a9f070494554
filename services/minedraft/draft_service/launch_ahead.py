"""Launch-ahead on the draft side: queue a plan's k forwards before its verdict reaches the host.

In PSD the draft service's step i+1 drafts the batch the verifier judges in step i, so it needs that
verdict. Read on the host, the verdict costs a chain with the draft GPU idle: wait for it, copy it
back, update every sequence, build the first forward, launch k forwards. Instead the draft service
posts the verdict's NCCL receive behind its current kernels and queues the next plan's forwards
behind that receive, computing their tokens and positions from the verdict on the device
(engine/draft_ahead.py); the host reads the verdict back while the GPU already drafts, and settles
its bookkeeping then. With the next plan already in the inbox, it is queued before the current
plan's kernels finish, so the draft GPU goes from one batch to the next without waiting on the host.

Only the plain case takes this path: the plan drafts exactly the batch whose verdict is awaited (same
order), removes none of the sequences in flight, and every row awaits the verdict of one proposal of
the same kd, with room for the worst case. An EAGLE head drafts ahead too (engine/eagle_ahead.py), from
the verdict's states received into the device behind it, when every row's head has all the states
before its verify window (so the verdict carries kd + 1 per row, the size the receive is posted for).
The verdict's header (with a head, each row's first state position and count too) is checked when it is
read back; a mismatch (which these rules exclude) is reported as a broken data plane, so the pair is
re-synced. The verifier judges whatever it is sent exactly, so no output token can be wrong either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.engine import eagle_ahead
from minedraft.engine.draft_ahead import awaited_k, room_to_draft_ahead
from minedraft.engine.drafter import Drafter
from minedraft.engine.eagle_drafter import EagleDrafter
from minedraft.engine.readback import Readback
from minedraft.proto import control_pb2


@dataclass(slots=True)
class AwaitedVerdict:
    """The verdict the next drafting plan needs: which verify step, on which sequences."""

    step: int
    seq_ids: list[int]


@dataclass(slots=True)
class LaunchedDraft:
    """A plan whose k forwards are queued and whose drafts are on their way to the verifier."""

    plan: control_pb2.StepPlan
    ids: list[int]
    kd: int  # the width of the verdict it drafts from, minus one
    event: control_pb2.WorkerEvent  # filled as the step goes; returned when it settles
    verdict: Readback  # the whole verdict frame (header, ids, accepted, tokens)
    expected_header: list[int]
    started: torch.cuda.Event | None
    finished: torch.cuda.Event | None
    states: torch.Tensor | None = None  # an EAGLE head's: the verdict's states it drafted from, for settling


def launchable_kd(drafter: Drafter, awaited: AwaitedVerdict | None, plan: control_pb2.StepPlan,
                  in_flight: list[int]) -> int | None:
    """kd when the plan's drafts may be queued before its verdict is read, else None. Checked before
    the plan's membership is applied: its removals must spare the rows in flight and those it drafts."""
    ids = list(plan.draft_batch)
    if awaited is None or not plan.with_drafts or plan.k < 1 or not ids or ids != awaited.seq_ids:
        return None
    if not set(plan.remove).isdisjoint((*in_flight, *ids)):
        return None
    if drafter.grammars.rows(ids):  # its masks need each draft on the host before the next
        return None
    kd = _awaited_k(drafter, ids[0])
    if kd < 1 or any(_awaited_k(drafter, s) != kd for s in ids):
        return None
    if isinstance(drafter, EagleDrafter) and not eagle_ahead.can_draft_ahead(drafter, ids):
        return None
    return kd if room_to_draft_ahead(drafter, ids, kd, plan.k) else None


def _awaited_k(drafter: Drafter, seq_id: int) -> int:
    if isinstance(drafter, EagleDrafter):
        return eagle_ahead.awaited_k(drafter, seq_id)
    return awaited_k(drafter, seq_id)
