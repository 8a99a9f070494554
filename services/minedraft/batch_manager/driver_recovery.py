"""The step loop's side of drains and lost workers: holding plans, a draft service leaving or returning, a
verifier lost and reconnected. A mixin of StepDriver (step_driver.py), which owns the state it touches."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from minedraft.batch_manager.step_stats import cost_ms
from minedraft.proto import control_pb2


class WorkerRecovery:
    """Drains and worker changes, for StepDriver, which sets every attribute named here."""

    _holds: int
    in_flight: int
    _stopping: bool
    _wake: Any
    counters: Any
    observer: Any
    sched: Any
    draft: Any
    config: Any
    requests: dict[int, Any]
    draft_adds: list[control_pb2.SeqSpec]
    prompts: Any
    k_plan: Any
    serving: bool
    _drafted_at: dict[int, Any]
    pending_remove: list[int]
    admission: Any
    reconnect: Any

    spec_of: Callable[..., control_pb2.SeqSpec]
    abort_everything: Callable[..., None]

    @asynccontextmanager
    async def draining(self) -> AsyncIterator[None]:
        """No new plan while held; entered once the verifier has answered every issued plan."""
        self._holds += 1
        try:
            while self.in_flight > 0 and not self._stopping:
                self._wake.clear()
                await self._wake.wait()
            yield
        finally:
            self._holds -= 1
            self._wake.set()

    def draft_left(self) -> None:
        self.counters.fallbacks += 1
        self.observer.fell_back()
        self.sched.use_two_batches(self.draft.two_batches(self.config.mode))  # a stand-in verifier: fused SD
        self.sched.restart_drafting()
        self._wake.set()

    def draft_back(self) -> None:
        """A (restarted) draft service joins: it gets every running sequence, with an empty prefix cache."""
        self.draft_adds = [self.spec_of(req) for req in self.requests.values()]
        self.prompts.caches_lost()
        self.sched.use_two_batches(self.draft.two_batches(self.config.mode))
        self.sched.restart_drafting()
        self.counters.recoveries += 1

    def draft_step_done(self, event: control_pb2.WorkerEvent) -> None:
        self.counters.add_timing("draft", event.timing)
        self.counters.prefix_cache.add(event.prefix_cache, draft=True)
        self.k_plan.on_draft(event.step, cost_ms(event.timing), event.timing.batch)
        self.observer.draft_done(event)

    def on_verifier_lost(self) -> None:
        """The verifier's stream ended (process died, network): fail fast, then reconnect."""
        self.serving = False
        self.in_flight = 0
        self._drafted_at.clear()
        self.abort_everything("the verifier was lost (its process ended or its connection broke)")
        self.k_plan.forget(self.pending_remove)  # no plan will carry these removals: the new verifier never had them
        self.pending_remove = []
        self.admission.in_use = 0
        self.prompts.caches_lost()
        self.draft.verifier_lost()
        if not self._stopping:
            self.reconnect.lost()
        self._wake.set()

    def verifier_back(self, info: control_pb2.WorkerInfo) -> None:
        """A fresh stream to a (restarted) verifier: it holds no sequence, nothing is in flight."""
        self.admission.limits.fit(info.num_blocks, info.max_context)
        self.pending_remove = []
        self.serving = True
        self._wake.set()



