"""Our engine and vLLM side by side (`minedraft bench --peer vllm`).

The same token-id prompts, k, lengths and batch sizes go through our in-process engine and
through vLLM (its CPU build, in its own environment: `vllm_peer`), AR and SD. Every round runs
the four configurations back to back, in an order that rotates from round to round, so load
from other processes on the machine falls on all of them; tokens/s are medians over rounds.
Greedy outputs are compared token for token: ours against vLLM's, and SD against AR on each side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from minedraft.bench.vllm_peer import PeerConfig, Timed, VllmPeer, vllm_python
from minedraft.bench.workload import code_prompts
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.loader import parse_dtype

SYSTEMS = ("ours_ar", "vllm_ar", "ours_sd", "vllm_sd")
Generate = Callable[[list[list[int]], int], Timed]


def ours(engine: LLMEngine) -> Generate:
    """Our engine behind the peer's interface: greedy, ignore_eos, wall and CPU time of `generate`."""
    def generate(prompts: list[list[int]], max_tokens: int) -> Timed:
        params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True) for _ in prompts]
        start, cpu_start = time.perf_counter(), time.process_time()
        reqs = engine.generate(prompts, params)
        return Timed([r.output_ids for r in reqs], time.perf_counter() - start, time.process_time() - cpu_start)

    return generate


def measure(systems: dict[str, Generate], prompts: list[list[int]], max_tokens: int, repeats: int) -> dict:
    """One table row: every system `repeats` times, rotating the order each round."""
    for generate in systems.values():  # warm-up: first-call allocations, lazy imports
        generate(prompts, 4)
    speeds: dict[str, list[float]] = {name: [] for name in systems}
    cpu_speeds: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list[list[int]]] = {}
    names = list(systems)
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            run = systems[name](prompts, max_tokens)
            outputs.setdefault(name, run.outputs)
            tokens = sum(len(t) for t in run.outputs)
            speeds[name].append(tokens / run.seconds)
            cpu_speeds[name].append(tokens / run.cpu_seconds)
    tps = {name: statistics.median(v) for name, v in speeds.items()}
    return {
        "batch": len(prompts),
        **{f"{name}_tokens_per_s": round(tps[name], 1) for name in names},
        **{f"{name}_rounds": [round(v, 1) for v in speeds[name]] for name in names},
        **{f"{name}_tokens_per_cpu_s": round(statistics.median(cpu_speeds[name]), 1) for name in names},
        "ours_sd_over_ar": round(tps["ours_sd"] / tps["ours_ar"], 3),
        "vllm_sd_over_ar": round(tps["vllm_sd"] / tps["vllm_ar"], 3),
        "ar_ours_over_vllm": round(tps["ours_ar"] / tps["vllm_ar"], 3),
        "sd_ours_over_vllm": round(tps["ours_sd"] / tps["vllm_sd"], 3),
        "ar_identical": outputs["ours_ar"] == outputs["vllm_ar"],
        "sd_identical": outputs["ours_sd"] == outputs["vllm_sd"],
        "sd_equals_ar": outputs["ours_sd"] == outputs["ours_ar"] and outputs["vllm_sd"] == outputs["vllm_ar"],
    }


def print_cpu_table(rows: list[dict]) -> None:
    print("| batch | ours AR | vLLM AR | ours SD | vLLM SD |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | " + " | ".join(str(r[f"{name}_tokens_per_cpu_s"]) for name in SYSTEMS) + " |")


def print_table(rows: list[dict]) -> None:
    print("| batch | ours AR | vLLM AR | ours SD | vLLM SD | ours SD/AR | vLLM SD/AR | AR ours/vLLM | SD ours/vLLM "
          "| greedy identical (AR, SD, SD=AR) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        same = ", ".join("yes" if r[key] else "NO" for key in ("ar_identical", "sd_identical", "sd_equals_ar"))
        print(f"| {r['batch']} | {r['ours_ar_tokens_per_s']} | {r['vllm_ar_tokens_per_s']} | "
              f"{r['ours_sd_tokens_per_s']} | {r['vllm_sd_tokens_per_s']} | {r['ours_sd_over_ar']} | "
              f"{r['vllm_sd_over_ar']} | {r['ar_ours_over_vllm']} | {r['sd_ours_over_vllm']} | {same} |")


def run(args: argparse.Namespace) -> int:
    threads = args.threads or 1
    torch.set_num_threads(threads)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    common = {"device": "cpu", "dtype": parse_dtype(args.dtype), "max_num_seqs": max(sizes)}
    engines = {
        "ours_ar": LLMEngine.from_folders(args.target, None, EngineConfig(mode="ar", **common)),
        "ours_sd": LLMEngine.from_folders(args.target, args.draft, EngineConfig(mode="sd", k=args.k, **common)),
    }
    python = vllm_python(args.vllm_python)
    peer_config = PeerConfig(str(args.target), None, args.k, threads, max(sizes), args.max_model_len)
    peers: dict[str, VllmPeer] = {}
    try:
        peers["vllm_ar"] = VllmPeer(peer_config, python)
        peer_config.draft = str(args.draft)
        peers["vllm_sd"] = VllmPeer(peer_config, python)
        systems: dict[str, Generate] = {name: ours(engine) for name, engine in engines.items()}
        systems.update({name: peer.generate for name, peer in peers.items()})
        systems = {name: systems[name] for name in SYSTEMS}
        tokenizer = engines["ours_ar"].tokenizer
        rows = [measure(systems, code_prompts(tokenizer, size, args.prompt_len), args.max_tokens, args.repeats)
                for size in sizes]
        version = peers["vllm_ar"].version
    finally:
        for peer in peers.values():
            peer.close()
    print(f"ours vs vLLM {version} (CPU, float32, eager): k={args.k}, prompt {args.prompt_len} tokens, "
          f"max_tokens={args.max_tokens}, greedy, {threads} thread(s) each, tokens/s medians of {args.repeats} "
          "rotating rounds")
    print_table(rows)
    print("\ntokens per CPU-second of the generating process (every thread; medians), which other processes'"
          " load does not inflate:")
    print_cpu_table(rows)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    same = all(r["ar_identical"] and r["sd_identical"] and r["sd_equals_ar"] for r in rows)
    return 0 if same else 1
