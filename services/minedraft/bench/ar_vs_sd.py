"""AR vs standard SD with the in-process engine, side by side in one run (`minedraft bench`)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minedraft.bench.workload import code_prompts
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.loader import parse_dtype


@dataclass(slots=True)
class RunResult:
    tokens: int
    seconds: float
    steps: int
    drafted: int
    accepted: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def timed_run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> RunResult:
    params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True) for _ in prompts]
    start = time.perf_counter()
    reqs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    return RunResult(
        tokens=sum(len(r.output_ids) for r in reqs),
        seconds=seconds,
        steps=sum(r.stats.steps for r in reqs),
        drafted=sum(r.stats.drafted for r in reqs),
        accepted=sum(r.stats.accepted for r in reqs),
    )


def measure(engines: dict[str, LLMEngine], size: int, max_tokens: int, repeats: int) -> dict[str, float]:
    """One table row: `size` concurrent requests, AR and SD alternating `repeats` times."""
    prompts = code_prompts(engines["ar"].tokenizer, size, 32)
    timed_run(engines["sd"], prompts[:1], 8)  # warm-up
    results: dict[str, list[RunResult]] = {"ar": [], "sd": []}
    for _ in range(repeats):
        for mode, engine in engines.items():
            results[mode].append(timed_run(engine, prompts, max_tokens))
    ar_tps = statistics.median(r.tokens_per_s for r in results["ar"])
    sd_tps = statistics.median(r.tokens_per_s for r in results["sd"])
    sd = results["sd"][0]
    return {
        "batch": size,
        "ar_tokens_per_s": round(ar_tps, 1),
        "sd_tokens_per_s": round(sd_tps, 1),
        "sd_over_ar": round(sd_tps / ar_tps, 3),
        "acceptance": round(sd.accepted / sd.drafted, 3),
        "mean_accepted_length": round(sd.tokens / sd.steps, 3),
    }


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    common = {"device": args.device, "dtype": parse_dtype(args.dtype), "max_num_seqs": max(sizes)}
    engines = {
        "ar": LLMEngine.from_folders(args.target, None, EngineConfig(mode="ar", **common)),
        "sd": LLMEngine.from_folders(args.target, args.draft, EngineConfig(mode="sd", k=args.k, **common)),
    }
    rows = [measure(engines, size, args.max_tokens, args.repeats) for size in sizes]
    print(f"k={args.k}, max_tokens={args.max_tokens}, device={args.device}, threads={torch.get_num_threads()}, "
          f"medians of {args.repeats} alternating rounds")
    print("| batch | AR tok/s | SD tok/s | SD/AR | acceptance | tokens/step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['ar_tokens_per_s']} | {r['sd_tokens_per_s']} | {r['sd_over_ar']} | "
              f"{r['acceptance']} | {r['mean_accepted_length']} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0
