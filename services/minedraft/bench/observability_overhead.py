"""What metrics cost: PSD through the three services with the batch manager's metrics on and off
(tracing off in both, its default), alternating over rounds in one run (`minedraft bench observability`).

Everything else is `minedraft bench psd`'s PSD m/2+m/2 configuration: the same stacks, pinning,
workload and warm-up, so the ratio isolates the recording of metrics on the step loop's path.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from minedraft.bench.sd_vs_psd import Setup, measure
from minedraft.bench.workload import code_prompts
from minedraft.core.tokenizer import Tokenizer

CONFIGS = {"metrics off": "0", "metrics on": "1"}


def run(args: argparse.Namespace) -> int:
    prompts = code_prompts(Tokenizer(args.target), args.concurrency, 32)
    raw: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for _ in range(args.rounds):
        for name, value in CONFIGS.items():
            setup = Setup(name, "psd", args.concurrency)
            env = {"batch-manager": {"MINEDRAFT_METRICS": value}}
            raw[name].append(measure(args, setup, prompts, env)["tokens_per_s"])
    off = statistics.median(raw["metrics off"])
    on = statistics.median(raw["metrics on"])
    print(f"PSD m/2+m/2={args.concurrency}, k={args.k}, max_tokens={args.max_tokens}, tracing off; "
          f"medians of {args.rounds} alternating rounds")
    print("| config | tok/s (median) | all rounds |")
    print("|---|---|---|")
    for name, values in raw.items():
        print(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    print(f"metrics on / off = {on / off:.4f} (cost {100 * (1 - on / off):.2f}%)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"raw": raw, "on_over_off": on / off}, indent=2))
    return 0
