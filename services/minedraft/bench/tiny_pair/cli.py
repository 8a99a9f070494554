"""`python -m minedraft.bench.tiny_pair`: flags, the training run, then evaluation and reports."""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM

from minedraft.bench import tiny_pair
from minedraft.bench.tiny_pair.bpe_tokenizer import (
    VOCAB_SIZE,
    concatenate_with_eos,
    encode_documents,
    train_bpe_tokenizer,
)
from minedraft.bench.tiny_pair.corpus import Corpus, load_corpus
from minedraft.bench.tiny_pair.evaluation import evaluate_pair
from minedraft.bench.tiny_pair.models import build_llama_config, count_parameters, init_draft_from_target, save_model
from minedraft.bench.tiny_pair.report import COMMAND, TrainingRecord, load_training_record, write_reports
from minedraft.bench.tiny_pair.training import TrainSettings, train_draft, train_target
from minedraft.bundled import ASSETS

ASSETS_DIR = ASSETS
REPO_ROOT = ASSETS.parents[2]  # services/minedraft/assets in a checkout


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults reproduce the bundled pair."""
    p = argparse.ArgumentParser(prog=COMMAND, description=(tiny_pair.__doc__ or "").splitlines()[0])
    p.add_argument("--target-dir", default=str(ASSETS_DIR / "tiny-target"))
    p.add_argument("--draft-dir", default=str(ASSETS_DIR / "tiny-draft"))
    p.add_argument("--report", default=str(ASSETS_DIR / "TINY_PAIR.md"))
    p.add_argument("--eval-only", action="store_true", help="only measure the saved models")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--held-out-fraction", type=float, default=0.02)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--target-steps", type=int, default=600, help="~8 min on 2 CPU cores")
    p.add_argument("--target-lr", type=float, default=2e-3)
    p.add_argument("--draft-steps", type=int, default=600, help="~5 min on 2 CPU cores")
    p.add_argument("--draft-lr", type=float, default=2e-3)
    p.add_argument("--draft-ce-weight", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--k", type=int, default=4, help="draft tokens proposed per SD step")
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--eval-batch-size", type=int, default=16)
    return p.parse_args(argv)


def phase_settings(args: argparse.Namespace, steps: int, lr: float, seed_offset: int) -> TrainSettings:
    """Settings of one training phase from the CLI flags."""
    return TrainSettings(
        steps=steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        peak_lr=lr,
        warmup_steps=min(args.warmup_steps, max(1, steps // 10)),
        min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay,
        log_every=args.log_every,
        seed=args.seed + seed_offset,
    )


def reproduce_command(argv: list[str] | None) -> str:
    """The command line of this run."""
    flags = sys.argv[1:] if argv is None else argv
    flags = [f for f in flags if f != "--eval-only"]
    return shlex.join([*COMMAND.split(), *flags])


def repo_relative(value: Any) -> Any:
    """Show paths inside the repository relative to its root (stable across checkouts)."""
    if isinstance(value, str) and Path(value).is_absolute() and Path(value).is_relative_to(REPO_ROOT):
        return Path(value).relative_to(REPO_ROOT).as_posix()
    return value


def train_pair(args: argparse.Namespace, corpus: Corpus, argv: list[str] | None) -> dict[str, Any]:
    """Train tokenizer, target and draft; save them; return the training record."""
    run_start = time.perf_counter()
    tok_start = time.perf_counter()
    tokenizer = train_bpe_tokenizer([f.text for f in corpus.train], VOCAB_SIZE)
    tokenizer_seconds = time.perf_counter() - tok_start
    stream = concatenate_with_eos(encode_documents(tokenizer, corpus.train))
    print(f"tokenizer: {tokenizer.get_vocab_size()} tokens in {tokenizer_seconds:.1f}s; "
          f"train stream {stream.numel():,} tokens", flush=True)

    torch.manual_seed(args.seed)
    target = LlamaForCausalLM(build_llama_config(num_layers=4))
    print(f"target: {count_parameters(target):,} params", flush=True)
    target_result = train_target(target, stream, phase_settings(args, args.target_steps, args.target_lr, 1))
    save_model(target, tokenizer, Path(args.target_dir))

    torch.manual_seed(args.seed + 2)
    draft = LlamaForCausalLM(build_llama_config(num_layers=1))
    init_draft_from_target(draft, target)
    print(f"draft: {count_parameters(draft):,} params", flush=True)
    draft_settings = phase_settings(args, args.draft_steps, args.draft_lr, 3)
    draft_result = train_draft(draft, target, stream, draft_settings, args.draft_ce_weight)
    save_model(draft, tokenizer, Path(args.draft_dir))

    record = TrainingRecord(
        command=reproduce_command(argv),
        python=platform.python_version(),
        torch=torch.__version__,
        train_files=len(corpus.train),
        train_tokens=stream.numel(),
        tokenizer_seconds=tokenizer_seconds,
        target=target_result,
        draft=draft_result,
        total_seconds=time.perf_counter() - run_start,
        settings={k: repo_relative(v) for k, v in vars(args).items() if k != "eval_only"},
    )
    return asdict(record)


def main(argv: list[str] | None = None) -> None:
    """Train (unless ``--eval-only``), then evaluate and write the report."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    corpus = load_corpus(args.held_out_fraction)
    report_path = Path(args.report)
    record = load_training_record(report_path) if args.eval_only else train_pair(args, corpus, argv)
    result = evaluate_pair(args, corpus)
    write_reports(record, result, report_path)

