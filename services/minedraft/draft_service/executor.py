"""Runs the draft half of each step plan on the draft model."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.draft_service.launch_ahead import AwaitedVerdict, LaunchedDraft, launchable_kd
from minedraft.engine import eagle_ahead
from minedraft.engine.draft_ahead import propose_ahead, settle
from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.eagle_drafter import EagleDrafter
from minedraft.engine.readback import Readback, device_mark, elapsed_ms
from minedraft.engine.tetris_propose import propose_selected
from minedraft.proto import control_pb2
from minedraft.worker.data_frames import DraftPayload, expected_verdict_header, split_verdict_frame
from minedraft.worker.data_plane import DRAFT_RANK, DataPlane, DataPlaneError
from minedraft.worker.info import worker_info
from minedraft.worker.membership import apply_membership, cache_report, forget_all
from minedraft.worker.placement import device_identity
from minedraft.worker.plane_owner import PlaneOwner, setup_timeout_s
from minedraft.worker.step_timing import timed

log = logging.getLogger(__name__)
NEXT_PLAN_POLL_S = 0.00005


def wait_for(finished: torch.cuda.Event | None) -> None:
    """End the compute timer when the GPU is done with this plan's drafts (not with work queued after
    them), so the step anatomy charges the draft's GPU time to compute."""
    if finished is not None:
        finished.synchronize()


