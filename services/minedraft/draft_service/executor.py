"""Runs the draft half of each step plan on the draft model."""

from __future__ import annotations

import logging
from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.engine.drafter import Drafter
from minedraft.engine.readback import device_mark, elapsed_ms
from minedraft.proto import control_pb2
from minedraft.worker.data_plane import DRAFT_RANK, DataPlane, DataPlaneError, DraftPayload, PlaneOwner, setup_timeout_s
from minedraft.worker.info import worker_info
from minedraft.worker.membership import apply_membership, forget_all
from minedraft.worker.placement import device_identity
from minedraft.worker.step_timing import timed

log = logging.getLogger(__name__)


def wait_for_device(tensor: torch.Tensor) -> None:
    """End the compute timer when the GPU is done, not when the launches are queued, so the
    step anatomy charges the draft's GPU time to compute rather than to the send after it."""
    if tensor.is_cuda:
        torch.cuda.current_stream(tensor.device).synchronize()


class DraftExecutor(PlaneOwner):
    role = "draft"

    def __init__(self, worker: Drafter) -> None:
        self.worker = worker
        self.device = worker.runner.device
        self.plane: DataPlane | None = None
        self.verdict_pending = False
        self.last_step = -1

    def reset(self) -> None:
        forget_all(self.worker)
        self._drop_plane()
        self.verdict_pending = False

    def handle_setup(self, setup: control_pb2.DataPlaneSetup) -> control_pb2.WorkerEvent:
        self._drop_plane()
        self.verdict_pending = False
        timeout_s = setup_timeout_s(setup.timeout_s)
        try:
            store = dist.TCPStore(setup.master_addr, setup.master_port, is_master=False,
                                  timeout=timedelta(seconds=timeout_s))
            self.plane = DataPlane(DRAFT_RANK, setup.epoch, store, setup.backend, self.worker.runner.device,
                                   timeout_s)
        except (DataPlaneError, RuntimeError) as exc:
            return control_pb2.WorkerEvent(step=-1, data_plane_lost=True, error=str(exc), epoch=setup.epoch)
        return control_pb2.WorkerEvent(step=-1, setup_done=True, transport=self.plane.transport, epoch=setup.epoch)

    def _commit_verdict(self, timing: control_pb2.StepTiming) -> None:
        if not self.verdict_pending or self.plane is None:
            return
        with timed(timing, "recv_wait_ms"):
            verdict = self.plane.recv_verdict()
        with timed(timing, "control_ms"):
            for seq_id, row, accepted in zip(verdict.seq_ids, verdict.tokens.tolist(), verdict.accepted.tolist(),
                                             strict=True):
                if seq_id in self.worker.seqs:
                    self.worker.commit(seq_id, row[: accepted + 1], accepted)

    def handle_plan(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        event = control_pb2.WorkerEvent(step=plan.step)
        timing = event.timing
        with timed(timing, "control_ms"):
            apply_membership(self.worker, plan)
        try:
            self._commit_verdict(timing)
            self.verdict_pending = plan.send_verdict and len(plan.verify_batch) > 0
            ids = list(plan.draft_batch) if plan.with_drafts else []
            timing.batch = len(ids)
            if ids and self.plane is not None:
                started = device_mark(self.device)
                with timed(timing, "compute_ms"):
                    proposal = self.worker.propose(ids, plan.k)
                finished = device_mark(self.device)
                # Queued behind the draft's kernels: the send's host work overlaps them.
                with timed(timing, "send_ms"):
                    self.plane.send_drafts(DraftPayload(plan.step, ids, proposal.tokens, proposal.probs))
                with timed(timing, "compute_ms"):
                    wait_for_device(proposal.tokens)
                timing.device_ms = elapsed_ms(started, finished)
        except DataPlaneError as exc:
            log.warning("verifier lost at step %d: %s", plan.step, exc)
            self._drop_plane()
            event.data_plane_lost = True
        self.last_step = plan.step
        return event

    def info(self) -> control_pb2.WorkerInfo:
        info = worker_info(self.worker, self.role, self.last_step,
                           transport=self.plane.transport if self.plane is not None else "")
        info.device = device_identity(self.device)  # the GPU's UUID: the manager refuses the verifier's GPU
        return info
