"""Flags shared by several subcommands."""

from __future__ import annotations

import argparse

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=str(TINY_TARGET), help="target model folder (default: bundled tiny)")
    parser.add_argument("--draft", default=str(TINY_DRAFT), help="draft model folder (default: bundled tiny)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per speculative step")
    parser.add_argument("--device", default="cpu", help="torch device for both models")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=list(args.stop),
        ignore_eos=args.ignore_eos,
    )
