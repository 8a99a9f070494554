"""What the step loop reports as it runs, and the Prometheus recording of it.

The loop calls one observer at a handful of points (a request starts, tokens are verified, a
request leaves, a step's verdicts and timings arrive). The base class ignores everything, so
the loop and its unit tests need no metrics; `MetricsObserver` turns the calls into the
`ServingMetrics` families.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from minedraft.batch_manager.step_stats import busy_ms
from minedraft.core.request import Request
from minedraft.observability.metrics import ServingMetrics
from minedraft.proto import control_pb2

PAIRING_WINDOW = 16  # steps a draft or verify timing waits for its other half before it is dropped


class StepObserver:
    """No-op observer: the loop's default."""

    def request_started(self, req: Request) -> None:
        """`req` left the queue for a batch (its stats.admitted is set)."""

    def tokens_verified(self, req: Request, count: int, gap_s: float | None) -> None:
        """`count` tokens joined `req`'s output; `gap_s` is the time since its previous ones (None: first)."""

    def request_retired(self, req: Request) -> None:
        """`req` finished (any reason) and left the loop."""

    def verdicts(self, drafted_per_seq: int, accepted: Sequence[int]) -> None:
        """One verify step judged `drafted_per_seq` drafts per sequence (0: autoregressive)."""

    def verify_done(self, event: control_pb2.WorkerEvent, kind: str, wall_ms: float) -> None:
        """The verifier answered step `event.step`, a `kind` step (psd | sd | ar)."""

    def draft_done(self, event: control_pb2.WorkerEvent) -> None:
        """The draft service finished its part of step `event.step`."""

    def moved(self, count: int) -> None:
        """Rebalancing moved `count` sequences between the batches."""

    def fell_back(self) -> None:
        """The draft service was lost: plain decoding until it returns."""


class MetricsObserver(StepObserver):
    """Records the loop's events into `ServingMetrics`; pairs each step's draft and verify halves."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self.metrics = metrics
        self._verify: dict[int, tuple[control_pb2.StepTiming, str, float]] = {}
        self._draft: dict[int, control_pb2.StepTiming] = {}

    def request_started(self, req: Request) -> None:
        if req.stats.admitted is not None:
            self.metrics.request_admitted(req.stats.admitted - req.stats.started)

    def tokens_verified(self, req: Request, count: int, gap_s: float | None) -> None:
        if not count:
            return
        if gap_s is None and req.stats.first_token is not None:
            self.metrics.first_token(req.stats.first_token - req.stats.started)
        self.metrics.tokens_streamed(count, gap_s)

    def request_retired(self, req: Request) -> None:
        s = req.stats
        end = s.finished if s.finished is not None else time.perf_counter()
        decode = s.last_token - s.first_token if s.first_token is not None and s.last_token is not None else None
        self.metrics.request_finished(req.finish_reason or "abort", len(req.prompt_ids), len(req.output_ids),
                                      end - s.started, decode)

    def verdicts(self, drafted_per_seq: int, accepted: Sequence[int]) -> None:
        self.metrics.verdicts(drafted_per_seq, accepted)

    def verify_done(self, event: control_pb2.WorkerEvent, kind: str, wall_ms: float) -> None:
        self.metrics.prefix_cache(event.prefix_cache.queries, event.prefix_cache.hits, draft=False)
        if event.HasField("draft_prefix_cache"):  # a colocated draft model's cache, inside the verifier
            self.metrics.prefix_cache(event.draft_prefix_cache.queries, event.draft_prefix_cache.hits, draft=True)
        if kind == "ar" or event.step in self._draft:
            self._record(event.step, event.timing, kind, wall_ms, self._draft.pop(event.step, None))
        else:
            self._verify[event.step] = (event.timing, kind, wall_ms)
        self._forget_before(event.step - PAIRING_WINDOW)

    def draft_done(self, event: control_pb2.WorkerEvent) -> None:
        self.metrics.prefix_cache(event.prefix_cache.queries, event.prefix_cache.hits, draft=True)
        waiting = self._verify.pop(event.step, None)
        if waiting is None:
            self._draft[event.step] = event.timing
            return
        timing, kind, wall_ms = waiting
        self._record(event.step, timing, kind, wall_ms, event.timing)

    def moved(self, count: int) -> None:
        self.metrics.moved(count)

    def fell_back(self) -> None:
        self.metrics.fell_back()

    def _record(self, step: int, verify: control_pb2.StepTiming, kind: str, wall_ms: float,
                draft: control_pb2.StepTiming | None) -> None:
        data_plane_ms = verify.send_ms + (draft.send_ms if draft is not None else 0.0)
        self.metrics.step(kind, wall_ms / 1000.0, busy_ms(verify) / 1000.0,
                          busy_ms(draft) / 1000.0 if draft is not None else None, data_plane_ms / 1000.0)

    def _forget_before(self, step: int) -> None:
        """Halves whose partner never came (a lost draft service, an AR step with a stray draft event)."""
        for pending in (self._verify, self._draft):
            for old in [s for s in pending if s < step]:
                del pending[old]
