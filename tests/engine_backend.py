"""GenerationBackend over the in-process LLMEngine, stepped by one background thread.

Test support: it lets the gRPC and HTTP API tests run the real API layers over a real engine
in one process (the product serves through the batch manager's coordinator instead).

The engine is not thread-safe, so exactly one thread touches it: the step thread.
Everything else talks to it through a FIFO command queue (submit, abort, wake), and
it answers through per-request asyncio queues filled with `call_soon_threadsafe`.
FIFO order is what makes an abort always land after its own submit. The thread runs
between `start()` and `close()`; use the backend as a context manager.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from minedraft.batch_manager.backend import GenerationChunk, QueueFullError
from minedraft.core.request import Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.validation import validate_request
from minedraft.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class _Handle:
    """One API request as the step thread sees it; `queue` lives on the caller's event loop."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[GenerationChunk | BaseException] = field(default_factory=asyncio.Queue)
    req: Request | None = None
    done: bool = False
    partial: bool = True  # False: one chunk, when the request finishes, holding all its output


@dataclass(frozen=True, slots=True)
class _Abort:
    handle: _Handle
    notify: bool = False  # the deadline passed: the stream gets a last chunk with all the text produced


class _Wake:
    """Makes the step thread re-read its flags (pause, resume, stop)."""


