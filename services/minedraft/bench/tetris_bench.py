"""`python -m minedraft.bench.tetris_bench`: TETRIS against fixed k and AR on a full batch, in one process.

Drives a Verifier and a Drafter directly (SD colocated, no services): B sequences decode together for
--steps steps after a warm-up; every step drafts (fixed k, or k + extra selected down to k x B, or
nothing for AR), verifies and commits. Reports accepted tokens per verified token (what selection
improves: the verify checks B + C tokens either way) and, on a GPU, tokens per second. Greedy, so each
row's tokens must equal AR's; the script checks that too. Pairs: model folders (default the bundled
tiny pair, on the CPU) or `--synthetic SHAPE` (bench/synthetic_pair.py, peaked heads with `--agree`).
Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch

from minedraft.bench.flags import int_list
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.drafter import Drafter
from minedraft.engine.loader import load_model
from minedraft.engine.model import CausalLM
from minedraft.engine.runner import ModelRunner
from minedraft.engine.tetris_propose import propose_selected
from minedraft.engine.verifier import Verifier


def models(args: argparse.Namespace) -> tuple[CausalLM, CausalLM]:
    if args.synthetic:
        from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic

        spec = SyntheticSpec(args.synthetic, "target", draft_layers=args.draft_layers, agree=args.agree)
        target, draft = spec.pair()
        return build_synthetic(target, args.device), build_synthetic(draft, args.device)
    from minedraft.bundled import TINY_DRAFT, TINY_TARGET

    return (load_model(args.target or TINY_TARGET, args.device), load_model(args.draft or TINY_DRAFT, args.device))


def run_cell(pair: tuple[CausalLM, CausalLM], args: argparse.Namespace, batch: int, k: int, extra: int
             ) -> tuple[dict, list[list[int]]]:
    """One (batch, k, extra) cell; k = 0 is AR. Returns its numbers and every row's tokens."""
    target = Verifier(ModelRunner(pair[0], args.num_blocks, 16, args.device))
    draft = Drafter(ModelRunner(pair[1], args.num_blocks, 16, args.device))
    vocab = pair[0].config.vocab_size
    gen = torch.Generator().manual_seed(7)
    ids = list(range(batch))
    for seq_id in ids:
        prompt = torch.randint(2, vocab, (args.prompt_len,), generator=gen).tolist()
        for worker in (target, draft):
            worker.add(seq_id, prompt, SamplingParams(max_tokens=10**6, ignore_eos=True))
    verified = accepted = emitted = 0
    started = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            started, verified, accepted, emitted = time.perf_counter(), 0, 0, 0
        proposal = propose_selected(draft, ids, k + extra, k * batch if extra else 0) if k else None
        verdict = target.verify(ids, proposal)
        counts = verdict.accepted.tolist()
        rows = verdict.tokens.tolist()
        lengths = proposal.lengths if proposal is not None and proposal.lengths is not None else [k] * batch
        for seq_id, row, n in zip(ids, rows, counts, strict=True):
            if k:
                draft.commit(seq_id, row[: n + 1], n)
        verified += batch + sum(lengths)
        accepted += sum(counts)
        emitted += sum(counts) + batch
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    cell = {"batch": batch, "k": k, "extra": extra, "kind": "ar" if not k else ("tetris" if extra else "fixed"),
            "tokens_per_s": round(emitted / seconds, 1), "accepted_per_verified_token": round(accepted / verified, 4),
            "tokens_per_step": round(emitted / (batch * args.steps), 3), "verified_tokens": verified}
    tokens = [target.seqs[s].tokens for s in ids]
    del target, draft
    gc.collect()  # the runners' KV caches before the next cell allocates its own (they hold GPU memory)
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return cell, tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.tetris_bench", description=__doc__)
    p.add_argument("--target", default="")
    p.add_argument("--draft", default="")
    p.add_argument("--synthetic", default="", help="a synthetic shape (llama3-8b) instead of folders")
    p.add_argument("--agree", type=float, default=0.7)
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batches", type=int_list, default=[16, 32, 64])
    p.add_argument("--ks", type=int_list, default=[2, 4, 6])
    p.add_argument("--extra", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--out", default="tetris_bench.json")
    args = p.parse_args(argv)
    pair = models(args)
    cells = []
    for batch in args.batches:
        ar, reference = run_cell(pair, args, batch, 0, 0)
        cells.append(ar)
        for k in args.ks:
            for extra in (0, args.extra):
                cell, tokens = run_cell(pair, args, batch, k, extra)
                # Steps emit different counts; the shared prefix of every row must be AR's.
                cell["equals_ar"] = all(t[: len(r)] == r[: len(t)] for t, r in zip(tokens, reference, strict=True))
                cells.append(cell)
                print(json.dumps(cell), flush=True)
        print(json.dumps(ar), flush=True)
    Path(args.out).write_text(json.dumps({"device": args.device, "synthetic": args.synthetic, "cells": cells},
                                         indent=1))
    return 0 if all(c.get("equals_ar", True) for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
