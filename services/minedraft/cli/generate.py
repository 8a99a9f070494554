"""`minedraft generate`: offline generation with the in-process engine."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from minedraft.cli.options import add_model_flags, add_sampling_flags, draft_folder, sampling_from_args
from minedraft.core.errors import InvalidRequestError
from minedraft.core.request import Request


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text for prompts (AR or speculative)")
    add_model_flags(p, draft_kind=True)
    add_sampling_flags(p)
    p.add_argument("--mode", choices=("ar", "sd"), default="sd")
    p.add_argument("--prompt", action="append", default=[], help="prompt text (repeatable)")
    p.add_argument("--prompts-file", help='JSONL file, one {"prompt": ...} object (or a JSON string) per line')
    p.add_argument("--max-num-seqs", type=int, default=64, help="largest running batch")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    p.set_defaults(run=run)


def read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                item = json.loads(line)
                if isinstance(item, dict):
                    item = item.get("prompt")
                if not isinstance(item, str):
                    raise InvalidRequestError(f"{args.prompts_file}:{n}: expected a string or an object with 'prompt'")
                prompts.append(item)
    if not prompts:
        prompts = ["def fibonacci(n):"]
    return prompts


def result_record(req: Request) -> dict[str, object]:
    return {
        "text": req.text,
        "token_ids": req.output_ids,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.prompt_ids),
        "stats": req.stats.as_dict(len(req.output_ids)),
    }


def run(args: argparse.Namespace) -> int:
    # The engine (torch, tqdm: the worker extra) is imported when the command runs: building the
    # parser must not need it.
    from tqdm import tqdm

    from minedraft.engine.llm_engine import EngineConfig, LLMEngine
    from minedraft.engine.loader import parse_dtype

    config = EngineConfig(
        mode=args.mode, k=args.k, max_num_seqs=args.max_num_seqs, device=args.device, dtype=parse_dtype(args.dtype),
        draft_kind=args.draft_kind,
    )
    engine = LLMEngine.from_folders(args.target, draft_folder(args), config)
    prompts = read_prompts(args)
    base = sampling_from_args(args)
    reqs = [engine.add_request(p, replace(base)) for p in prompts]
    done = 0
    with tqdm(total=len(reqs), disable=len(reqs) < 2, file=sys.stderr, unit="req") as bar:
        while engine.has_unfinished():
            engine.step()
            finished = sum(r.finished for r in reqs)
            bar.update(finished - done)
            done = finished
    for prompt, req in zip(prompts, reqs, strict=True):
        if args.json:
            print(json.dumps(result_record(req)))
        else:
            print(prompt + req.text)
            print("---")
    return 0
