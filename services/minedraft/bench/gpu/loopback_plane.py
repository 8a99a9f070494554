"""The draft service's end of the data plane, inside the verifier's process, for the PSD step cell.

In PSD the verifier judges one batch while the draft service drafts the other; the next plan's drafts
arrive in a receive posted on the GPU stream, so the verifier queues the next verify before it reads this
one back (verifier/launch_ahead.py). To time that loop on one GPU without a draft service, this object
answers the verifier executor's data-plane calls as a link whose drafts are always there: each batch's
drafts are fixed tokens already on the device, and a posted frame's header says what the draft service's
would (the step that drafted it, the batch, k, the sequence ids), so the executor's own checks of it pass
or fail exactly as on a real link. Verdicts are not sent: the cell's plans ask for none.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minedraft.engine.transfer import to_device
from minedraft.proto import control_pb2
from minedraft.worker.data_frames import DraftPayload, PostedDrafts, expected_header


class LoopbackDrafts:
    """Stands where `VerifierExecutor.plane` (worker/data_plane.DataPlane) does; `handled()` is the plan the
    executor is handling now (the one whose draft batch a posted frame carries)."""

    backend = "nccl"  # receives are posted on the stream, as over NCCL
    transport = "loopback"
    epoch = 0
    aborted = False

    def __init__(self, drafts: dict[tuple[int, ...], torch.Tensor], handled: Callable[[], control_pb2.StepPlan],
                 device: torch.device) -> None:
        self.drafts = drafts  # per batch (its sequence ids in order): [B, k] token ids on the device
        self.handled = handled
        self.device = device
        self.posted = 0  # receives posted so far
        self.taken = 0  # ... of which a launched-ahead verify consumed on the device
        self.received = 0  # drafts handed to an ordinary (not launched-ahead) verify

    def post_drafts_receive(self) -> None:
        self.posted += 1

    def take_posted_drafts(self, batch: int, k: int) -> PostedDrafts | None:
        """The frame of the drafts the handled plan's draft batch produces (the next plan verifies them)."""
        plan = self.handled()
        ids = list(plan.draft_batch)
        tokens = self.drafts[tuple(ids)]
        if tokens.shape != (batch, k):
            return None
        self.taken += 1
        header = to_device(torch.tensor(expected_header(plan.step, ids, plan.k), dtype=torch.long), self.device)
        return PostedDrafts(tokens, header)

    def recv_drafts(self) -> DraftPayload:
        """The drafts the handled plan verifies (drafted during the step before it)."""
        plan = self.handled()
        ids = list(plan.verify_batch)
        self.received += 1
        return DraftPayload(plan.step - 1, ids, self.drafts[tuple(ids)], None)

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        """Nothing to tear down: no process group was formed."""
