"""vLLM on the other side of a pipe: the peer `minedraft bench --peer vllm` and the fidelity test drive.

Runs under the vLLM environment's interpreter (scripts/setup_vllm_env.sh), never inside
minedraft's process, so it imports nothing from minedraft. One engine per process: AR, or
draft-model speculative decoding when --draft is given. Protocol, one JSON object per line:

    -> (started)                          <- {"ready": true, "vllm": VERSION, "threads": N}
    -> {"prompts": [[ids]], "max_tokens": N}
                                          <- {"outputs": [[ids]], "seconds": S, "cpu_seconds": C}
    -> {"quit": true} or end of input     (exits)

Greedy, ignore_eos, token-id prompts. `seconds` is the wall time of `LLM.generate` alone,
`cpu_seconds` the CPU time this process spent in it (all its threads).
vLLM's own logs go to stderr; the protocol has stdout to itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, TextIO


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", help="draft model folder: draft-model speculative decoding")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--skip-tokenizer", action="store_true", help="no tokenizer (random test models)")
    return p.parse_args(argv)


def configure_environment(threads: int) -> None:
    """What makes vLLM's CPU build work here, set before vllm is imported."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["OMP_NUM_THREADS"] = str(threads)  # vLLM keeps torch's thread count from this
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def build_engine(args: argparse.Namespace) -> Any:
    import torch
    from vllm import LLM

    torch.set_num_threads(args.threads)
    options: dict[str, Any] = {
        "model": args.target,
        "dtype": "float32",
        "enforce_eager": True,
        "seed": 0,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "skip_tokenizer_init": args.skip_tokenizer,
    }
    if args.draft:
        options["speculative_config"] = {"model": args.draft, "num_speculative_tokens": args.k}
    return LLM(**options)


def serve(llm: Any, detokenize: bool, requests: TextIO, replies: TextIO) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    for line in requests:
        message = json.loads(line)
        if message.get("quit"):
            return
        params = SamplingParams(max_tokens=int(message["max_tokens"]), temperature=0.0, ignore_eos=True,
                                detokenize=detokenize)
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in message["prompts"]]
        start, cpu_start = time.perf_counter(), time.process_time()
        results = llm.generate(prompts, params, use_tqdm=False)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        outputs = [list(r.outputs[0].token_ids) for r in results]
        replies.write(json.dumps({"outputs": outputs, "seconds": seconds, "cpu_seconds": cpu_seconds}) + "\n")
        replies.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # The protocol keeps the real stdout; everything printed afterwards (vLLM's logs) goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    configure_environment(args.threads)
    llm = build_engine(args)
    import torch
    import vllm

    replies.write(json.dumps({"ready": True, "vllm": vllm.__version__, "threads": torch.get_num_threads()}) + "\n")
    replies.flush()
    serve(llm, not args.skip_tokenizer, sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
