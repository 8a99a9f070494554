"""Admission and KV accounting: which requests start, and which give way when memory runs out.

KV blocks are counted the way vLLM allocates them, as sequences grow, not reserved for a
request's worst case up front (which let a few long requests hold the whole cache while
short ones waited). Before every plan the batch manager bounds what each running sequence
can occupy on either worker while that plan runs: its committed tokens, plus k+1 for every
plan in flight that may have verified it, plus the k look-ahead slots of this plan. When the
sum would not fit the cache, the lowest-priority (highest `priority` number), newest sequences are
preempted: they leave both workers and go back to the queue at their arrival place, to be
recomputed from prompt + output when memory frees up (greedy output is unchanged; the tokens
already streamed are not sent again). Requests start by (priority, arrival), vLLM's priority
policy (all at the default priority: arrival order, preempted ones first), while their prompt
plus one step of growth for every running sequence fits; n > 1 siblings wait in their place
while one of them computes their shared prompt (siblings.py). Shared prompt blocks are counted as
each sibling's own: a worker may not have shared them, so the bound stays safe. A request that
could not fit the cache even alone is refused when it arrives; a full queue is refused with
QueueFullError (429).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from minedraft.batch_manager.backend import QueueFullError
from minedraft.batch_manager.siblings import Siblings
from minedraft.core.errors import InvalidRequestError
from minedraft.core.request import Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.validation import validate_request


@dataclass(slots=True)
class KvLimits:
    """What both workers can hold: the smaller of the two caches and contexts."""

    max_context: int = 0
    vocab_size: int = 0
    block_budget: int = 0
    block_size: int = 16

    def fit(self, num_blocks: int, max_context: int) -> None:
        """Shrink to what a (re)connected worker can hold."""
        self.block_budget = min(self.block_budget, num_blocks)
        self.max_context = min(self.max_context, max_context)


@dataclass(slots=True)
class AdmissionPlan:
    """What the next plan changes: sequences to preempt (newest first) and requests to start."""

    preempt: list[Request] = field(default_factory=list)
    start: list[Request] = field(default_factory=list)


def queue_key(req: Request) -> tuple[int, float]:
    """Scheduling order: lower priority number first, then arrival (a preempted request keeps its own)."""
    return req.params.priority, req.stats.started


class Admission:
    """The waiting queue and the KV blocks the running sequences may occupy at the next step."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.limits = KvLimits()
        self.waiting: deque[Request] = deque()
        self.in_use = 0  # the bound at the last plan: blocks the running sequences may occupy
        self.preemptions = 0
        self.siblings = Siblings()
        self._ids = itertools.count(1)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.limits.block_size)

    def worst_case_blocks(self, prompt_len: int, max_tokens: int, k: int, pipeline_depth: int) -> int:
        """Blocks one request may need running alone to its end (plans in flight verify beyond it)."""
        return self.blocks_for(prompt_len + max_tokens + pipeline_depth * (k + 1))

    def new_id(self) -> int:
        """A sequence id no worker has seen (a preempted request comes back under a new one)."""
        return next(self._ids)

    def submit(self, prompt_ids: list[int], params: SamplingParams, k: int, pipeline_depth: int,
               share_prompt: str | None = None) -> Request:
        """Check a new request and queue it (`share_prompt`: its siblings' key); raises InvalidRequestError or
        QueueFullError."""
        lim = self.limits
        validate_request(prompt_ids, params, lim.max_context, lim.vocab_size)
        if self.worst_case_blocks(len(prompt_ids), params.max_tokens, k, pipeline_depth) > lim.block_budget:
            raise InvalidRequestError("request needs more KV memory than the whole cache; lower max_tokens",
                                      param="max_tokens")
        if len(self.waiting) >= self.max_queue:
            raise QueueFullError(f"{len(self.waiting)} requests are already waiting; retry later")
        params.resolved_seed()
        req = Request(self.new_id(), list(prompt_ids), params)
        self._enqueue(req)
        self.siblings.join(req, share_prompt)
        return req

    def _enqueue(self, req: Request) -> None:
        """Into the queue behind every request that goes before it (a scan from the back: arrivals are newest)."""
        key = queue_key(req)
        at = len(self.waiting)
        while at > 0 and queue_key(self.waiting[at - 1]) > key:
            at -= 1
        self.waiting.insert(at, req)

    def plan(self, running: list[Request], in_flight: int, k: int, max_num_seqs: int) -> AdmissionPlan:
        """Who leaves and who starts so that the next plan fits the cache on both workers.

        `running` are the sequences in the batches, `in_flight` the plans the verifier has not
        answered (each may have grown every sequence by k + 1 tokens unseen here). Held siblings keep
        their place in the queue while those behind them may start.
        """
        self.siblings.refresh(running)
        growth = in_flight * (k + 1) + k
        held = {id(r): self.blocks_for(r.num_tokens + growth) for r in running}
        total = sum(held.values())
        out = AdmissionPlan()
        by_age = sorted(running, key=queue_key)
        while total > self.limits.block_budget and len(by_age) > 1:
            victim = by_age.pop()
            out.preempt.append(victim)
            total -= held[id(victim)]
        if not out.preempt:  # a plan that preempts starts nothing: what left would come straight back
            step_growth = self.blocks_for(k + 1)
            count = len(running)
            at = 0
            while at < len(self.waiting) and count < max_num_seqs:
                req = self.waiting[at]
                if self.siblings.held(req):
                    at += 1
                    continue
                need = self.blocks_for(req.num_tokens + k)
                headroom = (count + 1) * step_growth if count else 0
                if total + need + headroom > self.limits.block_budget:
                    break
                del self.waiting[at]
                self.siblings.starting(req)
                out.start.append(req)
                total += need
                count += 1
        self.in_use = total
        return out

    def requeue(self, preempted: list[Request]) -> None:
        """Preempted requests go back to the queue at their arrival place (ahead of later arrivals of their
        priority)."""
        for req in preempted:
            self._enqueue(req)
        self.preemptions += len(preempted)

    def withdraw(self, req: Request) -> bool:
        """Take a request out of the queue before it started; False when it was not waiting."""
        for i, queued in enumerate(self.waiting):
            if queued is req:
                del self.waiting[i]
                return True
        return False

    def take_all_waiting(self) -> list[Request]:
        waiting, self.waiting = list(self.waiting), deque()
        return waiting

    @property
    def reserved_blocks(self) -> int:
        """Blocks the running sequences may occupy (an upper bound), for /health and metrics."""
        return self.in_use
