"""Flags shared by several subcommands."""

from __future__ import annotations

import argparse

from minedraft.bundled import TINY_DRAFT, TINY_EAGLE, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.worker.settings import DRAFT_KINDS


def add_model_flags(parser: argparse.ArgumentParser, draft_kind: bool = False) -> None:
    """With draft_kind, also --draft-kind, and --draft defaults to the bundled draft model or head (draft_folder)."""
    parser.add_argument("--target", default=str(TINY_TARGET), help="target model folder (default: bundled tiny)")
    if draft_kind:
        parser.add_argument("--draft", default="", help="draft model folder, or with --draft-kind eagle the EAGLE "
                                                        "head's (default: the bundled tiny draft model or head)")
        parser.add_argument("--draft-kind", choices=DRAFT_KINDS, default="model",
                            help="what drafts: a draft model, or an EAGLE head that reads the target's hidden states")
    else:
        parser.add_argument("--draft", default=str(TINY_DRAFT), help="draft model folder (default: bundled tiny)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per speculative step")
    parser.add_argument("--device", default="cpu", help="torch device for both models")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")


def draft_folder(args: argparse.Namespace) -> str:
    """--draft, or the bundled folder of --draft-kind: the tiny draft model or the tiny EAGLE head."""
    return args.draft or str(TINY_EAGLE if args.draft_kind == "eagle" else TINY_DRAFT)


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