class DraftExecutor(PlaneOwner):
    role = "draft"

    def __init__(self, worker: Drafter, launch_ahead: bool = False) -> None:
        self.worker = worker
        self.launch_ahead = launch_ahead  # draft from verdicts still on the device (launch_ahead.py)
        self.device = worker.runner.device
        self.plane: DataPlane | None = None
        self.awaited: AwaitedVerdict | None = None  # the verdict the next plan commits or drafts from
        self.launched: LaunchedDraft | None = None  # the next plan, when its drafts are already queued
        self.upcoming: Callable[[], control_pb2.StepPlan | None] = lambda: None  # set by the control loop
        self.ahead_count = 0  # plans drafted from a verdict still on the device
        self.applied_step = -1  # a plan whose membership was applied while the previous one ran
        self.last_step = -1

    def reset(self) -> None:
        if self.ahead_count:
            log.info("%d plans were drafted from verdicts on the device", self.ahead_count)
        forget_all(self.worker)
        self._drop_plane()
        self.awaited, self.launched, self.ahead_count = None, None, 0

    def handle_setup(self, setup: control_pb2.DataPlaneSetup) -> control_pb2.WorkerEvent:
        self._drop_plane()
        self.awaited, self.launched = None, None
        timeout_s = setup_timeout_s(setup.timeout_s)
        try:
            store = dist.TCPStore(setup.master_addr, setup.master_port, is_master=False,
                                  timeout=timedelta(seconds=timeout_s))
            self.plane = DataPlane(DRAFT_RANK, setup.epoch, store, setup.backend, self.worker.runner.device,
                                   timeout_s, setup.manager_run)
        except (DataPlaneError, RuntimeError) as exc:
            return control_pb2.WorkerEvent(step=-1, data_plane_lost=True, error=str(exc), epoch=setup.epoch)
        return control_pb2.WorkerEvent(step=-1, setup_done=True, transport=self.plane.transport, epoch=setup.epoch)

    def _commit_verdict(self, timing: control_pb2.StepTiming) -> None:
        if self.awaited is None or self.plane is None:
            return
        with timed(timing, "recv_wait_ms"):
            verdict = self.plane.recv_verdict()
        with timed(timing, "control_ms"):
            parts = verdict.hidden.split() if verdict.hidden is not None else [None] * len(verdict.seq_ids)
            for seq_id, row, accepted, part in zip(verdict.seq_ids, verdict.tokens.tolist(),
                                                   verdict.accepted.tolist(), parts, strict=True):
                if seq_id in self.worker.seqs:
                    self.worker.commit(seq_id, row[: accepted + 1], accepted, part)

    def handle_plan(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        launched, self.launched = self.launched, None
        if launched is not None and launched.plan.step == plan.step:
            return self._finish(launched)
        event = control_pb2.WorkerEvent(step=plan.step)
        timing = event.timing
        if launched is not None:  # its verdict was consumed and never settled: re-sync with the verifier
            self._lost(plan, event, RuntimeError(f"plan {launched.plan.step} was drafted ahead, {plan.step} came"))
        kd = launchable_kd(self.worker, self.awaited, plan, []) if self._ahead_ok() and not plan.draft_budget else None
        if plan.step != self.applied_step:
            with timed(timing, "control_ms"):
                apply_membership(self.worker, plan)
        try:
            if kd is not None and (launched := self._launch(plan, kd, event)) is not None:
                return self._finish(launched)
            self._commit_verdict(timing)
            ids = list(plan.draft_batch) if plan.with_drafts else []
            timing.batch = len(ids)
            if ids and self.plane is not None:
                started = device_mark(self.device)
                with timed(timing, "compute_ms"):
                    proposal = propose_selected(self.worker, ids, plan.k, plan.draft_budget, plan.draft_min_prob)
                finished = device_mark(self.device)
                self._send(plan, ids, proposal, timing)
                self._await_verdict(plan)
                self._launch_next(plan, ids, finished)
                with timed(timing, "compute_ms"):
                    wait_for(finished)
                timing.device_ms = elapsed_ms(started, finished)
            else:
                self._await_verdict(plan)
        except DataPlaneError as exc:
            self._lost(plan, event, exc)
        self.last_step = plan.step
        cache_report(self.worker, event.prefix_cache)
        return event

    def _ahead_ok(self) -> bool:
        return self.launch_ahead and self.plane is not None and self.awaited is not None

    def _send(self, plan: control_pb2.StepPlan, ids: list[int], proposal: Proposal,
              timing: control_pb2.StepTiming) -> None:
        # Queued behind the draft's kernels: the send's host work overlaps them.
        with timed(timing, "send_ms"):
            assert self.plane is not None
            self.plane.send_drafts(DraftPayload(plan.step, ids, proposal.tokens, proposal.probs))

    def _await_verdict(self, plan: control_pb2.StepPlan) -> None:
        """Note the verdict the plan's verify will send; with launch-ahead, post its receive now (behind
        the drafts just queued) so the next plan can draft from it on the device."""
        self.awaited = None
        if not plan.send_verdict or not plan.verify_batch or self.plane is None:
            return
        self.awaited = AwaitedVerdict(plan.step, [s for s in plan.verify_batch if s in self.worker.seqs])
        if self.launch_ahead:
            self.plane.post_verdict_receive()

    def _launch(self, plan: control_pb2.StepPlan, kd: int, event: control_pb2.WorkerEvent) -> LaunchedDraft | None:
        """Queue the plan's drafts behind its verdict's posted receive (membership already applied)."""
        assert self.plane is not None and self.awaited is not None
        ids, timing = list(plan.draft_batch), event.timing
        head = isinstance(self.worker, EagleDrafter)
        with timed(timing, "compute_ms"):
            posted = self.plane.take_posted_verdict(len(ids), kd, head)
            if posted is None:
                return None
            runs = None
            if head and self.plane.verdict_states is not None:  # each row's states from its window's start
                runs = ([self.worker.seqs[s].length - 1 for s in ids], *self.plane.verdict_states)
            expected = expected_verdict_header(self.awaited.step, ids, kd, runs)
            verdict = Readback(posted.frame)  # on the host as soon as the verdict lands
            started = device_mark(self.device)
            if isinstance(self.worker, EagleDrafter) and posted.hidden is not None:
                proposal = eagle_ahead.propose_ahead(self.worker, ids, kd, plan.k, posted.accepted, posted.tokens,
                                                     posted.hidden)
            else:
                proposal = propose_ahead(self.worker, ids, kd, plan.k, posted.accepted, posted.tokens)
            finished = device_mark(self.device)
        timing.batch = len(ids)
        self._send(plan, ids, proposal, timing)
        self._await_verdict(plan)
        if not self.ahead_count:
            log.info("drafts are launched from verdicts on the device (first: step %d)", plan.step)
        self.ahead_count += 1
        return LaunchedDraft(plan, ids, kd, event, verdict, expected, started, finished, posted.hidden)

    def _launch_next(self, plan: control_pb2.StepPlan, ids: list[int], finished: torch.cuda.Event | None) -> None:
        """Queue the next plan's drafts now when it has arrived (waiting for it while this plan's kernels run)."""
        if not self._ahead_ok():
            return
        while (nxt := self.upcoming()) is None and finished is not None and not finished.query():
            time.sleep(NEXT_PLAN_POLL_S)
        if nxt is None or nxt.step != plan.step + 1:
            return
        kd = launchable_kd(self.worker, self.awaited, nxt, ids) if not nxt.draft_budget else None  # TETRIS selects
        assert self.plane is not None
        if kd is None or not self.plane.can_take_verdict(len(ids), kd, isinstance(self.worker, EagleDrafter)):
            return
        event = control_pb2.WorkerEvent(step=nxt.step)
        with timed(event.timing, "control_ms"):
            apply_membership(self.worker, nxt)
        self.applied_step = nxt.step  # should the launch fail, the plan's ordinary path must not apply it again
        self.launched = self._launch(nxt, kd, event)

    def _finish(self, launched: LaunchedDraft) -> control_pb2.WorkerEvent:
        """Queue the plan after this one, read this plan's verdict back and settle it, wait for its drafts."""
        plan, event = launched.plan, launched.event
        timing = event.timing
        try:
            self._launch_next(plan, launched.ids, launched.finished)
        except DataPlaneError as exc:
            self._lost(plan, event, exc)
        with timed(timing, "recv_wait_ms"):
            frame = launched.verdict.tolist()
        header, accepted, rows = split_verdict_frame(frame, len(launched.ids), launched.kd)
        with timed(timing, "control_ms"):
            if header != launched.expected_header:
                log.error("step %d drafted from a verdict whose header %s is not the expected %s; re-syncing",
                          plan.step, header[:8], launched.expected_header[:8])
                self._drop_plane()
                event.data_plane_lost = True
            elif isinstance(self.worker, EagleDrafter) and launched.states is not None:
                eagle_ahead.settle(self.worker, launched.ids, rows, accepted, plan.k, launched.states)
            else:
                settle(self.worker, launched.ids, rows, accepted, plan.k)
        with timed(timing, "compute_ms"):
            wait_for(launched.finished)
        timing.device_ms = elapsed_ms(launched.started, launched.finished)
        self.last_step = plan.step
        cache_report(self.worker, event.prefix_cache)
        return event

    def _lost(self, plan: control_pb2.StepPlan, event: control_pb2.WorkerEvent, exc: Exception) -> None:
        log.warning("verifier lost at step %d: %s", plan.step, exc)
        self._drop_plane()
        self.awaited, self.launched = None, None
        event.data_plane_lost = True

    def graph_capture_ms(self) -> float:
        return self.worker.runner.graph_capture_ms

    def info(self) -> control_pb2.WorkerInfo:
        info = worker_info(self.worker, self.role, self.last_step,
                           transport=self.plane.transport if self.plane is not None else "")
        info.device = device_identity(self.device)  # the GPU's UUID: the manager refuses the verifier's GPU
        return info
