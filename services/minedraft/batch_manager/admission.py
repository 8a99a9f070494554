"""Admission and KV reservation: which requests may start, and what memory each one holds.

A request is checked when it arrives (it must fit the context and, on its own, the whole
KV cache) and waits in FIFO order until the running batch has room and its worst case
(prompt + max_tokens + k + 1 look-ahead slots) fits next to what running requests
reserved. The reservation is released when the request leaves, so neither worker can run
out of blocks mid-generation.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from minedraft.batch_manager.backend import QueueFullError
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


class Admission:
    """The waiting queue and the KV blocks reserved by running requests."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.limits = KvLimits()
        self.waiting: deque[Request] = deque()
        self.reserved: dict[int, int] = {}  # req_id -> blocks
        self._ids = itertools.count(1)

    def blocks_needed(self, prompt_len: int, max_tokens: int, k: int) -> int:
        return -(-(prompt_len + max_tokens + k + 1) // self.limits.block_size)

    def submit(self, prompt_ids: list[int], params: SamplingParams, k: int) -> Request:
        """Check a new request and queue it; raises InvalidRequestError or QueueFullError."""
        lim = self.limits
        validate_request(prompt_ids, params, lim.max_context, lim.vocab_size)
        if self.blocks_needed(len(prompt_ids), params.max_tokens, k) > lim.block_budget:
            raise InvalidRequestError("request needs more KV memory than the whole cache; lower max_tokens")
        if len(self.waiting) >= self.max_queue:
            raise QueueFullError(f"{len(self.waiting)} requests are already waiting; retry later")
        params.resolved_seed()
        req = Request(next(self._ids), list(prompt_ids), params)
        self.waiting.append(req)
        return req

    def admit(self, running: int, max_num_seqs: int, k: int) -> list[Request]:
        """Waiting requests that start now, in arrival order, each with its blocks reserved."""
        started: list[Request] = []
        total = self.reserved_blocks
        while self.waiting and running + len(started) < max_num_seqs:
            req = self.waiting[0]
            need = self.blocks_needed(len(req.prompt_ids), req.params.max_tokens, k)
            if total + need > self.limits.block_budget:
                break
            self.waiting.popleft()
            total += need
            self.reserved[req.req_id] = need
            started.append(req)
        return started

    def release(self, req_id: int) -> None:
        self.reserved.pop(req_id, None)

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
        return sum(self.reserved.values())
