"""Counters and step anatomy the batch manager keeps for /health, metrics and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from minedraft.batch_manager.prefix_stats import PrefixCacheCounters
from minedraft.proto import control_pb2


def busy_ms(timing: control_pb2.StepTiming) -> float:
    """How long the worker's device computed this step: its GPU time where the worker measured one
    (a verify launched ahead is queued long before it runs, so its host clock says little), else the
    host time of the compute."""
    return timing.device_ms or timing.compute_ms


def cost_ms(timing: control_pb2.StepTiming) -> float | None:
    """What this step says a step of its shape costs: None when it captured a CUDA graph (tens of ms
    that its shape will not pay again)."""
    return None if timing.graph_capture_ms > 0 else busy_ms(timing)


AUTO_MIN_SAMPLES = 32  # speculative verifies auto mode needs before judging


@dataclass(slots=True)
class Counters:
    """Totals since start, plus the recent speculative yield that auto mode decides on."""

    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    seq_verifies: int = 0
    fallbacks: int = 0
    psd_steps: int = 0
    sd_steps: int = 0
    ar_steps: int = 0
    recoveries: int = 0
    timing: dict[str, float] = field(default_factory=dict)
    recent_tokens_per_seq: float = 0.0  # moving average over speculative verifies only (auto mode)
    recent_samples: int = 0
    prefix_cache: PrefixCacheCounters = field(default_factory=PrefixCacheCounters)  # both models' caches

    def note_speculative_tokens(self, count: int) -> None:
        self.recent_samples += 1
        weight = max(1.0 / self.recent_samples, 0.05)
        self.recent_tokens_per_seq += weight * (count - self.recent_tokens_per_seq)

    def add_verdicts(self, counts: Sequence[int], accepted: Sequence[int], drafted: int,
                     lengths: Sequence[int] | None = None) -> None:
        """One verify step's totals; `drafted` is the drafts each sequence carried (0: AR), `lengths` the
        drafts each verified when TETRIS selected them."""
        self.tokens += sum(counts)
        self.seq_verifies += len(counts)
        self.drafted += drafted * len(counts) if lengths is None else sum(lengths)
        self.accepted += sum(accepted)
        if drafted:
            for count in counts:
                self.note_speculative_tokens(count)

    def count_step(self, with_drafts: bool, draft: Sequence[int], verify: Sequence[int], fused: bool = False) -> str:
        """One issued plan, by kind: psd (both batches busy), sd (one of them, or one batch fused) or ar;
        returns the kind."""
        if not with_drafts:
            self.ar_steps += bool(verify)
            return "ar"
        if draft and verify and not fused:
            self.psd_steps += 1
            return "psd"
        self.sd_steps += bool(draft or verify)
        return "sd"

    def drafting_does_not_pay(self, min_tokens_per_step: float) -> bool:
        """auto mode's judgement: enough recent speculative verifies, yielding too few tokens each."""
        return self.recent_samples >= AUTO_MIN_SAMPLES and self.recent_tokens_per_seq < min_tokens_per_step

    def reset_recent(self) -> None:
        self.recent_tokens_per_seq = 0.0
        self.recent_samples = 0

    def add_timing(self, side: str, timing: control_pb2.StepTiming, wall_ms: float = 0.0) -> None:
        """Running sums of the step anatomy; clients difference two snapshots."""
        t = self.timing
        if side == "verify":
            t["steps"] = t.get("steps", 0) + 1
            t["wall_ms"] = t.get("wall_ms", 0.0) + wall_ms
        # Plans that gave this side a batch: in sequential SD every other plan leaves a side idle, so a
        # per-plan mean halves its busy time; time per *batch* divides by this count instead.
        t[f"{side}_busy_steps"] = t.get(f"{side}_busy_steps", 0) + (timing.batch > 0)
        t[f"{side}_busy_ms"] = t.get(f"{side}_busy_ms", 0.0) + busy_ms(timing)
        for name in ("compute_ms", "recv_wait_ms", "send_ms", "control_ms", "plan_wait_ms", "plan_queued_ms",
                     "graph_capture_ms"):
            key = f"{side}_{name}"
            t[key] = t.get(key, 0.0) + getattr(timing, name)
