"""The in-process half of the GPU sweep: AR and same-GPU SD, the acceptance calibration of the
synthetic pair, and AR decode against the copy bandwidth."""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time

import torch

from minedraft.bench.gpu.hf_peer import hf_peer
from minedraft.bench.gpu.pairs import BenchPair, bench_pair
from minedraft.bench.gpu.timing import log, profile_steps, time_cuda
from minedraft.bench.workload import random_prompts
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.drafter import Drafter
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.model import CausalLM
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier


class InProcess:
    """Target (and draft) on cuda:0 in this process, for AR and same-GPU SD.

    One runner per model is shared by every engine made here, so CUDA graphs are captured
    once per (batch bucket, width) and reused across k and m.
    """

    def __init__(self, pair: BenchPair, num_blocks: int, draft_model: CausalLM | None = None) -> None:
        self.target = pair.load(pair.target)
        self.draft = draft_model or pair.load(pair.draft)
        self.tokenizer = Tokenizer(TINY_TARGET)
        self.target_worker = Verifier(ModelRunner(self.target, num_blocks, 16, "cuda:0"))
        self.draft_worker = Drafter(ModelRunner(self.draft, num_blocks, 16, "cuda:0"))

    def engine(self, mode: str, k: int, max_num_seqs: int) -> LLMEngine:
        cfg = EngineConfig(mode=mode, k=max(k, 1), max_num_seqs=max_num_seqs, device="cuda:0", dtype=torch.bfloat16)
        return LLMEngine(self.target_worker, self.draft_worker if mode == "sd" else None, self.tokenizer, cfg)

    def run(self, engine: LLMEngine, batch: list[list[int]], max_tokens: int) -> dict:
        params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True) for _ in batch]
        engine.generate(batch[:2], [SamplingParams(max_tokens=8, ignore_eos=True) for _ in batch[:2]])  # warm
        engine.generate(batch, [SamplingParams(max_tokens=4, ignore_eos=True) for _ in batch])  # graphs
        torch.cuda.synchronize()
        start = time.perf_counter()
        reqs = engine.generate(batch, params)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        tokens = sum(len(r.output_ids) for r in reqs)
        drafted = sum(r.stats.drafted for r in reqs)
        return {
            "tokens_per_s": tokens / seconds,
            "seconds": seconds,
            "latency_per_request_s": seconds / len(batch),
            "acceptance": sum(r.stats.accepted for r in reqs) / drafted if drafted else 0.0,
            "tokens_per_step": tokens / sum(r.stats.steps for r in reqs),
            "outputs": [r.output_ids for r in reqs],
        }


def greedy_acceptance(inproc: InProcess, k: int = 4) -> float:
    eng = inproc.engine("sd", k, 16)
    return inproc.run(eng, random_prompts(16, seed=7), 32)["acceptance"]


def calibrate(shape: str, draft_layers: int, draft: CausalLM, targets: list[float],
              grid: tuple[float, ...] = (0.003, 0.008, 0.02, 0.05, 0.12)) -> dict[float, float]:
    """alpha for each target acceptance: measure a fixed alpha grid once, then interpolate
    acceptance linearly in log(alpha). The sweep reports the acceptance it then measures,
    not the goal."""
    points = []
    for alpha in grid:
        inproc = InProcess(bench_pair(shape, draft_layers, alpha), 512, draft_model=draft)
        points.append((alpha, greedy_acceptance(inproc)))
        del inproc
        torch.cuda.empty_cache()
        log(f"calibrate: alpha {alpha} -> acceptance {points[-1][1]:.3f}")
    chosen: dict[float, float] = {}
    for goal in targets:
        chosen[goal] = points[-1][0] if goal < points[-1][1] else points[0][0]
        for (a0, r0), (a1, r1) in itertools.pairwise(points):
            if min(r0, r1) <= goal <= max(r0, r1) and r0 != r1:
                t = (goal - r0) / (r1 - r0)
                chosen[goal] = round(math.exp(math.log(a0) + t * (math.log(a1) - math.log(a0))), 4)
                break
    return chosen


