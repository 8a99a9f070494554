"""Prefix-cache totals of both models, from the per-step counts the workers report.

Workers send what one step did (queries, hits, prefill tokens, evictions) and how their cache looks after
it (cached and free blocks); the batch manager sums the first and keeps the latest of the second, so
/health can show a hit rate since start without a worker keeping totals across its own restarts.
Counts are tokens, as vLLM's: a lookup queries the sequence's whole length and hits the tokens it found.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minedraft.proto import control_pb2


@dataclass(slots=True)
class CacheTotals:
    """One model's cache: sums of the step counts, and the gauges of the latest step."""

    queries: int = 0
    hits: int = 0
    prefill_tokens: int = 0
    evictions: int = 0
    cached_blocks: int = 0
    free_blocks: int = 0

    def add(self, stats: control_pb2.PrefixCacheStats) -> None:
        self.queries += stats.queries
        self.hits += stats.hits
        self.prefill_tokens += stats.prefill_tokens
        self.evictions += stats.evictions
        self.cached_blocks = stats.cached_blocks
        self.free_blocks = stats.free_blocks

    def snapshot(self) -> dict[str, object]:
        return {
            "queries": self.queries,
            "hits": self.hits,
            "hit_rate": round(self.hits / self.queries, 4) if self.queries else 0.0,
            "cached_blocks": self.cached_blocks,
            "free_blocks": self.free_blocks,
            "prefill_tokens": self.prefill_tokens,
            "evictions": self.evictions,
        }


@dataclass(slots=True)
class PrefixCacheCounters:
    """The target's cache (the verifier's model) and the draft's (the draft service's, or a colocated draft
    model's inside the verifier), kept apart since each side may hit a different prefix."""

    target: CacheTotals = field(default_factory=CacheTotals)
    draft: CacheTotals = field(default_factory=CacheTotals)

    def add(self, stats: control_pb2.PrefixCacheStats, draft: bool) -> None:
        """One worker step's report; `draft` says which model's cache it describes."""
        (self.draft if draft else self.target).add(stats)

    def snapshot(self) -> dict[str, object]:
        return {"target": self.target.snapshot(), "draft": self.draft.snapshot()}
