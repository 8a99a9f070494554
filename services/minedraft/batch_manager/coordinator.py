"""The batch manager's GenerationBackend: two workers, one step loop.

Start-up checks that the verifier and the draft service can work together (vocabulary,
context, KV cache), forms the data plane, then runs the loop. The parts live next door:
`step_driver` (plans out, verdicts in), `admission` (who starts, who is preempted, KV
accounting), `draft_supervisor` + `draft_state` (the draft service's loss and return),
`verifier_supervisor` (the verifier's return) and `link` (what a worker connection must
offer; `worker_link` implements it over gRPC). Shutting down is a drain: new requests are
refused, the ones in flight finish (up to a grace period), then the workers' streams close.
A step loop or event handler that dies of an unexpected error ends every request with that error, reports
unavailable, and sets `loop_failed`, on which the process exits non-zero to be restarted (not a hang).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from minedraft.batch_manager.admission import Admission, KvLimits
from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.draft_state import DraftState
from minedraft.batch_manager.link import WorkerLink, guarded
from minedraft.batch_manager.live_policy import apply_policy
from minedraft.batch_manager.step_driver import StepDriver
from minedraft.batch_manager.worker_link import GrpcWorkerLink
from minedraft.core.errors import ModelLoadError
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.worker.placement import COLOCATED_VERIFIER_ROLE, draft_on_verifier_gpu, same_gpu_message

log = logging.getLogger(__name__)
FAULT_STATES = (DraftState.LOST_AR, DraftState.RECOVERING)  # speculation off because something broke


class Coordinator:
    """A GenerationBackend that drives a remote verifier and (optionally) a draft service."""

    def __init__(self, tokenizer: Tokenizer, model_name: str, verifier: WorkerLink, draft: WorkerLink | None,
                 config: ManagerConfig) -> None:
        config.validate()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.admission = Admission(config.max_queue)
        self.driver = StepDriver(config, tokenizer, verifier, draft, self.admission)
        self.draining = False
        self._loop_task: asyncio.Task | None = None
        self.failure = ""  # why the step loop or an event handler died ("" while all is well)
        self.loop_failed = asyncio.Event()
        self.driver.fault = self.fail

    @classmethod
    def over_grpc(cls, tokenizer: Tokenizer, model_name: str, verifier_address: str, draft_address: str | None,
                  config: ManagerConfig) -> Coordinator:
        """The product's wiring; mode ar at start-up leaves the draft service out for good."""
        draft = GrpcWorkerLink("draft", draft_address) if draft_address and config.mode != "ar" else None
        return cls(tokenizer, model_name, GrpcWorkerLink("verifier", verifier_address), draft, config)

    @property
    def config(self) -> ManagerConfig:
        return self.driver.config

    @property
    def max_context(self) -> int:
        return self.admission.limits.max_context

    # ----- life cycle -------------------------------------------------------------------

    async def start(self, connect_timeout: float = 120.0) -> None:
        """Wait for the workers, check the pair, form the data plane, start the loop."""
        d = self.driver
        vinfo = await d.verifier.info(timeout=connect_timeout)
        if vinfo.vocab_size < self.tokenizer.vocab_size:
            raise ModelLoadError(f"tokenizer has {self.tokenizer.vocab_size} tokens but the verifier's model only "
                                 f"{vinfo.vocab_size}")
        limits = KvLimits(vinfo.max_context, self.tokenizer.vocab_size, vinfo.num_blocks, vinfo.block_size or 16)
        d.eos_ids = self.tokenizer.stop_ids(vinfo.eos_token_ids)
        d.verifier_device = vinfo.device.split(":")[0].split()[0] if vinfo.device else "cpu"
        await d.verifier.open(guarded(d.on_verifier_event, d.fault), d.on_verifier_lost)
        if vinfo.role == COLOCATED_VERIFIER_ROLE:
            d.sched.fuse_sd = True  # its SD verifies and drafts in one plan (scheduler.py)
            if d.draft.link is None or not d.config.draft_stand_in:
                log.info("the verifier drafts on its own GPU (colocated draft): no draft service, no data plane")
                if d.draft.link is not None:
                    await d.draft.link.close()  # a configured draft service is not used
                d.draft.colocate()
                d.sched.use_two_batches(d.draft.two_batches(d.config.mode))  # its auto: fused SD too
            else:
                log.info("the verifier also loaded the draft model: it drafts while the draft service is lost")
                d.draft.stand_in = True
        if d.draft.link is not None:
            dinfo = await d.draft.link.info(timeout=connect_timeout)
            if dinfo.vocab_size != vinfo.vocab_size:
                raise ModelLoadError(f"verifier and draft have different vocabularies ({vinfo.vocab_size} vs "
                                     f"{dinfo.vocab_size} tokens)")
            if draft_on_verifier_gpu(vinfo.device, dinfo.device):
                raise ModelLoadError(same_gpu_message(vinfo.device, dinfo.device))
            limits.max_context = min(limits.max_context, dinfo.max_context)
            limits.block_budget = min(limits.block_budget, dinfo.num_blocks)
        self.admission.limits = limits
        await d.draft.start()
        d.serving = True
        self._loop_task = asyncio.create_task(d.run())
        self._loop_task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task) -> None:
        error = None if task.cancelled() else task.exception()
        if isinstance(error, Exception):
            self.fail(error, "step loop")

    def fail(self, error: Exception, where: str = "event handling") -> None:
        """A bug (an unexpected error) in the loop or in handling a worker's event: the manager's state can no
        longer be trusted, so every request ends with the error and the process exits to be restarted."""
        if self.failure:
            return
        log.error("the batch manager's %s failed", where, exc_info=error)
        self.failure = f"the batch manager's {where} failed ({type(error).__name__}: {error})"
        self.driver.accepting = False
        self.driver.stop()
        self.driver.abort_everything(self.failure)
        self.loop_failed.set()

    def begin_drain(self) -> None:
        """Shutting down: refuse new requests (503 / UNAVAILABLE); those in flight go on."""
        self.draining = True
        self.driver.accepting = False

    async def drain(self, grace_s: float) -> float:
        """Refuse new requests and wait up to `grace_s` for every accepted one to finish; what is
        left then ends with finish_reason "abort". Returns the seconds it took."""
        self.begin_drain()
        start = time.monotonic()
        while self.driver.requests or self.admission.waiting:
            if time.monotonic() - start >= grace_s:
                left = len(self.driver.requests) + len(self.admission.waiting)
                log.warning("drain grace of %.0f s is over: aborting %d requests", grace_s, left)
                self.driver.abort_everything()
                break
            await asyncio.sleep(0.05)
        return time.monotonic() - start

    async def stop(self) -> None:
        """End the loop and close both workers' streams (a draining worker then exits)."""
        d = self.driver
        d.stop()
        if self._loop_task is not None:
            self._loop_task.cancel()
        await d.reconnect.stop()
        await d.draft.stop()
        d.abort_everything()
        await d.verifier.close()

    # ----- GenerationBackend ------------------------------------------------------------

    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                 deadline: float | None = None, partial: bool = True,
                 share_prompt: str | None = None) -> AsyncIterator[GenerationChunk]:
        return self.driver.generate(prompt_ids, params, deadline, partial, share_prompt)

    async def apply_policy(self, **changes: object) -> dict[str, object]:
        """Change mode, k, caps or thresholds without a restart (SpeculationPolicy)."""
        return await apply_policy(self.driver, changes)

    def current_mode(self) -> str:
        if not self.driver.drafting_now():
            return "ar"
        b0, b1 = self.driver.sched.batch_sizes()
        return "psd" if b0 and b1 else "sd"

    def health(self) -> tuple[str, str]:
        """(status, reason): ok; degraded while speculation is off because of a fault; unavailable
        while the verifier is gone; draining while shutting down."""
        d = self.driver
        if self.failure:
            return "unavailable", f"{self.failure}; the process exits to be restarted"
        if self.draining:
            return "draining", "shutting down: finishing the requests in flight, refusing new ones"
        if not d.serving:
            return "unavailable", "the verifier is not connected (starting, or lost and reconnecting)"
        if d.config.mode != "ar" and d.draft.state.state in FAULT_STATES:
            return "degraded", f"{d.draft.reason}: decoding without drafts until the draft service is back"
        if d.config.mode != "ar" and d.draft.state.state is DraftState.LOST_COLOCATED:
            return "degraded", f"{d.draft.reason}: the verifier drafts itself until the draft service is back"
        return "ok", ""

    def status(self) -> dict[str, object]:
        d, c = self.driver, self.driver.counters
        status, reason = self.health()
        return {
            "status": status,
            "reason": reason,
            "mode": self.current_mode(),
            "configured_mode": d.config.mode,
            "k": d.config.k,
            "running": len(d.requests),
            "waiting": len(self.admission.waiting),
            "batch_sizes": list(d.sched.batch_sizes()),
            "draft_connected": d.draft.state.connected,
            "draft_state": d.draft.state.state.value,
            "draft_link_transport": d.draft.transport if d.draft.state.connected else "",
            "data_plane_epoch": d.draft.epoch,
            "step": d.step,
            "reserved_blocks": self.admission.reserved_blocks,
            "block_budget": self.admission.limits.block_budget,
            "block_size": self.admission.limits.block_size,
            "fallbacks": c.fallbacks,
            "timing_totals": {k: round(v, 3) for k, v in c.timing.items()},
            "tokens_total": c.tokens,
            "drafted_total": c.drafted,
            "accepted_total": c.accepted,
            "seq_verifies_total": c.seq_verifies,
            "steps_by_kind": {"psd": c.psd_steps, "sd": c.sd_steps, "ar": c.ar_steps},
            "recoveries": c.recoveries,
            "preemptions": self.admission.preemptions,
            "verifier_reconnects": d.reconnect.reconnects,
            "acceptance_rate": round(c.accepted / c.drafted, 4) if c.drafted else 0.0,
            "mean_accepted_length": round(c.tokens / c.seq_verifies, 4) if c.seq_verifies else 0.0,
            "adaptive_k": d.k_plan.snapshot(),
            "prefix_cache": {"enabled": d.config.enable_prefix_caching,
                             "max_num_batched_tokens": d.config.max_num_batched_tokens, **c.prefix_cache.snapshot()},
        }
