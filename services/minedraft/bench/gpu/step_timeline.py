"""Where an engine step's time goes on the GPU's timeline, from a torch.profiler trace.

Three answers per step, averaged over the traced steps:
- the kernels by kind (GEMMs, attention, its split merge, norms, rope + KV store, ...): time and count;
- the gaps between consecutive kernels: short ones (under `SHORT_GAP_US`, the cost of a kernel boundary
  inside a graph or a stream of queued launches) and long ones, where the GPU waited for the host;
- for the long gaps, which host phase was running while the GPU waited (the innermost "phase:" range of
  `step_trace.py`'s hooks at each microsecond of the gap): the host work still on the critical path.

Pure bookkeeping over the trace's events ("X" events with ts/dur in microseconds), so it is tested on
hand-made timelines (tests/test_step_timeline.py).
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

SHORT_GAP_US = 8.0
PHASE_PREFIX = "phase:"
KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

# (kind, name fragments), first match wins; names are compared lower-cased.
KERNEL_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention merge", ("_merge_splits",)),
    ("attention", ("_paged_attention", "flash", "attention")),
    ("norm", ("_add_rms_norm", "rms_norm")),
    ("rope + KV store", ("_rope_store", "_write_kv")),
    ("silu*up", ("_silu_mul",)),
    ("fp8 gemm", ("_fp8_gemm", "_quant_groups", "_quant_rows", "_sum_chunks")),
    ("gemm", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk", "sm90_")),
    ("copies", ("memcpy", "memset", "copy")),
    ("sampling", ("argmax", "argmin", "max", "softmax", "sort", "topk", "exponential", "multinomial", "cumsum",
                  "scatter", "gather", "index")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, fragments in KERNEL_KINDS:
        if any(f in low for f in fragments):
            return kind
    return "other"


@dataclass(slots=True)
class Timeline:
    """Per-step averages of one traced block of steps."""

    steps: int
    wall_us: float = 0.0  # first kernel's start to the last kernel's end
    busy_us: float = 0.0  # union of kernel intervals
    kernels: int = 0
    by_kind_us: dict[str, float] = field(default_factory=dict)
    by_kind_count: dict[str, float] = field(default_factory=dict)
    short_gaps_us: float = 0.0
    short_gaps: float = 0.0
    long_gaps_us: float = 0.0
    waited_on: dict[str, float] = field(default_factory=dict)  # host phase -> us of long gaps per step
    top_other: list[tuple[str, float]] = field(default_factory=list)
    long_gaps: float = 0.0  # how many per step
    largest: list[tuple[float, str]] = field(default_factory=list)  # the longest gaps: us, the host's phases then

    def as_dict(self) -> dict:
        ms = 1000.0
        return {"steps": self.steps, "wall_ms": self.wall_us / ms, "busy_ms": self.busy_us / ms,
                "kernels": self.kernels, "by_kind_ms": {k: v / ms for k, v in self.by_kind_us.items()},
                "by_kind_count": self.by_kind_count, "short_gaps_ms": self.short_gaps_us / ms,
                "short_gaps": self.short_gaps, "long_gaps_ms": self.long_gaps_us / ms,
                "waited_on_ms": {k: v / ms for k, v in self.waited_on.items()},
                "top_other_ms": [(n, v / ms) for n, v in self.top_other], "long_gaps": self.long_gaps,
                "largest_gaps_us": self.largest}


def merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class PhaseIndex:
    """The innermost host phase at a time: among the ranges covering it, the one that began last."""

    def __init__(self, ranges: list[tuple[float, float, str]]) -> None:
        self.ranges = sorted(ranges)
        self.starts = [r[0] for r in self.ranges]

    def stack(self, t: float) -> list[str]:
        """Every phase open at t, outermost first."""
        return [name for start, end, name in self.ranges[: bisect.bisect_right(self.starts, t)] if end > t]

    def at(self, t: float) -> str | None:
        for i in range(bisect.bisect_right(self.starts, t) - 1, -1, -1):
            start, end, name = self.ranges[i]
            if end > t:
                return name
            if t - start > 1e6:  # a range begun a second earlier does not cover a step's gap
                break
        return None


def summarize(events: list[dict], steps: int, step_us: float = 1.0) -> Timeline:
    """The kernels (and copies) of `events` as one block of `steps` steps; host "phase:" ranges name the
    host work during each long gap, sampled every `step_us`."""
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL_CATEGORIES]
    phases = PhaseIndex([(e["ts"], e["ts"] + e["dur"], e["name"][len(PHASE_PREFIX):]) for e in events
                         if e.get("ph") == "X" and str(e.get("name", "")).startswith(PHASE_PREFIX)])
    timeline = Timeline(steps=steps)
    if not kernels or steps <= 0:
        return timeline
    spans = merged((e["ts"], e["ts"] + e["dur"]) for e in kernels)
    timeline.wall_us = (spans[-1][1] - spans[0][0]) / steps
    timeline.busy_us = sum(b - a for a, b in spans) / steps
    timeline.kernels = round(len(kernels) / steps)
    time_by: dict[str, float] = defaultdict(float)
    count_by: dict[str, float] = defaultdict(float)
    other: dict[str, float] = defaultdict(float)
    for e in kernels:
        kind = kernel_kind(e["name"])
        time_by[kind] += e["dur"] / steps
        count_by[kind] += 1 / steps
        if kind == "other":
            other[e["name"]] += e["dur"] / steps
    timeline.by_kind_us, timeline.by_kind_count = dict(time_by), dict(count_by)
    timeline.top_other = sorted(other.items(), key=lambda kv: -kv[1])[:5]
    waited: dict[str, float] = defaultdict(float)
    gaps: list[tuple[float, str]] = []
    for (_, end), (start, _) in itertools.pairwise(spans):
        gap = start - end
        if gap < SHORT_GAP_US:
            timeline.short_gaps_us += gap / steps
            timeline.short_gaps += 1 / steps
            continue
        timeline.long_gaps_us += gap / steps
        timeline.long_gaps += 1 / steps
        gaps.append((gap, " > ".join(phases.stack(end + gap / 2)) or "unnamed"))
        t = end
        while t < start:
            width = min(step_us, start - t)
            waited[phases.at(t + width / 2) or "unnamed"] += width / steps
            t += width
    timeline.largest = sorted(gaps, reverse=True)[:8]
    timeline.waited_on = dict(sorted(waited.items(), key=lambda kv: -kv[1]))
    return timeline
