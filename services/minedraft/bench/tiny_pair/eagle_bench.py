"""`python -m minedraft.bench.tiny_pair.eagle_bench`: the bundled tiny EAGLE head against the tiny draft model.

Two measurements on the CPU, greedy:
1. Tokens per target step at k = 4 on the held-out prompts TINY_PAIR.md uses (in-process SD, the same
   engine for both drafts): the head reads the target's hidden states, the draft model only tokens.
2. SD vs PSD with the head through the three services at equal total concurrency (verifier and draft
   service pinned to a core each, one torch thread each; `minedraft bench psd`'s measurement).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tokenizers import Tokenizer

from minedraft.bench.sd_vs_psd import Setup, measure, summarize
from minedraft.bench.tiny_pair.bpe_tokenizer import encode_documents
from minedraft.bench.tiny_pair.corpus import load_corpus
from minedraft.bench.tiny_pair.evaluation import build_prompts
from minedraft.bench.workload import code_prompts
from minedraft.bundled import TINY_DRAFT, TINY_EAGLE, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer as EngineTokenizer
from minedraft.engine.llm_engine import EngineConfig, LLMEngine

REPORT_HEAD = """# Tiny EAGLE head for tiny-target

An EAGLE-1 head (SafeAILab's layout: a one-layer Llama config, `fc` over concat(embedding, hidden), the
decoder layer without its input norm; embedding and lm_head are tiny-target's) trained on the pair's stdlib
corpus by `python -m minedraft.bench.tiny_pair.eagle` (800 steps of feature regression plus KL to the target,
then 250 with three draft steps unrolled as they run; the commands are in that module's docstring), bfloat16,
1.7 MB, 856,576 parameters of its own. `minedraft serve --draft-kind eagle` drafts with it. Step counts are
deterministic; times are wall clock and vary with machine load (ratios come from alternating rounds).

"""


def tokens_per_step(draft: Path, kind: str, prompts: list[list[int]], k: int, new_tokens: int) -> dict[str, float]:
    engine = LLMEngine.from_folders(TINY_TARGET, draft, EngineConfig(mode="sd", k=k, draft_kind=kind))
    reqs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    steps = sum(r.stats.steps for r in reqs)
    accepted = sum(r.stats.accepted for r in reqs)
    drafted = sum(r.stats.drafted for r in reqs)
    return {"tokens_per_step": sum(len(r.output_ids) for r in reqs) / steps, "acceptance": accepted / drafted,
            "steps": steps}


def emit(lines: list[str], line: str) -> None:
    print(line, flush=True)
    lines.append(line)


def acceptance_table(args: argparse.Namespace, lines: list[str]) -> None:
    tokenizer = Tokenizer.from_file(str(TINY_TARGET / "tokenizer.json"))
    docs = encode_documents(tokenizer, load_corpus(0.02).held_out)
    prompts = build_prompts(docs, args.prompts, args.prompt_tokens, args.new_tokens + args.k, args.seed)
    emit(lines, f"In-process greedy SD, k={args.k}, {len(prompts)} held-out prompts of {args.prompt_tokens} tokens, "
                f"{args.new_tokens} new tokens each:\n")
    emit(lines, "| draft | tokens per target step | acceptance | steps |")
    emit(lines, "|---|---|---|---|")
    for name, folder, kind in (("tiny-draft (1-layer model)", TINY_DRAFT, "model"),
                               ("tiny-eagle (EAGLE-1 head)", Path(args.head), "eagle")):
        r = tokens_per_step(folder, kind, prompts, args.k, args.new_tokens)
        emit(lines, f"| {name} | {r['tokens_per_step']:.3f} | {r['acceptance']:.3f} | {r['steps']} |")


def services_table(args: argparse.Namespace, lines: list[str]) -> None:
    m = args.concurrency
    ns = argparse.Namespace(target=str(TINY_TARGET), draft=args.head, k=args.k, max_tokens=args.max_tokens,
                            target_cpu=args.target_cpu, draft_cpu=args.draft_cpu)
    env = {"verifier": {"MINEDRAFT_DRAFT_KIND": "eagle", "MINEDRAFT_DRAFT_HEAD": args.head},
           "draft": {"MINEDRAFT_DRAFT_KIND": "eagle", "MINEDRAFT_TARGET_MODEL": str(TINY_TARGET)}}
    setups = [Setup(f"SD m={m}", "sd", m), Setup(f"PSD m/2+m/2={m}", "psd", m)]
    prompts = code_prompts(EngineTokenizer(TINY_TARGET), m, 32)
    raw: dict[str, list[dict[str, float]]] = {s.name: [] for s in setups}
    for _ in range(args.rounds):
        for setup in setups:
            raw[setup.name].append(measure(ns, setup, prompts, env))
    rows = [summarize(s, raw[s.name]) for s in setups]
    emit(lines, f"\nThrough the services with the head: k={args.k}, max_tokens={args.max_tokens}, verifier on CPU "
                f"{args.target_cpu}, draft on CPU {args.draft_cpu}, one torch thread each; medians of {args.rounds} "
                "alternating rounds:\n")
    emit(lines, "| config | tok/s | vs SD | acceptance | tokens/seq-step | round ms | draft ms | verify ms |")
    emit(lines, "|---|---|---|---|---|---|---|---|")
    base = float(rows[0]["tokens_per_s"])
    for r in rows:
        emit(lines, f"| {r['config']} | {r['tokens_per_s']} | {float(r['tokens_per_s']) / base:.2f}x | "
                    f"{r['acceptance']} | {r['tokens_per_seq_step']} | {r['round_ms']} | {r['draft_ms']} | "
                    f"{r['verify_ms']} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.tiny_pair.eagle_bench", description=__doc__)
    p.add_argument("--head", default=str(TINY_EAGLE))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--concurrency", type=int, default=8, help="total concurrency m (PSD: m/2 + m/2)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-cpu", default="0")
    p.add_argument("--draft-cpu", default="1")
    p.add_argument("--skip-services", action="store_true")
    p.add_argument("--report", default="", help="also write the tables here, after REPORT_HEAD")
    args = p.parse_args(argv)
    lines: list[str] = []
    acceptance_table(args, lines)
    if not args.skip_services:
        services_table(args, lines)
    if args.report:
        command = shlex.join(["python", "-m", "minedraft.bench.tiny_pair.eagle_bench", *(argv or sys.argv[1:])])
        Path(args.report).write_text(REPORT_HEAD + "\n".join(lines) + f"\n\nMeasured with `{command}`.\n")


if __name__ == "__main__":
    main()
