"""`python -m minedraft.bench.control_trace_report FOLDER [--depth 2]`: where a plan's round trip goes.

Reads the files MINEDRAFT_CONTROL_TRACE wrote (observability/control_trace.py). At pipeline depth d the
batch manager issues plan s + d when the verifier's event for step s comes in, so for each steady step s
it follows that chain: the verifier ends s, its gRPC handler sends the event, the manager takes it in and
queues plan s + d, gRPC writes it, the verifier's inbox takes it; then the plan waits until its step
begins. A plan that arrives after the step before it ended shows as a gap between steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

Marks = dict[str, dict[int, int]]  # point -> step -> ns

# (label, from point, its step, to point, its step): a step is 0 (step s), 1 (s + 1) or "d" (s + depth)
PARTS = (
    ("step (begin -> end)", "begin", 0, "end", 0),
    ("event to gRPC handler", "end", 0, "out", 0),
    ("handler to manager", "out", 0, "verdict", 0),
    ("manager: event -> next plan", "verdict", 0, "plan", "d"),
    ("plan to gRPC write", "plan", "d", "write", "d"),
    ("gRPC write to worker inbox", "write", "d", "arrive", "d"),
    ("round trip (end -> next plan in)", "end", 0, "arrive", "d"),
    ("plan queued (in -> its step)", "arrive", "d", "begin", "d"),
    ("gap between steps", "end", 0, "begin", 1),
)


def load(folder: Path) -> Marks:
    """The verifier's marks and the manager's, by point and step (the first of each: a step's own)."""
    marks: Marks = defaultdict(dict)
    for path in sorted(folder.glob("*.txt")):
        role = path.name.rsplit("-", 1)[0]
        if role not in ("verifier", "manager"):
            continue
        for line in path.read_text(encoding="ascii").splitlines():
            point, step, ns = line.split()
            marks[point].setdefault(int(step), int(ns))
    return marks


def breakdown(marks: Marks, depth: int = 2, skip: int = 5, steps: range | None = None) -> dict[str, list[float]]:
    """Milliseconds of each part, per step that has every mark; only `steps` when given (one cell of a
    run), less their first `skip` (they warm up)."""
    parts: dict[str, list[float]] = {label: [] for label, *_ in PARTS}
    steps_run = sorted(s for s in marks.get("begin", {}) if steps is None or s in steps)[skip:]
    for s in steps_run:
        spans = []
        for label, a, a_step, b, b_step in PARTS:
            first = marks.get(a, {}).get(s + (depth if a_step == "d" else int(a_step)))
            second = marks.get(b, {}).get(s + (depth if b_step == "d" else int(b_step)))
            if first is None or second is None:
                break
            spans.append((label, (second - first) / 1e6))
        else:
            for label, ms in spans:
                parts[label].append(ms)
    return parts


def render(parts: dict[str, list[float]]) -> str:
    lines = [f"{'part':36s} {'median':>8s} {'p10':>8s} {'p90':>8s}  (ms, {len(next(iter(parts.values())))} steps)"]
    for label, values in parts.items():
        if not values:
            continue
        ordered = sorted(values)
        p10, p90 = ordered[len(ordered) // 10], ordered[(9 * len(ordered)) // 10]
        lines.append(f"{label:36s} {statistics.median(ordered):8.3f} {p10:8.3f} {p90:8.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.control_trace_report", description=__doc__)
    p.add_argument("folder", type=Path)
    p.add_argument("--depth", type=int, default=2, help="the batch manager's pipeline_depth during the run")
    args = p.parse_args(argv)
    parts = breakdown(load(args.folder), args.depth)
    if not parts["step (begin -> end)"]:
        print(f"no complete steps in {args.folder}", file=sys.stderr)
        return 1
    print(render(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