class RequestStream(AsyncIterator[GenerationChunk]):
    """Chunks of one request; `aclose()` before the end aborts it (the API layers always close)."""

    def __init__(self, backend: EngineBackend, handle: _Handle) -> None:
        self._backend = backend
        self._handle = handle
        self._finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self._finished:
            raise StopAsyncIteration
        item = await self._handle.queue.get()
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        if item.finish_reason is not None:
            self._finished = True
        return item

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Synchronous on purpose: safe to call from `finally` blocks of cancelled tasks."""
        if not self._finished:
            self._finished = True
            self._backend._commands.put(_Abort(self._handle))


class EngineBackend:
    """Serves an LLMEngine (ar or sd mode) to the async API layers.

    At most `max_num_seqs` requests run and `max_queue` more wait; a request beyond that is
    refused with QueueFullError at once, so overload turns into fast 429s instead of latency.
    """

    def __init__(self, engine: LLMEngine, model_name: str = "minedraft", max_queue: int = 256) -> None:
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        self.engine = engine
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.max_context = engine.max_context
        self.max_queue = max_queue
        self._commands: queue.SimpleQueue[_Handle | _Abort | _Wake] = queue.SimpleQueue()
        self._handles: dict[int, _Handle] = {}  # engine req_id -> handle; step thread only
        self._lock = threading.Lock()
        self._live = 0  # accepted and not yet finished or aborted
        self._counters = {"finished": 0, "aborted": 0, "rejected": 0}
        self._paused = threading.Event()
        self._stopping = threading.Event()
        self._snapshot = self._engine_snapshot()
        self._thread: threading.Thread | None = None

    def start(self) -> EngineBackend:
        """Start the step thread; requests are refused before this and after `close()`."""
        if self._thread is not None:
            raise RuntimeError("the engine backend was already started")
        self._thread = threading.Thread(target=self._run, name="minedraft-engine", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> EngineBackend:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----- API side (event loop threads) -----

    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                 deadline: float | None = None, partial: bool = True, share_prompt: str | None = None
                 ) -> RequestStream:
        """Admit a request now; raises InvalidRequestError or QueueFullError before any chunk."""
        self._check_alive()
        validate_request(prompt_ids, params, self.max_context, self.engine.target.vocab_size)
        capacity = self.engine.config.max_num_seqs + self.max_queue
        with self._lock:
            if self._live >= capacity:
                self._counters["rejected"] += 1
                raise QueueFullError(
                    f"server is at capacity ({self._live} requests in flight, at most "
                    f"{self.engine.config.max_num_seqs} running and {self.max_queue} waiting); retry later"
                )
            self._live += 1
        handle = _Handle(request_id, list(prompt_ids), params, asyncio.get_running_loop(), partial=partial)
        self._commands.put(handle)
        if deadline is not None:
            handle.loop.call_at(deadline, self._commands.put, _Abort(handle, notify=True))
        return RequestStream(self, handle)

    def status(self) -> dict[str, object]:
        with self._lock:
            live, counters = self._live, dict(self._counters)
        snap = self._snapshot
        running = int(snap["running"])
        return {
            **snap,
            "model": self.model_name,
            "waiting": max(live - running, 0),
            "max_num_seqs": self.engine.config.max_num_seqs,
            "max_queue": self.max_queue,
            "paused": self._paused.is_set(),
            **counters,
        }

    def pause(self) -> None:
        """Stop stepping (submits and aborts are still handled); for drains and deterministic tests."""
        self._paused.set()
        self._commands.put(_Wake())

    def resume(self) -> None:
        self._paused.clear()
        self._commands.put(_Wake())

    def close(self, timeout: float = 10.0) -> None:
        """Fail everything in flight and stop the step thread; waits for it to end."""
        self._stopping.set()
        self._commands.put(_Wake())
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"the engine step thread did not stop within {timeout} s")

    def _check_alive(self) -> None:
        if self._thread is None or self._stopping.is_set() or not self._thread.is_alive():
            raise RuntimeError("the engine backend is not running (start() it, or it was closed)")

    # ----- step thread -----

    def _run(self) -> None:
        while not self._stopping.is_set():
            idle = self._paused.is_set() or not self.engine.has_unfinished()
            self._handle_commands(block=idle)
            if not self._paused.is_set() and self.engine.has_unfinished() and not self._stopping.is_set():
                self._step()
            self._snapshot = self._engine_snapshot()
        self._handle_commands(block=False)
        for handle in list(self._handles.values()):
            self._fail(handle, RuntimeError("the engine backend was closed"))
        self._snapshot = self._engine_snapshot()

    def _handle_commands(self, block: bool) -> None:
        """Drain the command queue; when idle, sleep on it instead of spinning."""
        try:
            cmd = self._commands.get(block=block)
        except queue.Empty:
            return
        while True:
            if isinstance(cmd, _Handle):
                self._submit(cmd)
            elif isinstance(cmd, _Abort):
                self._abort(cmd.handle, cmd.notify)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _submit(self, handle: _Handle) -> None:
        try:
            handle.req = self.engine.add_request(handle.prompt_ids, handle.params)
        except Exception as exc:  # delivered to the caller as its first item
            self._retire(handle, aborted=False)
            self._deliver(handle, exc)
            return
        self._handles[handle.req.req_id] = handle

    def _abort(self, handle: _Handle, notify: bool = False) -> None:
        if handle.done:
            return
        if handle.req is not None:
            self.engine.abort(handle.req.req_id)
            self._handles.pop(handle.req.req_id, None)
            chunk = GenerationChunk.take_from(handle.req) if notify else None
            if chunk is not None:
                self._deliver(handle, chunk)
        self._retire(handle, aborted=True)

    def _step(self) -> None:
        try:
            advanced = self.engine.step()
        except Exception as exc:  # a bug or OOM must not hang every client
            log.exception("engine step failed; failing all requests in flight")
            for handle in list(self._handles.values()):
                self._fail(handle, RuntimeError(f"engine step failed: {exc}"))
            return
        for req in advanced:
            handle = self._handles.get(req.req_id)
            if handle is not None:
                self._emit(handle, req)

    def _emit(self, handle: _Handle, req: Request) -> None:
        if not (handle.partial or req.finished):
            return
        chunk = GenerationChunk.take_from(req)
        if chunk is None:
            return
        if req.finished:
            self._handles.pop(req.req_id, None)
            self._retire(handle, aborted=False)
        if not self._deliver(handle, chunk) and not req.finished:
            self._abort(handle)  # the caller's event loop is gone

    def _fail(self, handle: _Handle, exc: BaseException) -> None:
        self._abort(handle)
        self._deliver(handle, exc)

    def _retire(self, handle: _Handle, aborted: bool) -> None:
        handle.done = True
        with self._lock:
            self._live -= 1
            self._counters["aborted" if aborted else "finished"] += 1

    @staticmethod
    def _deliver(handle: _Handle, item: GenerationChunk | BaseException) -> bool:
        try:
            handle.loop.call_soon_threadsafe(handle.queue.put_nowait, item)
        except RuntimeError:  # loop closed
            return False
        return True

    def _engine_snapshot(self) -> dict[str, Any]:
        engine = self.engine
        snap: dict[str, Any] = {
            "mode": engine.config.mode,
            "running": len(engine.running),
            "engine_waiting": len(engine.waiting),
            "steps": engine.total_steps,
            "kv_free_blocks": engine.target.runner.allocator.num_free,
            "kv_total_blocks": engine.target.runner.allocator.num_blocks,
        }
        if engine.draft is not None:
            snap["draft_kv_free_blocks"] = engine.draft.runner.allocator.num_free
            snap["draft_kv_total_blocks"] = engine.draft.runner.allocator.num_blocks
        return snap


def all_kv_free(status: dict[str, object]) -> bool:
    """True when no KV block is held on any model (used by tests and drains)."""
    pairs = [("kv_free_blocks", "kv_total_blocks"), ("draft_kv_free_blocks", "draft_kv_total_blocks")]
    return all(status.get(free) == status.get(total) for free, total in pairs)
