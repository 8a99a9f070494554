"""What logprobs, penalties and grammars cost per engine step, side by side with plain requests in one run.

For each mode (AR, SD) and batch size, one engine decodes the same greedy batch five ways, the variants
interleaved round by round so machine noise hits them alike: plain, logprobs (5 alternatives per token),
penalties (repetition 1.1, frequency 0.5, presence 0.5), both, and grammar (every row constrained to a JSON
array of strings, a schema that never ends within the run: the masks of target and draft at every position;
only with a model that has a tokenizer, i.e. the tiny pair). It prints the median ms per engine step,
each variant's ratio to plain, and whether the logprobs variant emitted exactly the plain tokens (logprobs
must not change a token). On CUDA the step is also set beside the bandwidth bound of reading the target's
weights once (`--bandwidth-gbs`, the copy bandwidth of the device).

    python -m minedraft.bench.sampling_features [--pair tiny|llama3-8b] [--batch-sizes 1,16,64] [--k 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.core.structured import StructuredOutput
from minedraft.engine.llm_engine import LLMEngine

VARIANTS: dict[str, dict[str, object]] = {
    "plain": {},
    "logprobs": {"logprobs": 5},
    "penalties": {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5},
    "both": {"logprobs": 5, "repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5},
    "grammar": {"structured": StructuredOutput("json_schema", '{"type": "array", "items": {"type": "string"}}')},
}


def engines(pair: str, device: str, k: int, max_seqs: int) -> tuple[dict[str, LLMEngine], int]:
    """An AR and an SD engine sharing one target (and draft) worker; the target's weight bytes."""
    from minedraft.bundled import TINY_DRAFT, TINY_TARGET
    from minedraft.core.tokenizer import Tokenizer
    from minedraft.engine.drafter import Drafter
    from minedraft.engine.llm_engine import EngineConfig
    from minedraft.engine.loader import load_model
    from minedraft.engine.runner import ModelRunner
    from minedraft.engine.verifier import Verifier

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if pair == "tiny":
        target_model, draft_model = load_model(TINY_TARGET, device, dtype), load_model(TINY_DRAFT, device, dtype)
    else:
        from minedraft.bench.gpu.pairs import bench_pair
        spec = bench_pair(pair, 4, 0.0269)  # acceptance ~0.7 (docs/benchmarks/gpu.md)
        target_model, draft_model = spec.load(spec.target, device, dtype), spec.load(spec.draft, device, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in target_model.parameters())
    target = Verifier(ModelRunner(target_model, 4096, 16, device))
    draft = Drafter(ModelRunner(draft_model, 4096, 16, device))
    tokenizer = Tokenizer(TINY_TARGET)
    made = {}
    for mode in ("ar", "sd"):
        cfg = EngineConfig(mode=mode, k=k, max_num_seqs=max_seqs, device=device, dtype=dtype)
        made[mode] = LLMEngine(target, draft if mode == "sd" else None, tokenizer, cfg)
    return made, weight_bytes


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_once(engine: LLMEngine, prompts: list[list[int]], tokens: int, extra: dict, device: str
             ) -> tuple[float, list[list[int]], int]:
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True, **extra) for _ in prompts]  # type: ignore[arg-type]
    steps = engine.total_steps
    sync(device)
    start = time.perf_counter()
    reqs = engine.generate(prompts, params)
    sync(device)
    steps = engine.total_steps - steps
    return (time.perf_counter() - start) * 1000.0 / steps, [r.output_ids for r in reqs], steps


def measure(engine: LLMEngine, batch: int, tokens: int, rounds: int, device: str, variants: dict[str, dict]
            ) -> dict[str, object]:
    vocab = engine.target.vocab_size
    prompts = [[(31 * i + 7 * j) % (vocab - 2) + 2 for j in range(32)] for i in range(batch)]
    for extra in variants.values():  # warm-up: graphs, allocator, first-use tables
        run_once(engine, prompts, 4, extra, device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, list[list[int]]] = {}
    def masks_ms() -> float:
        return engine.target.grammars.mask_ms + (engine.draft.grammars.mask_ms if engine.draft else 0.0)

    mask_ms, grammar_steps = 0.0, 0
    for _ in range(rounds):
        for name, extra in variants.items():
            before = masks_ms()
            ms, outputs[name], steps = run_once(engine, prompts, tokens, extra, device)
            times[name].append(ms)
            if name == "grammar":
                mask_ms += masks_ms() - before
                grammar_steps += steps
    medians = {name: statistics.median(v) for name, v in times.items()}
    return {"ms_per_step": medians, "ratio_to_plain": {n: m / medians["plain"] for n, m in medians.items()},
            "mask_host_ms_per_step": mask_ms / grammar_steps if grammar_steps else None,
            "logprobs_tokens_equal_plain": outputs["logprobs"] == outputs["plain"],
            "both_tokens_equal_penalties": outputs["both"] == outputs["penalties"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pair", default="tiny", help="tiny (the bundled pair) or a synthetic shape (llama3-8b)")
    p.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-sizes", default="1,16,64")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bandwidth-gbs", type=float, default=4220.0, help="copy bandwidth for the bound (CUDA)")
    p.add_argument("--out", default="", help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    made, weight_bytes = engines(args.pair, args.device, args.k, max(sizes))
    bound_ms = weight_bytes / (args.bandwidth_gbs * 1e9) * 1000.0 if args.device.startswith("cuda") else None
    results = []
    print(f"{args.pair} on {args.device}; bound (target weights once at {args.bandwidth_gbs:g} GB/s): "
          f"{'n/a' if bound_ms is None else f'{bound_ms:.2f} ms'}")
    variants = {n: v for n, v in VARIANTS.items() if n != "grammar" or args.pair == "tiny"}
    print("mode  batch  plain ms  logprobs  penalties  both   grammar (host mask time per step)  tokens equal")
    for mode, engine in made.items():
        for batch in sizes:
            r = measure(engine, batch, args.tokens, args.rounds, args.device, variants)
            results.append({"mode": mode, "batch": batch, "k": args.k if mode == "sd" else 0, **r})
            ms, ratio = r["ms_per_step"], r["ratio_to_plain"]
            assert isinstance(ms, dict) and isinstance(ratio, dict)
            grammar = (f"{ratio['grammar']:7.3f} ({r['mask_host_ms_per_step']:.3f} ms masks)" if "grammar" in ratio
                       else "    n/a")
            print(f"{mode:4}  {batch:5}  {ms['plain']:8.2f}  {ratio['logprobs']:8.3f}  {ratio['penalties']:9.3f}  "
                  f"{ratio['both']:5.3f}  {grammar}  {r['logprobs_tokens_equal_plain']} "
                  f"{r['both_tokens_equal_penalties']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"pair": args.pair, "device": args.device, "bound_ms": bound_ms,
                                              "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