def ar_bandwidth(inproc: InProcess, context: int = 512, steps: int = 64) -> dict:
    """Batch-1 decode step time against the bytes it must read (weights + KV)."""
    runner = ModelRunner(inproc.target, 256, 16, "cuda:0")
    runner.forward([0], [list(range(3, 3 + context))], [0], last_n=1)
    token = torch.tensor([[5]], device="cuda:0")

    def one_step() -> None:
        runner.forward_ids([0], token, [context], [1], last_n=1)

    def loop() -> None:
        """Greedy decode with the token fed back on the device: the host prepares step i+1
        while the GPU runs step i (no per-step synchronisation)."""
        tok = token
        for i in range(steps):
            logits = runner.forward_ids([0], tok, [context + i], [1], last_n=1)
            tok = logits[:, -1].argmax(-1, keepdim=True)

    step_s = time_cuda(one_step, repeats=steps)
    loop_s = time_cuda(loop, repeats=3) / steps
    profile = profile_steps(one_step)
    cfg = inproc.target.config
    weight_bytes = sum(p.numel() * p.element_size() for p in inproc.target.parameters())
    kv_bytes = 2 * cfg.num_layers * (context + 1) * cfg.num_kv_heads * cfg.head_dim * 2
    return {"step_ms": step_s * 1000, "bytes": weight_bytes + kv_bytes,
            "achieved_GBps": (weight_bytes + kv_bytes) / step_s / 1e9,
            "loop_step_ms": loop_s * 1000, "loop_GBps": (weight_bytes + kv_bytes) / loop_s / 1e9,
            "profile": profile}


def batch1_comparison(inproc: InProcess, max_tokens: int) -> dict[str, object]:
    peer = hf_peer(inproc.target, inproc.draft, random_prompts(1, seed=3)[0], max_tokens)
    ours = inproc.run(inproc.engine("sd", 4, 1), random_prompts(1, seed=3), max_tokens)
    ours_ar = inproc.run(inproc.engine("ar", 0, 1), random_prompts(1, seed=3), max_tokens)
    return {
        "hf_ar_tokens_per_s": peer["hf_ar_tokens_per_s"],
        "hf_assisted_tokens_per_s": peer["hf_assisted_tokens_per_s"],
        "ours_ar_tokens_per_s": ours_ar["tokens_per_s"],
        "ours_sd_k4_tokens_per_s": ours["tokens_per_s"],
        "hf_ar_matches_ours_ar": peer["hf_ar_tokens"] == ours_ar["outputs"][0],
        "greedy_agreement_sd_vs_ar": sum(a == b for a, b in zip(ours["outputs"][0], ours_ar["outputs"][0],
                                                              strict=True)) / max_tokens,
    }


def inprocess_sweep(args: argparse.Namespace, goal: float | str, pair: BenchPair, results: dict, ks: list[int],
                    ms: list[int], synthetic_draft: CausalLM | None) -> list[dict]:
    rows: list[dict] = []
    # The synthetic draft is the same model at every alpha (alpha scales only target layers).
    inproc = InProcess(pair, args.num_blocks, draft_model=synthetic_draft if pair.synthetic else None)
    if goal == args.full_grid and pair.synthetic:
        results["ar_bandwidth"] = ar_bandwidth(inproc)
        log(f"AR batch-1 bandwidth: {results['ar_bandwidth']}")
        if not args.skip_hf:
            results["batch1"] = batch1_comparison(inproc, args.max_tokens)
            log(f"batch 1: {results['batch1']}")
    alpha = pair.alpha
    for m in ms:
        ar = inproc.run(inproc.engine("ar", 0, m), random_prompts(m, seed=m), args.max_tokens)
        ar.update(config="AR", k=0, m=m, concurrency=m, gpus=1, alpha=alpha)
        rows.append(ar)
        for k in ks:
            sd = inproc.run(inproc.engine("sd", k, m), random_prompts(m, seed=m), args.max_tokens)
            sd.update(config="SD-1GPU", k=k, m=m, concurrency=m, gpus=1, alpha=alpha)
            sd["greedy_agreement_with_ar"] = statistics.mean(
                sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
                for a, b in zip(sd["outputs"], ar["outputs"], strict=True))
            rows.append(sd)
            log(f"alpha {alpha} m {m} k {k}: AR {ar['tokens_per_s']:.0f}, SD-1GPU {sd['tokens_per_s']:.0f} tok/s, "
                f"acceptance {sd['acceptance']:.3f}, agreement {sd['greedy_agreement_with_ar']:.3f}")
    for row in rows:
        row.pop("outputs", None)
    return rows
