"""Where an in-process AR or SD run of 16 requests spends its CPU time: the first step (prompt prefill),
the steps while all 16 run, and the tail once some have finished.

    python scripts/cpu_step_anatomy.py --k 1 2 [--rounds 7] [--threads 1]

Times are `time.process_time` around `LLMEngine.step` (other processes' load does not inflate them),
medians over rounds in which the engines take turns. To compare two checkouts, run it under each with
PYTHONPATH=<checkout>/services.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minedraft.bench.workload import code_prompts
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.llm_engine import EngineConfig, LLMEngine

Trace = list[tuple[int, float, int]]  # per step: requests in the batch, CPU seconds, tokens produced


def run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> Trace:
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    trace: Trace = []
    while engine.has_unfinished():
        size = len(engine.running) + len(engine.waiting)
        before = sum(len(r.output_ids) for r in engine.running)
        start = time.process_time()
        batch = engine.step()
        trace.append((size, time.process_time() - start, sum(len(r.output_ids) for r in batch) - before))
    return trace


def summary(traces: list[Trace], size: int) -> str:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    first = med([t[0][1] for t in traces]) * 1e3
    full = med([sum(s[1] for s in t[1:] if s[0] == size) / max(1, sum(s[2] for s in t[1:] if s[0] == size))
                for t in traces]) * 1e3
    tail_ms = med([sum(s[1] for s in t[1:] if s[0] < size) for t in traces]) * 1e3
    tail_tokens = med([sum(s[2] for s in t[1:] if s[0] < size) for t in traces])
    whole = med([sum(s[1] for s in t) for t in traces]) * 1e3
    return (f"first step {first:.1f} ms | full batch {full:.3f} ms/token | tail {tail_ms:.1f} ms for "
            f"{tail_tokens:.0f} tokens | whole run {whole:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    common = {"device": "cpu", "dtype": torch.float32, "max_num_seqs": 32, "num_blocks": 1024}
    engines = {"AR": LLMEngine.from_folders(TINY_TARGET, None, EngineConfig(mode="ar", **common))}
    for k in args.k:
        engines[f"SD k={k}"] = LLMEngine.from_folders(TINY_TARGET, TINY_DRAFT, EngineConfig(mode="sd", k=k, **common))
    prompts = code_prompts(engines["AR"].tokenizer, args.batch, 32)
    for engine in engines.values():  # warm-up
        run(engine, prompts, args.max_tokens)
    traces: dict[str, list[Trace]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            traces[name].append(run(engine, prompts, args.max_tokens))
    for name, runs in traces.items():
        print(f"{name:8s} {summary(runs, args.batch)}")


if __name__ == "__main__":
    main()
