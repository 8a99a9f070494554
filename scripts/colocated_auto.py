"""Adaptive k (auto) against fixed k on a colocated verifier (fused SD), one GPU, 8B-shaped synthetic pair.

Usage (repository root, a CUDA machine): python3 scripts/colocated_auto.py ACCEPTANCES MS KS
e.g.   python3 scripts/colocated_auto.py 0.7,0.5,0.9 16,64 2,4,6
For each acceptance level it starts one colocated stack, captures every verify and draft width auto may use,
then times SD at each fixed k and auto (k <= max(KS)) in two alternating rounds per batch size, and prints one
JSON line per (acceptance, m): tokens/s per round, the k auto chose per round, the best fixed k, auto's ratio
to it, and whether every configuration's greedy output was identical.
"""

from __future__ import annotations

import asyncio
import json
import sys

from minedraft.bench.client import fetch_status, generate_all, put_policy
from minedraft.bench.gpu.placements import PairSpecs, colocated_stack, measure
from minedraft.bench.peaked_head import agree_for_acceptance
from minedraft.bench.synthetic_pair import SyntheticSpec
from minedraft.bench.workload import random_prompts


def run_level(acceptance: float, ms: list[int], fixed: list[int], prompts: list[list[int]]) -> None:
    target, draft = SyntheticSpec("llama3-8b", "target", 0.02, 4, agree_for_acceptance(acceptance)).pair()
    stack = colocated_stack(PairSpecs(str(target), str(draft)), 2048, max(ms))
    stack.start_verifier()
    stack.start_manager()
    stack.wait_ready(600)
    try:
        for m in ms:
            for k in range(1, max(fixed) + 1):
                put_policy(stack.admin_port, mode="sd", k=k, max_num_seqs=m)
                asyncio.run(generate_all(stack.cfg.grpc_port, prompts[:m], 32))
        for m in ms:
            rates: dict[str, list[float]] = {}
            chosen: list[dict[str, int]] = []
            outputs = {}
            for _ in range(2):
                for name, mode, k in [*((f"k={k}", "sd", k) for k in fixed), ("auto", "auto", max(fixed))]:
                    before = (fetch_status(stack.cfg.http_port).get("adaptive_k") or {}).get("plans_by_k", {})
                    row, out = measure(stack, mode, k, prompts[:m], 128, 1)
                    after = (fetch_status(stack.cfg.http_port).get("adaptive_k") or {}).get("plans_by_k", {})
                    rates.setdefault(name, []).append(round(row["tokens_per_s"], 1))
                    outputs.setdefault(name, out)
                    if mode == "auto":
                        chosen.append({k2: n - before.get(k2, 0) for k2, n in after.items() if n > before.get(k2, 0)})
            best = max((n for n in rates if n != "auto"), key=lambda n: max(rates[n]))
            print(json.dumps({"acceptance": acceptance, "m": m, "tokens_per_s": rates, "auto_k": chosen,
                              "best_fixed": best, "auto_over_best": round(max(rates["auto"]) / max(rates[best]), 3),
                              "outputs_identical": len({json.dumps(o) for o in outputs.values()}) == 1}), flush=True)
    finally:
        stack.stop(grace=20)


def main(argv: list[str]) -> int:
    levels, ms, fixed = ([float(x) for x in argv[0].split(",")], [int(x) for x in argv[1].split(",")],
                         [int(x) for x in argv[2].split(",")])
    prompts = random_prompts(max(ms), seed=13)
    for acceptance in levels:
        run_level(acceptance, ms, fixed, prompts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
