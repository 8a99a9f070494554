"""The step loop: step plans out to both workers, the verifier's verdicts back to the requests.

Plans run `pipeline_depth` steps ahead of the verifier so neither worker waits for a gRPC round trip; token
payloads never pass through here except the verified tokens streamed back to the clients. Every plan goes to the
verifier, and to the draft service whenever it is in the loop. Modes: psd (batch A drafts while batch B is
verified, then they swap; one batch empty degenerates to standard SD); sd (one batch, a draft step then a verify
step; fused into one plan where the verifier drafts itself); ar, or the draft service lost (without a stand-in
on the verifier) or paused by auto (every sequence verified every step, without drafts); auto (psd drafting the
k in 1..k that `adaptive_k` expects to pay best, pausing drafting while the recent mean accepted length is under
`auto_min_tokens_per_step`, probing again after `auto_probe_steps` steps). No token is decided here: the
verifier's committed tokens are the truth, mirrored in step order. Policy changes and draft recovery first drain
the loop. Before each plan `admission` picks who starts and who is preempted (back under a new sequence id, so
late verdicts cannot touch it). A lost verifier fails every request; `verifier_supervisor` reconnects.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from minedraft.batch_manager.admission import Admission
from minedraft.batch_manager.backend import GenerationChunk, UnavailableError
from minedraft.batch_manager.config import DEFAULT_BATCHED_TOKENS, ManagerConfig
from minedraft.batch_manager.draft_budget import extra_drafts, plan_drafts
from minedraft.batch_manager.draft_supervisor import DraftSupervisor
from minedraft.batch_manager.driver_recovery import WorkerRecovery
from minedraft.batch_manager.link import WorkerLink, raise_fault
from minedraft.batch_manager.plan_k import PlanK
from minedraft.batch_manager.policy import two_batches
from minedraft.batch_manager.prompt_planner import PromptPlanner
from minedraft.batch_manager.request_streams import RequestStreams
from minedraft.batch_manager.scheduler import TwoBatchScheduler
from minedraft.batch_manager.step_observer import StepObserver
from minedraft.batch_manager.step_stats import Counters, cost_ms
from minedraft.batch_manager.verdict_logprobs import VerdictLogprobs
from minedraft.batch_manager.verifier_supervisor import VerifierSupervisor
from minedraft.core.codec import seq_spec
from minedraft.core.request import Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.structured import GrammarChecker
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import control_pb2

log = logging.getLogger(__name__)


class StepDriver(WorkerRecovery):
    """Runs the loop over one verifier link and (optionally) one draft link."""

    def __init__(self, config: ManagerConfig, tokenizer: Tokenizer, verifier: WorkerLink,
                 draft: WorkerLink | None, admission: Admission) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.verifier = verifier
        self.admission = admission
        self.draft = DraftSupervisor(draft, verifier, self, lambda: self.config)
        self.sched = TwoBatchScheduler(two_batches(config.mode), config.rebalance_threshold)
        self.requests: dict[int, Request] = {}  # running, by id (a request's id is its sequence id)
        self.streams = RequestStreams(config.stream_interval)
        self.reconnect = VerifierSupervisor(verifier, self, tokenizer.vocab_size, lambda: self.config.draft_retry_s)
        self.pending_remove: list[int] = []  # left since the last plan; the next plan frees their KV
        self.draft_adds: list[control_pb2.SeqSpec] = []  # every running sequence, for a returned draft
        self.eos_ids: frozenset[int] = frozenset()
        self.prompts = PromptPlanner()  # prefix-cache estimate and chunked prefill (prompt_planner.py)
        self.verifier_device = "cpu"  # the verifier's torch device type: the default token budget's key
        self._direct_tokens = 0
        self._grammar_checker: GrammarChecker | None = None  # structured outputs, against the tokenizer
        self.step = 0  # the next plan's step
        self.in_flight = 0  # plans the verifier has not answered yet
        self.serving = False  # the verifier's stream is up
        self.accepting = True  # False once shutting down: new requests are refused
        self.counters = Counters()
        self.observer = StepObserver()  # metrics hook (batch_manager/step_observer.py)
        self._drafted_at: dict[int, tuple[int, str]] = {}  # step -> (drafts per sequence judged, kind)
        self.k_plan = PlanK(lambda: self.sched.fused, self.sched.to_go,
                            lambda: bool(self.admission.waiting))  # the k of each plan (auto: plan_k.py)
        self._holds = 0  # drains in progress; no plan is issued while > 0
        self.fault: Callable[[Exception], None] = raise_fault  # an error handling a worker's event (Coordinator.fail)
        self._stopping = False
        self._wake = asyncio.Event()
        self._last_verify_at = 0.0

    # ----- plans out --------------------------------------------------------------------

    async def run(self) -> None:
        while not self._stopping:
            idle = not self.serving or self._holds or self.in_flight >= self.config.pipeline_depth
            work = (self.sched.seqs or self.admission.waiting or self.pending_remove or self.draft_adds
                    or self.prompts.active)
            if idle or not work:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._issue_plan()

    def drafting_now(self) -> bool:
        return self.draft.state.drafting and self.config.mode != "ar"

    def _issue_plan(self) -> None:
        cfg = self.config
        change = self.admission.plan(list(self.requests.values()), self.in_flight, cfg.k + extra_drafts(cfg),
                                     cfg.max_num_seqs)
        for req in change.preempt:
            self._preempt(req)
        self.admission.requeue(change.preempt)
        self._configure_prompts()
        for seq_id in self.prompts.take_ready():  # chunked prompts complete on both workers join the batches
            self._schedule(self.requests[seq_id])
        room = self.prompts.budget - len(self.sched.seqs) * (cfg.k + 1)
        adds = [self._start(req, room) for req in change.start]
        self.draft.state.resume_if_due(self.step)
        with_drafts = self.drafting_now()
        if with_drafts:
            self.observer.moved(len(self.sched.rebalance()))
        batches = self.sched.plan(self.step, with_drafts)
        to_draft = self.draft.sends_plans  # it gets every plan and verdict, drafting or not
        k = self.k_plan.for_plan(self.step, cfg.mode, cfg.k, with_drafts, batches.draft, batches.verify, adds,
                                 self.draft_adds, self.pending_remove, cfg.k_min)
        width, budget, floor = plan_drafts(cfg, k, len(batches.draft), self.k_plan.adaptive)  # TETRIS or fixed k
        chunks = self.prompts.chunks(len(batches.verify) * (k + 1) + self._direct_tokens)
        if chunks:
            self.k_plan.prompt_chunks(self.step)
        fields = {"step": self.step, "remove": self.pending_remove, "draft_batch": batches.draft,
                  "verify_batch": batches.verify, "k": width, "draft_budget": budget, "draft_min_prob": floor,
                  "with_drafts": with_drafts, "send_verdict": to_draft,
                  "draft_here": self.draft.drafts_here, "prefill": chunks}
        self.verifier.send(control_pb2.ControlMessage(plan=control_pb2.StepPlan(add=adds, **fields)))
        if to_draft:
            assert self.draft.link is not None
            plan = control_pb2.StepPlan(add=[*self.draft_adds, *adds], **fields)
            self.draft.link.send(control_pb2.ControlMessage(plan=plan))
            self.draft_adds = []
        kind = self.counters.count_step(with_drafts, batches.draft, batches.verify, self.sched.fused)
        self._drafted_at[self.step] = (self.k_plan.judged(self.step) if with_drafts else 0, kind)
        self.pending_remove = []
        self.in_flight += 1
        self.step += 1

    def _configure_prompts(self) -> None:
        cfg, limits = self.config, self.admission.limits
        budget = cfg.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS.get(self.verifier_device, 2048)
        self.prompts.configure(cfg.enable_prefix_caching, budget, limits.block_size, limits.block_budget)
        self._direct_tokens = 0  # prompt tokens of requests that join the batches at once, this plan

    def _start(self, req: Request, room: int) -> control_pb2.SeqSpec:
        """Onto both workers; into a batch now, or once its prompt chunks are done (prompt_planner.py). A
        preempted request resumes from prompt + output so far."""
        self.requests[req.req_id] = req
        if req.stats.admitted is None:
            req.stats.admitted = time.perf_counter()
            self.observer.request_started(req)
        joins, computed = self.prompts.start(req, room - self._direct_tokens)
        if joins:
            self._direct_tokens += computed
            self._schedule(req)
        fork = None if self.prompts.caching else self.admission.siblings.fork_source(req)
        return self.spec_of(req, fork)

    def _schedule(self, req: Request) -> None:
        self.sched.add(req.req_id, req.num_tokens, req.params.max_tokens - len(req.output_ids))

    def spec_of(self, req: Request, fork_of: int | None = None) -> control_pb2.SeqSpec:
        return seq_spec(req, self.eos_ids, fork_of, self.prompts.caching, self.prompts.reads_cache(req))

    def _preempt(self, req: Request) -> None:
        """Off both workers now (its KV is freed by the next plan); back in the queue under a new id."""
        old = req.req_id
        self.requests.pop(old, None)
        self.sched.remove(old)
        self.prompts.drop(old)
        self.pending_remove.append(old)
        self.draft_adds = [spec for spec in self.draft_adds if spec.seq_id != old]
        req.req_id = self.admission.new_id()
        self.streams.renamed(old, req.req_id)
        log.info("preempted sequence %d (%d tokens) for KV blocks; resumes as %d", old, req.num_tokens, req.req_id)

    # ----- verdicts in ------------------------------------------------------------------

    def on_verifier_event(self, event: control_pb2.WorkerEvent) -> None:
        if event.step < 0:
            self.draft.on_setup_reply("verifier", event)
            return
        if event.error:
            log.error("verifier error at step %d: %s", event.step, event.error)
        self.in_flight -= 1
        now = time.perf_counter()
        wall_ms = (now - self._last_verify_at) * 1000.0 if self._last_verify_at else 0.0
        self._last_verify_at = now
        self.counters.add_timing("verify", event.timing, wall_ms)
        self.counters.prefix_cache.add(event.prefix_cache, draft=False)
        if event.HasField("draft_prefix_cache"):
            self.counters.prefix_cache.add(event.draft_prefix_cache, draft=True)
        drafted, kind = self._drafted_at.pop(event.step, (0, "ar"))
        self.observer.verify_done(event, kind, wall_ms)
        drafted = 0 if event.data_plane_lost else drafted  # lost: the verifier judged this step without drafts
        lengths = list(event.verdicts.drafted) if drafted and event.verdicts.drafted else None  # TETRIS: per row
        self.k_plan.on_verify(event.step, drafted, list(event.verdicts.accepted), cost_ms(event.timing),
                              list(event.verdicts.seq_ids), lengths)
        self._apply_verdicts(event.verdicts, drafted, event.step, lengths)
        if event.data_plane_lost:
            self.draft.lost()
        if event.error:
            self.abort_everything(f"the verifier failed at step {event.step}: {event.error}")
        if self.draft.judge_auto(self.step, self.counters):  # auto paused drafting: it does not pay
            self.sched.restart_drafting()
        self._wake.set()

    def _apply_verdicts(self, verdicts: control_pb2.Verdicts, drafted: int, step: int,
                        lengths: list[int] | None = None) -> None:
        self.counters.add_verdicts(verdicts.counts, verdicts.accepted, drafted, lengths)
        self.observer.verdicts(drafted, verdicts.accepted)
        now = time.perf_counter()
        offset = 0
        logprobs = VerdictLogprobs(verdicts, self.requests)
        rows = lengths or [drafted] * len(verdicts.seq_ids)
        for seq_id, count, accepted, carried in zip(verdicts.seq_ids, verdicts.counts, verdicts.accepted, rows,
                                                    strict=True):
            tokens = list(verdicts.tokens[offset : offset + count])
            offset += count
            req = self.requests.get(seq_id)
            if req is None or req.finished:
                continue
            req.stats.steps += 1
            req.stats.drafted += carried
            req.stats.accepted += accepted
            kept = req.append_tokens(tokens, self.eos_ids, self.tokenizer, logprobs.of(req, tokens))
            self.observer.tokens_verified(req, kept, req.stats.note_tokens(now, step) if kept else None)
            self.sched.progress(seq_id, count)
            self.prompts.verified(req)
            self.streams.notify(req)
            if req.finished:
                self._retire(req)

    # ----- requests ---------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams, deadline: float | None = None,
                       partial: bool = True, share_prompt: str | None = None) -> AsyncIterator[GenerationChunk]:
        """Queue a request (its errors raise at the first `anext`), then stream its chunks until one carries a
        finish reason (only that one: `partial` False); closing the iterator early aborts it, as `deadline` does."""
        if not self.accepting:
            raise UnavailableError("the server is shutting down; retry (on another replica)")
        if not self.serving:
            raise UnavailableError("the verifier is not connected (starting, or lost); retry shortly")
        if params.structured is not None:
            self._grammars().check(params.structured)
        req = self.admission.submit(prompt_ids, params, self.config.k, self.config.pipeline_depth, share_prompt)
        queue = self.streams.open(req, partial)
        timer = None if deadline is None else asyncio.get_running_loop().call_at(deadline, self.abort, req, True)
        self._wake.set()
        try:
            async for chunk in self.streams.read(queue):
                yield chunk
        finally:
            if timer is not None:
                timer.cancel()
            self.streams.close(req)
            if not req.finished:
                self.abort(req)

    def _grammars(self) -> GrammarChecker:
        if self._grammar_checker is None:
            self._grammar_checker = GrammarChecker(self.tokenizer.backend.to_str(), self.tokenizer.vocab_size,
                                                   sorted(self.eos_ids))
        return self._grammar_checker

    def _retire(self, req: Request) -> None:
        """Leave both batches at once; the next plan frees its KV blocks on both workers."""
        if self.requests.pop(req.req_id, None) is not None:
            self.pending_remove.append(req.req_id)
            self.observer.request_retired(req)
        self.sched.remove(req.req_id)
        self.prompts.drop(req.req_id)
        self._wake.set()

    def abort(self, req: Request, notify: bool = False) -> None:
        """End a request now; `notify` (its deadline passed): a last chunk carries all the text it produced."""
        self.admission.withdraw(req)
        req.abort()
        if notify:
            self.streams.notify(req)
        self._retire(req)

    def abort_everything(self, error: str | None = None) -> None:
        """Every request ends now: with UnavailableError(`error`), or a last "abort" chunk (a drain's grace is over)."""
        reqs = [*self.admission.take_all_waiting(), *self.requests.values()]
        if error and reqs:
            log.error("%s; failing %d requests", error, len(reqs))
        for req in reqs:
            req.abort()
            if error:
                self.streams.fail(req, UnavailableError(f"{error}; retry the request"))
            else:
                self.streams.notify(req)
            self._retire(req)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
