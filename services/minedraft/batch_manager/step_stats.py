"""Counters and step anatomy the batch manager keeps for /health, metrics and benchmarks."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minedraft.proto import control_pb2


@dataclass(slots=True)
class StepRecord:
    """What one step cost, as the two workers measured it."""

    step: int
    with_drafts: bool
    verify: control_pb2.StepTiming | None = None
    wall_ms: float = 0.0


@dataclass(slots=True)
class Counters:
    steps: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    seq_verifies: int = 0
    fallbacks: int = 0
    psd_steps: int = 0
    sd_steps: int = 0
    ar_steps: int = 0
    recoveries: int = 0
    records: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=4096))
    timing: dict[str, float] = field(default_factory=dict)

    def add_timing(self, side: str, timing: control_pb2.StepTiming, wall_ms: float = 0.0) -> None:
        """Running sums of the step anatomy; clients difference two snapshots."""
        t = self.timing
        if side == "verify":
            t["steps"] = t.get("steps", 0) + 1
            t["wall_ms"] = t.get("wall_ms", 0.0) + wall_ms
        for name in ("compute_ms", "recv_wait_ms", "send_ms", "control_ms"):
            key = f"{side}_{name}"
            t[key] = t.get(key, 0.0) + getattr(timing, name)
