"""Launch-ahead: queue the next plan's verify on the GPU before reading this plan's verdict back.

In PSD the verifier's step i judges batch A while the draft service drafts batch B; step i+1 judges
B with those drafts. Nothing in step i+1 depends on step i's outcome (A and B are disjoint, and B's
state on the host is the one its previous verdict left), so once step i is queued the verifier can
queue step i+1 behind it: the stream waits for B's drafts (an NCCL receive posted earlier), and the
GPU runs i+1 as soon as they are there, while the host reads back and commits step i. The GPU no
longer idles through the host's read-back, bookkeeping, event and next-plan preparation.

Only the plain case is launched ahead: the next plan verifies exactly the batch this plan drafts (same
order), none of whose rows this plan verifies (in sequential SD the next verify starts where this
verdict leaves each row, which the host learns at the commit), removes none of this plan's sequences,
every row is in the steady state (one committed token not yet in the KV) and asks for no grammar
(`device_rows.host_free`: its matcher advances on the host between steps; logprobs are computed on the device by the
verify and read back with its verdict), the colocated draft is off, and the payload fits one frame. Rows
that sample go too (not under tensor parallelism): the draft probabilities that follow their frame are
received into the device behind it, once an earlier frame has told their width. Logits processing
(penalties, biases, min_tokens) runs as on the ordinary path: B's history on the host is whole, since its
previous verdict (step i - 1) was committed in the turn before, and the processing tables are per
sequence, so A's commit behind the launched verify changes nothing B reads.
Everything else takes the ordinary path. Tensor-parallel followers get the plan over their host
channel and queue the same verify ahead (verifier/tp_follower.py). The drafts' header travels back
with the verdict and is checked when the step commits; a mismatch (which the plan rules out) is
reported as a broken data plane, so the draft service is re-synced. Greedy verification is exact for
any drafts, so even then no output token is wrong; a sampled step whose frame was broken is judged again
without drafts (sampled verification is exact only with the drafts' true probabilities).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minedraft.engine.readback import Readback
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.verifier.device_rows import device_rows
from minedraft.verifier.posted_drafts import PostedProposal

NEXT_PLAN_POLL_S = 0.00005


@dataclass(slots=True)
class LaunchedStep:
    """A plan whose verify is queued on the GPU and whose verdict is already on its way."""

    plan: control_pb2.StepPlan
    ids: list[int]
    event: control_pb2.WorkerEvent  # filled as the step goes; returned when it commits
    readback: Readback
    posted: PostedProposal | None  # the drafts it took unread, their header to check (None: an AR step, ar_ahead.py)
    tokens: torch.Tensor | None = None  # an AR step's verdict tokens [B, 1], on the device: the next AR step's input


def launchable_ids(worker: Verifier, current: control_pb2.StepPlan, current_ids: list[int],
                   nxt: control_pb2.StepPlan, sampled: bool = True) -> list[int] | None:
    """The next plan's verify batch when its verify may be queued now, else None (`sampled`: rows that sample
    may go too)."""
    drafted = list(current.draft_batch)
    if nxt.step != current.step + 1 or not nxt.with_drafts or not current.with_drafts or not drafted:
        return None
    if list(nxt.verify_batch) != drafted or not set(nxt.remove).isdisjoint((*current_ids, *drafted)):
        return None
    if not set(drafted).isdisjoint(current_ids):  # sequential SD: a row's next start is this verdict's, unread yet
        return None
    return drafted if device_rows(worker, drafted, sampled) else None


def await_next(upcoming: Callable[[], control_pb2.StepPlan | None], readback: Readback
               ) -> control_pb2.StepPlan | None:
    """The next plan; while this step's verdict is still on the device (the GPU is busy anyway) it
    is worth waiting for, since the manager sends it once it has the previous step's verdict."""
    while (nxt := upcoming()) is None and not readback.ready():
        time.sleep(NEXT_PLAN_POLL_S)
    return nxt
