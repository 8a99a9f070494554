"""The benchmarks' command-line flags, apart from their code: building the `minedraft` parser must
not import torch (the batch-manager image runs the same command without it)."""

from __future__ import annotations

import argparse
import os

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.options import add_model_flags


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]  # "" is the empty list


def add_ar_vs_sd_flags(p: argparse.ArgumentParser) -> None:
    add_model_flags(p)
    p.add_argument("--batch-sizes", default="1,4,16", help="comma-separated concurrent request counts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="alternating AR/SD rounds; medians are reported")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: leave torch's default; with --peer vllm: 1), the same on both sides")
    p.add_argument("--json-out", help="write the raw results here")
    p.add_argument("--peer", choices=["vllm"],
                   help="also run vLLM (its own environment: scripts/setup_vllm_env.sh) side by side, AR and SD")
    p.add_argument("--vllm-python", help="the vLLM environment's python [$MINEDRAFT_VLLM_PYTHON, .tools/vllm-venv]")
    p.add_argument("--prompt-len", type=int, default=32, help="--peer: prompt tokens per request")
    p.add_argument("--max-model-len", type=int, default=1024, help="--peer: vLLM's max_model_len")


def add_sd_vs_psd_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=str(TINY_TARGET))
    p.add_argument("--draft", default=str(TINY_DRAFT))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=16, help="total concurrency m (PSD: m/2 + m/2)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-cpu", default="0")
    p.add_argument("--draft-cpu", default="1")
    p.add_argument("--json-out", help="write raw results here")


def add_gpu_sweep_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=os.environ.get("OUT", "bench_out"), help="results folder [$OUT]")
    p.add_argument("--shape", default="llama3-8b", help="synthetic pair shape: llama3-8b | tiny")
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--acceptance", default="0.5,0.7,0.9")
    p.add_argument("--alphas", default="", help="skip calibration: comma list matching --acceptance")
    p.add_argument("--ks", type=int_list, default=[2, 4, 6])
    p.add_argument("--ms", type=int_list, default=[8, 16, 32, 64])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--full-grid", type=float, default=0.7, help="acceptance level that gets the whole k x m grid")
    p.add_argument("--small-ks", type=int_list, default=[4], help="k values at the other acceptance levels")
    p.add_argument("--small-ms", type=int_list, default=[16, 64], help="m values at the other acceptance levels")
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no new phase after this many seconds")
    p.add_argument("--tp-size", type=int, default=1,
                   help="target ranks for the services half: GPUs 0..tp-1 verify, GPU tp drafts")
    p.add_argument("--skip-inprocess", action="store_true", help="only the three-service half")
    p.add_argument("--skip-services", action="store_true")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--pipeline-depth", type=int, default=2, help="plans in flight ahead of the verifier")
    p.add_argument("--profile-host", action="store_true", help="finish with a cProfile'd PSD run (k=4, m=16)")
    p.add_argument("--tiny", action="store_true", help="also run the bundled tiny pair (k=4, --small-ms)")
    p.add_argument("--step-table", action="store_true",
                   help="also measure the engine step per (batch, k): GPU time, whole time, bound (step_profile.py)")
    p.add_argument("--step-only", action="store_true", help="measure the step table alone (implies --step-table)")
    add_step_table_flags(p)


