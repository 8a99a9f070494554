"""The step driver: requests in, step plans out, verdicts back to clients.

Plans are pipelined `pipeline_depth` steps ahead of the verifier so neither worker
waits for a gRPC round trip; token payloads never pass through here except the
verified tokens streamed back for the clients. Modes:
- psd: two batches, balanced by load; one batch empty degenerates to standard SD;
- sd: one batch, sequential draft then verify;
- ar: the verifier alone;
- auto: psd, falling back to ar while drafting does not pay (mean accepted length
  under `auto_min_tokens_per_step`), probing psd again every `auto_probe_steps` steps.
In every mode a lost draft service means AR steps until it returns, then the data plane
is re-formed and the loop goes back to drafting. No token is decided by the manager:
the verifier's committed tokens are the truth, mirrored here in step order.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import replace

from minedraft.batch_manager.backend import GenerationChunk, QueueFullError, UnavailableError
from minedraft.batch_manager.config import POLICY_FIELDS, ManagerConfig
from minedraft.batch_manager.scheduler import TwoBatchScheduler
from minedraft.batch_manager.step_stats import Counters
from minedraft.batch_manager.worker_link import WorkerLink
from minedraft.core.codec import seq_spec
from minedraft.core.errors import InvalidRequestError, ModelLoadError
from minedraft.core.request import FINISH_ABORT, Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.core.validation import validate_request
from minedraft.proto import control_pb2

log = logging.getLogger(__name__)

class Coordinator:
    """A GenerationBackend that drives a remote verifier and draft service."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        model_name: str,
        target_address: str,
        draft_address: str | None,
        config: ManagerConfig,
    ) -> None:
        config.validate()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.config = config
        self.target = WorkerLink("target", target_address, self._on_event, self._on_lost)
        self.draft = (
            WorkerLink("draft", draft_address, self._on_event, self._on_lost)
            if draft_address and config.mode != "ar"
            else None
        )
        self.sched = TwoBatchScheduler(two_batches=config.mode in ("psd", "auto"))
        self.requests: dict[int, Request] = {}
        self.chunks: dict[int, asyncio.Queue[GenerationChunk]] = {}
        self.waiting: deque[Request] = deque()
        self.pending_remove: list[int] = []
        self.draft_adds: list[control_pb2.SeqSpec] = []
        self.eos_ids: frozenset[int] = frozenset()
        self.max_context = 0
        self.block_budget = 0
        self.block_size = 16
        self.reserved: dict[int, int] = {}
        self.step = 0
        self.in_flight = 0
        self.draft_ok = False
        self.drafting_paused_until = -1
        self.paused = False
        self.epoch = 0
        self.counters = Counters()
        self.healthy = False
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._setup_waiters: dict[str, asyncio.Future[control_pb2.WorkerEvent]] = {}
        self._drafted_at: dict[int, int] = {}  # step -> draft tokens per sequence judged in it
        self._tasks: list[asyncio.Task] = []
        self._last_verify_at = 0.0
        self._stopping = False

    # ----- life cycle -------------------------------------------------------------------

    async def start(self, connect_timeout: float = 120.0) -> None:
        """Wait for the workers, check the pair, form the data plane, start the loop."""
        tinfo = await self.target.info(timeout=connect_timeout)
        self.max_context = tinfo.max_context
        self.block_budget = tinfo.num_blocks
        self.block_size = tinfo.block_size or 16
        if tinfo.vocab_size < self.tokenizer.vocab_size:
            raise ModelLoadError(
                f"tokenizer has {self.tokenizer.vocab_size} tokens but the target model only {tinfo.vocab_size}"
            )
        self.eos_ids = self.tokenizer.stop_ids(tinfo.eos_token_ids)
        await self.target.open()
        if self.draft is not None:
            dinfo = await self.draft.info(timeout=connect_timeout)
            if dinfo.vocab_size != tinfo.vocab_size:
                raise ModelLoadError(
                    f"target and draft have different vocabularies ({tinfo.vocab_size} vs {dinfo.vocab_size} tokens)"
                )
            self.max_context = min(self.max_context, dinfo.max_context)
            self.block_budget = min(self.block_budget, dinfo.num_blocks)
            await self._connect_draft()
            if not self.draft_ok:
                self._tasks.append(asyncio.create_task(self._recover_draft()))
        self.healthy = True
        self._tasks.append(asyncio.create_task(self._drive()))

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        for req in list(self.requests.values()):
            self._finish_and_notify(req, FINISH_ABORT)
        await self.target.close()
        if self.draft is not None:
            await self.draft.close()

    # ----- public backend API -----------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        req = self._admit_request(prompt_ids, params)
        queue: asyncio.Queue[GenerationChunk] = asyncio.Queue()
        self.chunks[req.req_id] = queue
        self._wake.set()
        try:
            while True:
                chunk = await queue.get()
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            self.chunks.pop(req.req_id, None)
            if not req.finished:
                self._abort(req)

    def _admit_request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        if not self.healthy:
            raise UnavailableError("the verifier is not connected (starting, or lost); retry shortly")
        validate_request(prompt_ids, params, self.max_context, self.tokenizer.vocab_size)
        need = self._blocks_needed(len(prompt_ids), params.max_tokens)
        if need > self.block_budget:
            raise InvalidRequestError("request needs more KV memory than the whole cache; lower max_tokens")
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFullError(f"{len(self.waiting)} requests are already waiting; retry later")
        params.resolved_seed()
        req = Request(next(self._ids), list(prompt_ids), params)
        self.waiting.append(req)
        return req

    def _blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        return -(-(prompt_len + max_tokens + self.config.k + 1) // self.block_size)

    def status(self) -> dict[str, object]:
        b0, b1 = self.sched.batch_sizes()
        return {
            "mode": self.current_mode(),
            "configured_mode": self.config.mode,
            "k": self.config.k,
            "running": len(self.requests),
            "waiting": len(self.waiting),
            "batch_sizes": [b0, b1],
            "draft_connected": self.draft_ok,
            "step": self.step,
            "reserved_blocks": sum(self.reserved.values()),
            "block_budget": self.block_budget,
            "fallbacks": self.counters.fallbacks,
            "timing_totals": {k: round(v, 3) for k, v in self.counters.timing.items()},
            "tokens_total": self.counters.tokens,
            "drafted_total": self.counters.drafted,
            "accepted_total": self.counters.accepted,
            "seq_verifies_total": self.counters.seq_verifies,
            "steps_by_kind": {"psd": self.counters.psd_steps, "sd": self.counters.sd_steps,
                              "ar": self.counters.ar_steps},
            "recoveries": self.counters.recoveries,
            "acceptance_rate": round(self.counters.accepted / self.counters.drafted, 4)
            if self.counters.drafted else 0.0,
            "mean_accepted_length": round(self.counters.tokens / self.counters.seq_verifies, 4)
            if self.counters.seq_verifies else 0.0,
        }

    def current_mode(self) -> str:
        if not self._drafting_now():
            return "ar"
        b0, b1 = self.sched.batch_sizes()
        return "psd" if b0 and b1 else "sd"

    # ----- the step loop ----------------------------------------------------------------

    def _drafting_now(self) -> bool:
        return self.draft_ok and self.config.mode != "ar" and self.step >= self.drafting_paused_until

    def _has_work(self) -> bool:
        return bool(self.sched.seqs or self.waiting or self.pending_remove or self.draft_adds)

    async def _drive(self) -> None:
        while not self._stopping:
            if self.paused or self.in_flight >= self.config.pipeline_depth or not self._has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            self._issue_plan()

    def _admit_waiting(self) -> list[control_pb2.SeqSpec]:
        adds = []
        reserved = sum(self.reserved.values())
        while self.waiting and len(self.sched.seqs) < self.config.max_num_seqs:
            req = self.waiting[0]
            need = self._blocks_needed(len(req.prompt_ids), req.params.max_tokens)
            if reserved + need > self.block_budget:
                break
            self.waiting.popleft()
            reserved += need
            self.reserved[req.req_id] = need
            self.requests[req.req_id] = req
            self.sched.add(req.req_id, len(req.prompt_ids), req.params.max_tokens)
            adds.append(seq_spec(req))
        return adds

    def _issue_plan(self) -> None:
        adds = self._admit_waiting()
        with_drafts = self._drafting_now()
        if with_drafts:
            self.sched.rebalance()
        batches = self.sched.plan(self.step, with_drafts)
        common = {
            "step": self.step,
            "remove": self.pending_remove,
            "draft_batch": batches.draft,
            "verify_batch": batches.verify,
            "k": self.config.k,
            "with_drafts": with_drafts,
            # Verdicts go to a connected draft service even in AR steps, so its copy of every
            # sequence stays complete and drafting can resume at any step.
            "send_verdict": self.draft is not None and self.draft_ok,
        }
        self.target.send(control_pb2.ControlMessage(plan=control_pb2.StepPlan(add=adds, **common)))
        if self.draft is not None and self.draft_ok:
            plan = control_pb2.StepPlan(add=[*self.draft_adds, *adds], **common)
            self.draft.send(control_pb2.ControlMessage(plan=plan))
            self.draft_adds = []
        self._drafted_at[self.step] = self.config.k if with_drafts else 0
        self._count_step_kind(with_drafts, batches.draft, batches.verify)
        self.pending_remove = []
        self.in_flight += 1
        self.step += 1

    def _count_step_kind(self, with_drafts: bool, draft: list[int], verify: list[int]) -> None:
        if not with_drafts:
            self.counters.ar_steps += bool(verify)
        elif draft and verify:
            self.counters.psd_steps += 1
        elif draft or verify:
            self.counters.sd_steps += 1

    # ----- events from the workers ------------------------------------------------------

    def _on_event(self, role: str, event: control_pb2.WorkerEvent) -> None:
        if event.step < 0:
            waiter = self._setup_waiters.pop(role, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event)
            return
        if event.error:
            log.error("%s worker error at step %d: %s", role, event.step, event.error)
        if role == "draft":
            self.counters.add_timing("draft", event.timing)
            if event.data_plane_lost:
                self._draft_lost()
            return
        self._on_verified(event)

    def _on_verified(self, event: control_pb2.WorkerEvent) -> None:
        self.in_flight -= 1
        now = time.perf_counter()
        wall_ms = (now - self._last_verify_at) * 1000.0 if self._last_verify_at else 0.0
        self._last_verify_at = now
        self.counters.add_timing("verify", event.timing, wall_ms)
        drafted = self._drafted_at.pop(event.step, 0)
        if event.data_plane_lost:  # the verifier judged this step without drafts
            drafted = 0
        self._apply_verdicts(event.verdicts, drafted)
        if event.data_plane_lost:
            self._draft_lost()
        if event.error:
            self._fail_all(event.error)
        self._maybe_pause_drafting()
        self._wake.set()

    def _apply_verdicts(self, verdicts: control_pb2.Verdicts, drafted: int) -> None:
        offset = 0
        self.counters.add_verdicts(verdicts.counts, verdicts.accepted, drafted)
        for seq_id, count, accepted in zip(verdicts.seq_ids, verdicts.counts, verdicts.accepted, strict=True):
            tokens = list(verdicts.tokens[offset : offset + count])
            offset += count
            req = self.requests.get(seq_id)
            if req is None or req.finished:
                continue
            req.stats.steps += 1
            req.stats.drafted += drafted
            req.stats.accepted += accepted
            req.append_tokens(tokens, self.eos_ids, self.tokenizer.decode)
            self.sched.progress(seq_id, count)
            self._notify(req)
            if req.finished:
                self._retire(req)

    def _maybe_pause_drafting(self) -> None:
        """auto mode: stop drafting while recent steps show it does not pay."""
        if self.config.mode != "auto" or not self._drafting_now():
            return
        c = self.counters
        if c.recent_samples < 32:  # judge only on enough speculative verifies since drafting (re)started
            return
        if c.recent_tokens_per_seq < self.config.auto_min_tokens_per_step:
            self.drafting_paused_until = self.step + self.config.auto_probe_steps
            c.reset_recent()
            self.sched.restart_drafting()

    def _notify(self, req: Request) -> None:
        queue = self.chunks.get(req.req_id)
        chunk = GenerationChunk.take_from(req)
        if queue is not None and chunk is not None:
            queue.put_nowait(chunk)

    def _finish_and_notify(self, req: Request, reason: str) -> None:
        req.finish(reason)
        self._notify(req)
        self._retire(req)

    def _retire(self, req: Request) -> None:
        """Leave both batches at once; the next plan frees its KV blocks on both workers."""
        if self.requests.pop(req.req_id, None) is not None:
            self.pending_remove.append(req.req_id)
        self.sched.remove(req.req_id)
        self.reserved.pop(req.req_id, None)
        self._wake.set()

    def _abort(self, req: Request) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
        req.finish(FINISH_ABORT)
        self._retire(req)

    def _fail_all(self, message: str) -> None:
        log.error("verifier failed (%s); aborting running requests", message)
        for req in list(self.requests.values()):
            self._finish_and_notify(req, FINISH_ABORT)

    # ----- live policy ------------------------------------------------------------------

    async def apply_policy(self, **changes: object) -> dict[str, object]:
        """Change mode, k, the running-batch cap or the plan pipeline's depth without a restart
        (SpeculationPolicy).

        The loop is drained first so no step straddles the change: every issued plan has
        run, the mirror equals the verifier, and the next plan starts from a draft step.
        """
        unknown = set(changes) - set(POLICY_FIELDS)
        if unknown:
            raise InvalidRequestError(f"not policy fields: {sorted(unknown)}; use {list(POLICY_FIELDS)}")
        new = replace(self.config, **{name: value for name, value in changes.items() if value is not None})
        new.validate()
        if self.draft is None and new.mode != "ar":
            raise InvalidRequestError("this deployment has no draft service; only mode 'ar' is possible")
        await self._drain()
        try:
            self.config = new
            self.sched.two_batches = new.mode in ("psd", "auto")
            self.sched.restart_drafting()
            self.drafting_paused_until = -1
        finally:
            self.paused = False
            self._wake.set()
        return new.policy()

    # ----- draft service loss and return ------------------------------------------------

    def _on_lost(self, role: str) -> None:
        if role == "draft":
            self._draft_lost()
            return
        self.healthy = False
        self.in_flight = 0
        self._drafted_at.clear()
        self._fail_all("verifier control stream lost")

    def _draft_lost(self) -> None:
        if not self.draft_ok:
            return
        log.warning("draft service lost: continuing autoregressively on the verifier")
        self.draft_ok = False
        self.counters.fallbacks += 1
        self.sched.restart_drafting()
        if self.draft is not None:
            asyncio.get_running_loop().create_task(self.draft.close_stream())
            self._tasks.append(asyncio.get_running_loop().create_task(self._recover_draft()))
        self._wake.set()

    async def _recover_draft(self) -> None:
        assert self.draft is not None
        while not self._stopping and not self.draft_ok:
            await asyncio.sleep(self.config.draft_retry_s)
            try:
                await self.draft.info(timeout=2.0)
            except Exception:
                continue
            await self._drain()
            await self._connect_draft(recovering=True)
            self.paused = False
            self._wake.set()

    async def _drain(self) -> None:
        """Stop issuing plans and wait until the verifier has executed every issued one."""
        self.paused = True
        while self.in_flight > 0 and not self._stopping:
            self._wake.clear()
            await self._wake.wait()

    async def _connect_draft(self, recovering: bool = False) -> None:
        """Open the draft stream and form a fresh data-plane epoch with the verifier."""
        assert self.draft is not None
        tinfo = await self.target.info()
        await self.draft.open()
        self.epoch += 1
        setup = control_pb2.DataPlaneSetup(
            epoch=self.epoch,
            master_addr=tinfo.data_plane_addr,
            master_port=tinfo.data_plane_port,
            backend=self.config.data_plane_backend,
            timeout_s=self.config.data_plane_timeout_s,
        )
        loop = asyncio.get_running_loop()
        waiters = {role: loop.create_future() for role in ("target", "draft")}
        self._setup_waiters.update(waiters)
        msg = control_pb2.ControlMessage(setup=setup)
        self.target.send(msg)
        self.draft.send(msg)
        try:
            results = await asyncio.wait_for(asyncio.gather(*waiters.values()),
                                             self.config.data_plane_timeout_s + 10)
        except TimeoutError:
            results = []
        if not results or not all(r.setup_done for r in results):
            log.warning("data plane epoch %d did not form: %s", self.epoch, [r.error for r in results])
            await self.draft.close_stream()
            return
        if recovering:
            self.draft_adds = [seq_spec(req) for req in self.requests.values()]
            self.sched.restart_drafting()
            self.counters.recoveries += 1
            log.info("draft service is back: data plane epoch %d, drafting again", self.epoch)
        self.draft_ok = True
