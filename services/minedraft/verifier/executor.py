"""Runs the verify half of each step plan on the target model."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.distributed as dist

from minedraft.engine.hidden_rows import HiddenRows
from minedraft.engine.readback import Readback, device_mark
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.verifier import posted_drafts
from minedraft.verifier.ar_ahead import held, launch_ar
from minedraft.verifier.colocated import ColocatedDrafter, verified_lengths
from minedraft.verifier.draft_rows import align_drafts
from minedraft.verifier.launch_ahead import LaunchedStep, await_next, launchable_ids
from minedraft.verifier.posted_drafts import DraftedBatch, PostedProposal
from minedraft.verifier.verdict_event import add_verdicts
from minedraft.worker.data_frames import DraftPayload, VerdictPayload
from minedraft.worker.data_plane import VERIFIER_RANK, DataPlane, DataPlaneError
from minedraft.worker.info import worker_info
from minedraft.worker.membership import apply_membership, cache_report, forget_all, verify_ids
from minedraft.worker.placement import COLOCATED_VERIFIER_ROLE, device_identity
from minedraft.worker.plane_owner import PlaneOwner, setup_timeout_s
from minedraft.worker.stall_watch import StallWatch
from minedraft.worker.step_timing import timed
from minedraft.worker.tp_group import KIND_PLAN, KIND_RESET, StepBroadcast

log = logging.getLogger(__name__)


class VerifierExecutor(PlaneOwner):
    role = "verifier"

    def __init__(
        self,
        worker: Verifier,
        store: dist.Store,
        store_host: str,
        store_port: int,
        followers: StepBroadcast | None = None,
        colocated: ColocatedDrafter | None = None,
        launch_ahead: bool = False,
        stall: StallWatch | None = None,
    ) -> None:
        self.stall = stall  # with tensor parallelism: a readback that never returns ends the process
        self.launch_ahead = launch_ahead  # queue the next PSD verify before reading this one back
        self.worker = worker
        self.colocated = colocated  # the draft model on this GPU (--colocated-draft): SD without a draft service
        if colocated is not None and followers is None:  # followers lay a packed verify out from host lengths
            colocated.select_on_device(worker.runner.packed_graphs is not None)
        self.followers = followers  # tensor-parallel ranks 1..N-1, driven step by step
        self.device = worker.runner.device
        self.store = store
        self.store_host = store_host
        self.store_port = store_port
        self.plane: DataPlane | None = None
        self.drafts_pending = False
        self.drafted: DraftedBatch | None = None  # what the pending drafts are (posted_drafts.py)
        self.last_step = -1
        self.upcoming: Callable[[], control_pb2.StepPlan | None] = lambda: None  # set by the control loop
        self.launched: LaunchedStep | None = None  # the next plan, when its verify is already queued
        self.launched_count = 0  # verifies launched ahead since the batch manager connected
        self.posted_count = 0  # ... and queued before their drafts reached the host
        self.verified_count = 0  # ... of so many verify steps

    def reset(self) -> None:
        if self.launched_count or self.posted_count:
            log.info("%d of %d verify steps were launched ahead, %d queued before their drafts were read",
                     self.launched_count, self.verified_count, self.posted_count)
        self.launched, self.launched_count, self.posted_count, self.verified_count = None, 0, 0, 0
        if self.followers is not None:
            self.followers.send(KIND_RESET)
        forget_all(self.worker)
        if self.colocated is not None:
            self.colocated.reset()
        self._drop_plane()
        self.drafts_pending = False

    def abort_data_plane(self, abort: control_pb2.DataPlaneAbort) -> None:
        """From the control stream's reader thread, ahead of queued plans: the manager saw the draft service
        go, and a receive from it (which the GPU stream may wait on) would otherwise last NCCL's timeout."""
        plane = self.plane
        if plane is not None and plane.epoch == abort.epoch:
            log.warning("aborting data plane epoch %d: %s", abort.epoch, abort.reason)
            plane.abort()

    def handle_setup(self, setup: control_pb2.DataPlaneSetup) -> control_pb2.WorkerEvent:
        self._drop_plane()
        self.drafts_pending = False
        try:
            self.plane = DataPlane(VERIFIER_RANK, setup.epoch, self.store, setup.backend,
                                   self.worker.runner.device, setup_timeout_s(setup.timeout_s), setup.manager_run)
        except DataPlaneError as exc:
            return control_pb2.WorkerEvent(step=-1, data_plane_lost=True, error=str(exc), epoch=setup.epoch)
        return control_pb2.WorkerEvent(step=-1, setup_done=True, transport=self.plane.transport, epoch=setup.epoch)

    def _receive_drafts(self, timing: control_pb2.StepTiming, here: bool) -> DraftPayload | None:
        """The drafts this plan verifies: the own draft model's (`here`), else the draft service's."""
        own = self.colocated.take() if self.colocated is not None else None  # never kept past its plan
        if here:
            return own
        if not self.drafts_pending or self.plane is None:
            return None
        with timed(timing, "recv_wait_ms"):
            return self.plane.recv_drafts()

    def handle_plan(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        launched, self.launched = self.launched, None
        if launched is not None:
            if launched.plan.step == plan.step:
                return self._finish_launched(launched)
            log.error("plan %d arrived where %d was launched ahead; re-syncing the draft service", plan.step,
                      launched.plan.step)
            self._drop_plane()  # the draft service already has a verdict this worker never committed
        dropped = launched is not None  # the followers forget it uncommitted too
        event = control_pb2.WorkerEvent(step=plan.step)
        timing = event.timing
        payload = posted = None
        here = self.colocated is not None and plan.draft_here  # this plan drafts on the own draft model
        try:
            posted = self._take_posted(plan)
            payload = self._receive_drafts(timing, here) if posted is None else None
        except DataPlaneError as exc:
            self._plane_lost(event, f"draft service lost at step {plan.step}: {exc}")
        self._expect_drafts(plan, not here)
        with timed(timing, "control_ms"):
            apply_membership(self.worker, plan)
            if self.colocated is not None:
                self.colocated.apply_membership(plan)
        ids = verify_ids(self.worker, plan)
        timing.batch = len(ids)
        if ids:
            # Drafts that arrive for an AR plan (drafting was just switched off) are dropped.
            proposal = align_drafts(payload, ids) if payload is not None and plan.with_drafts else None
            proposal = posted.proposal_for(ids) if posted is not None else proposal
            if self.followers is not None:
                self.followers.send(KIND_PLAN, plan, proposal, drop=dropped)
            started = device_mark(self.device) if self.colocated is None else None
            with timed(timing, "compute_ms"):
                verdict = self.worker.judge(ids, proposal)
            # The verdict (and an EAGLE head's states) leaves while the GPU computes it: the send overlaps the verify.
            hidden = self.worker.runner.take_hidden(ids) if plan.send_verdict or self.colocated else None
            self._hand_on(plan, VerdictPayload(plan.step, ids, verdict.tokens, verdict.accepted, hidden), timing, event)
            readback = self._checked(posted, plan, ids, event, self.worker.read_back(verdict, started))
            if here and self.launch_ahead:  # the next drafts go right behind the verify (colocated_ahead.py)
                self.colocated.draft_ahead(plan, ids, proposal, verdict)  # type: ignore[union-attr]
            self._launch_next(plan, ids, event, readback, None if plan.with_drafts else verdict.tokens)
            self._commit(ids, readback, event, hidden, verified_lengths(proposal, self.colocated))
        else:
            if self.followers is not None:
                self.followers.send(KIND_PLAN, plan, None, drop=dropped)
            empty = VerdictPayload(plan.step, ids, torch.zeros((0, plan.k + 1), dtype=torch.long),
                                   torch.zeros(0, dtype=torch.long))
            self._hand_on(plan, empty, timing, event)
        if here and plan.with_drafts and len(plan.draft_batch) > 0:
            assert self.colocated is not None
            with timed(timing, "compute_ms"):
                self.colocated.draft(plan)
        self.last_step = plan.step
        return self._report(event)

    def _commit(self, ids: list[int], readback: Readback, event: control_pb2.WorkerEvent,
                hidden: HiddenRows | None = None, lengths: list[int] | None = None) -> None:
        """Read the verdict back, commit it, and put it in the event (`lengths`: TETRIS's per-row draft counts)."""
        self.verified_count += 1
        timing = event.timing
        with timed(timing, "compute_ms"), StallWatch.around(self.stall, "rank 0's verify"):
            rows, accepted_list = self.worker.commit(ids, readback, held(self.launched))
        timing.device_ms += readback.device_ms()
        add_verdicts(event, self.worker, ids, rows, accepted_list, lengths)
        if self.colocated is not None:
            with timed(timing, "control_ms"):
                self.colocated.commit(ids, rows, accepted_list, hidden)

    def _launch_next(self, plan: control_pb2.StepPlan, ids: list[int], event: control_pb2.WorkerEvent,
                     readback: Readback, ar: torch.Tensor | None = None) -> None:
        """Queue the next plan's verify now when launch_ahead.py's conditions hold (no colocated draft; followers
        queue it too), or after an AR step (`ar`: its tokens on the device) the next one when ar_ahead.py's do."""
        if ar is not None and self.launch_ahead and self.colocated is None and self.followers is None:
            self.launched = launch_ar(self.worker, plan, ids, ar, await_next(self.upcoming, readback))
            self.launched_count += self.launched is not None
            return
        if not self.launch_ahead or self.plane is None or self.colocated is not None:
            return
        if (nxt := await_next(self.upcoming, readback)) is None:
            return
        # Drafts TETRIS selected (plan.draft_budget) are ragged: their lengths are read on the host first.
        ragged = plan.draft_budget > 0
        sampled = self.followers is None  # a follower could not judge a broken sampled step again
        next_ids = launchable_ids(self.worker, plan, ids, nxt, sampled) if self.drafts_pending and not ragged else None
        if next_ids is None:
            return
        next_event = control_pb2.WorkerEvent(step=nxt.step)
        timing = next_event.timing
        try:
            with timed(timing, "compute_ms"):
                if (posted := posted_drafts.take_drafts(self.worker, self.plane, next_ids, plan.step, plan.k)) is None:
                    return
                proposal = posted.proposal
                started = device_mark(self.device)  # the verify's GPU time starts once its drafts are in
                apply_membership(self.worker, nxt)
                if self.followers is not None:
                    self.followers.send(KIND_PLAN, nxt, proposal, ahead=True)
                verdict = self.worker.judge(next_ids, proposal)
        except DataPlaneError as exc:
            self._plane_lost(event, f"draft service lost at step {plan.step}: {exc}")
            return
        timing.batch = len(next_ids)
        self._expect_drafts(nxt)
        hidden = self.worker.runner.take_hidden(next_ids) if nxt.send_verdict else None  # an EAGLE head's states
        payload = VerdictPayload(nxt.step, next_ids, verdict.tokens, verdict.accepted, hidden)
        self._hand_on(nxt, payload, timing, next_event)
        self.launched = LaunchedStep(nxt, next_ids, next_event, self.worker.read_back(verdict, started), posted)
        if not self.launched_count:
            log.info("verifies are launched ahead (first: step %d, queued during step %d)", nxt.step, plan.step)
        self.launched_count += 1

    def _finish_launched(self, launched: LaunchedStep) -> control_pb2.WorkerEvent:
        """The plan launched ahead arrives: check the drafts it used, launch the one after it, commit it."""
        plan, event = launched.plan, launched.event
        readback = self._checked(launched.posted, plan, launched.ids, event, launched.readback)
        self._launch_next(plan, launched.ids, event, readback, launched.tokens)
        self._commit(launched.ids, readback, event)
        self.last_step = plan.step
        return self._report(event)

    def _checked(self, posted: PostedProposal | None, plan: control_pb2.StepPlan, ids: list[int],
                 event: control_pb2.WorkerEvent, readback: Readback) -> Readback:
        """The verdict to commit for a verify that took its drafts unread: a broken frame drops the data plane,
        and a sampled step is then judged again without drafts (posted_drafts.judged_without_drafts)."""
        if posted is None or not posted.broken(self.plane):
            return readback
        self._plane_lost(event, posted.mismatch(plan.step), logging.ERROR)
        return posted_drafts.judged_without_drafts(self.worker, ids, plan.send_verdict) if posted.sampled else readback

    def _expect_drafts(self, plan: control_pb2.StepPlan, from_service: bool = True) -> None:
        """Whether the draft service's drafts of the plan's draft batch are coming for the next plan, and which."""
        self.drafts_pending = from_service and plan.with_drafts and len(plan.draft_batch) > 0 and self.plane is not None
        self.drafted = DraftedBatch.of(plan) if self.drafts_pending else None

    def _take_posted(self, plan: control_pb2.StepPlan) -> PostedProposal | None:
        """The plan's drafts from the posted frame, unread, with launch-ahead on (posted_drafts.py)."""
        plane, drafted = self.plane, self.drafted
        if not (self.launch_ahead and self.drafts_pending) or plane is None or drafted is None or self.colocated:
            return None
        posted = posted_drafts.take_posted(self.worker, plane, drafted, plan, sampled=self.followers is None)
        if posted is not None and not self.posted_count:
            log.info("verifies are queued before their drafts are read (first: step %d)", plan.step)
        self.posted_count += posted is not None
        return posted

    def _plane_lost(self, event: control_pb2.WorkerEvent, why: str, level: int = logging.WARNING) -> None:
        """Drop the data plane and tell the manager, which forms a new one with the draft service."""
        log.log(level, "%s", why)
        self._drop_plane()
        event.data_plane_lost = True

    def _report(self, event: control_pb2.WorkerEvent) -> control_pb2.WorkerEvent:
        cache_report(self.worker, event.prefix_cache)
        if self.colocated is not None:
            cache_report(self.colocated.drafter, event.draft_prefix_cache)
        return event

    def _hand_on(self, plan: control_pb2.StepPlan, verdict: VerdictPayload, timing: control_pb2.StepTiming,
                 event: control_pb2.WorkerEvent) -> None:
        """Send the verdict (when the plan asks) and post the receive of the drafts this plan's draft
        batch will produce, which the next plan consumes."""
        if plan.send_verdict and len(plan.verify_batch) > 0 and self.plane is not None:
            self._send_verdict(verdict, timing, event)
        if self.drafts_pending and self.plane is not None and (self.plane.backend == "nccl" or self.launch_ahead):
            try:
                self.plane.post_drafts_receive()
            except DataPlaneError as exc:
                self._plane_lost(event, f"draft service lost at step {plan.step}: {exc}")
                self.drafts_pending = False

    def _send_verdict(self, payload: VerdictPayload, timing: control_pb2.StepTiming,
                      event: control_pb2.WorkerEvent) -> None:
        try:
            with timed(timing, "send_ms"):
                self.plane.send_verdict(payload)
        except DataPlaneError as exc:
            self._plane_lost(event, f"draft service lost while sending step {payload.step}: {exc}")

    def graph_capture_ms(self) -> float:
        colocated = self.colocated.drafter.runner.graph_capture_ms if self.colocated is not None else 0.0
        return self.worker.runner.graph_capture_ms + colocated

    def info(self) -> control_pb2.WorkerInfo:
        role = self.role if self.colocated is None else COLOCATED_VERIFIER_ROLE
        info = worker_info(self.worker, role, self.last_step, data_plane_addr=self.store_host,
                           data_plane_port=self.store_port,
                           transport=self.plane.transport if self.plane is not None else "")
        info.device = device_identity(self.device)  # the GPU's UUID: the manager refuses a draft on it
        return info