def add_step_table_flags(p: argparse.ArgumentParser) -> None:
    """The engine-step table's cells (`minedraft bench gpu --step-table`, and bench/gpu/step_profile.py)."""
    p.add_argument("--step-batches", type=int_list, default=[1, 16, 32, 64])
    p.add_argument("--step-ks", type=int_list, default=[4, 6], help="k of the verify, draft and fused cells")
    p.add_argument("--step-modes", default="ar,verify,sd2,psd,draft,psd-draft,fused",
                   help="comma list of ar, verify, sd2 (SD-2GPU's verify, drafts landing after the draft cell's "
                        "GPU time; brings draft along), psd, draft, psd-draft, fused")
    p.add_argument("--step-context", type=int, default=128, help="prompt tokens per sequence before the steps")
    p.add_argument("--step-rounds", type=int, default=4, help="rounds of (whole, phased, GPU-alone) blocks")
    p.add_argument("--step-steps", type=int, default=6, help="steps per block")
    p.add_argument("--step-num-blocks", type=int, default=4096, help="KV blocks per model for the step cells")
    p.add_argument("--step-alpha", type=float, default=0.0269, help="the synthetic pair's alpha for the step cells")
    p.add_argument("--step-sampling", default="greedy",
                   help="comma list of the rows' sampling: greedy (argmax, nothing processed), penalties (greedy "
                        "with repetition 1.1, frequency 0.5 and presence 0.5 penalties), sampled (temperature 0.8, "
                        "seeded; drafts come with their probabilities), logprobs (greedy, top 5 logprobs); the "
                        "draft cells are greedy only")
    p.add_argument("--weights", default="bf16",
                   help="comma list of the target's (and draft's) weight formats: bf16, fp8 (needs FP8 support)")


def add_gpu_report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", help="results.json of `minedraft bench gpu`")
    p.add_argument("--out", help="folder for results.md and throughput.png (default: beside results.json)")


def add_kernel_timing_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep-splits", action="store_true", help="also time forced key-split counts")


def add_serving_arms_flags(p: argparse.ArgumentParser) -> None:
    """What the two-arm serving benchmarks share (bench/arm_stacks.py); a 0 takes the device's default."""
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: the tiny pair in PSD on two cores; cuda: the synthetic 8B pair (--placement)")
    p.add_argument("--placement", choices=["colocated", "psd"], default="colocated",
                   help="cuda: colocated (one GPU, SD with the draft beside the target) or psd (the verifier on GPU 0, "
                        "the draft service on GPU 1, PSD over NCCL)")
    p.add_argument("--rounds", type=int, default=1, help="rounds on fresh prompts, the arms' order alternating")
    p.add_argument("--acceptance", type=float, default=0.7, help="cuda: the synthetic pair's acceptance at k=4")
    p.add_argument("--num-blocks", type=int, default=0, help="KV blocks per model (0: the benchmark's default)")
    p.add_argument("--json-out", help="write the rows and the raw timings here")


def add_prefix_cache_flags(p: argparse.ArgumentParser) -> None:
    add_serving_arms_flags(p)
    p.add_argument("--requests", type=int, default=0, help="shared-prefix requests (0: 24 on cpu, 64 on cuda)")
    p.add_argument("--prefix-tokens", type=int, default=0, help="their common prefix (0: 700 / 2048)")
    p.add_argument("--suffix-tokens", type=int, default=16, help="each one's own suffix")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens out per shared-prefix request")
    p.add_argument("--conversations", type=int, default=0, help="chat conversations at once (0: 4 / 16)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=0, help="the shared system message (0: 64 / 256)")
    p.add_argument("--user-tokens", type=int, default=0, help="each user message, about (0: 96 / 256)")
    p.add_argument("--answer-tokens", type=int, default=0, help="each answer (0: 32 / 64)")


def add_chunked_prefill_flags(p: argparse.ArgumentParser) -> None:
    add_serving_arms_flags(p)
    p.add_argument("--streams", type=int, default=6, help="streams decoding while the long prompts arrive")
    p.add_argument("--stream-tokens", type=int, default=0, help="each stream's output (0: 600 on cpu, 1500 on cuda)")
    p.add_argument("--long-prompts", type=int, default=3, help="long prompts, sent one at a time")
    p.add_argument("--long-tokens", type=int, default=0, help="each long prompt (0: 900 / 6000)")
    p.add_argument("--long-max-tokens", type=int, default=8, help="tokens out per long prompt")
    p.add_argument("--settle-ms", type=int, default=0, help="streams alone before the first long prompt (0: 300)")
    p.add_argument("--pause-ms", type=int, default=300, help="after a long prompt's first token, before the next")
    p.add_argument("--budget", type=int, default=0,
                   help="the chunked arm's --max-num-batched-tokens (0: the device's default, 96 cpu / 2048 cuda)")
    p.add_argument("--unchunked-budget", type=int, default=100000, help="the unchunked arm's, beyond any prompt")
