"""`python -m minedraft.bench.gpu.eagle_probe`: the synthetic EAGLE-3 head against the draft model, one GPU.

The synthetic Llama-3-8B target (bench/synthetic_pair.py, peaked heads at --agree) drafts in-process
through the engine's own step (`LLMEngine`: drafter and verifier on the same GPU) with (a) the
--draft-layers synthetic draft model and (b) the synthetic EAGLE-3 head (bench/synthetic_eagle.py), at
the same agreement, so at matched acceptance. Per (batch, k) cell, after a warm-up run:
- a clean pass: tokens/s, acceptance, tokens per row-step, and whether every row equals AR's tokens;
- an anatomy pass: each step with synchronised timers around the proposal (all k draft forwards) and
  the verify; host/other is the rest of the step (commits, hidden-state shipping, planning). The
  prompt's step is left out. Next to the draft time, its bandwidth bound: the bytes the proposal reads
  (weights but the embedding, whose rows are gathered; the KV each row attends to) over the
  device-to-device copy bandwidth measured in this run.
AR runs on the plain runner, the head's target on the capturing runner, both replaying CUDA graphs, as do the
draft model's feeds and the head's feedback forwards (its first forward is eager). Every runner of a cell
captures its steady shapes for the cell's batch and k before the warm-up (capture_ahead, as a server does at
start-up), so neither timed pass captures; the anatomy pass's tokens/s and step time stand beside the clean
pass's, and should agree with them.
Cells run k-major until --deadline-s would be passed; what was skipped is listed. JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from minedraft.bench.flags import int_list
from minedraft.bench.gpu.step_report import ModelBytes, bound_ms, draft_bytes
from minedraft.bench.gpu.timing import ceilings, log
from minedraft.bench.synthetic_eagle import (
    HEAD_VOCAB,
    build_synthetic_head,
    head_prompts,
    head_runners,
    head_vocabulary,
)
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.drafter import Drafter
from minedraft.engine.llm_engine import EngineConfig, LLMEngine, Request
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def read_bytes(module: torch.nn.Module, layers: int, cfg: Any, skip: tuple[str, ...]) -> ModelBytes:
    """What one forward reads: every weight but those named in `skip`, and its KV per attended position."""
    weights = sum(p.numel() * p.element_size() for n, p in module.named_parameters() if not n.startswith(skip))
    return ModelBytes.of(weights, layers, cfg.num_kv_heads, cfg.head_dim, 2)


class StepClock:
    """Synchronised wall time of the proposal and the verify inside engine steps, and of whole steps."""

    def __init__(self, engine: LLMEngine, bytes_of: Callable[[list[int], int], int]) -> None:
        self.engine, self.bytes_of = engine, bytes_of
        self.parts: dict[str, float] = {"draft": 0.0, "verify": 0.0}
        self.step_ms = 0.0
        self.steps = self.drafted_bytes = self.proposals = 0
        self.counting = False
        if engine.draft is not None:
            drafter = engine.draft
            propose = drafter.propose

            def timed_propose(seq_ids: list[int], k: int) -> Any:
                if self.counting:
                    self.drafted_bytes += bytes_of([drafter.seqs[s].length for s in seq_ids], k)
                    self.proposals += 1
                return self._timed("draft", propose, seq_ids, k)

            drafter.propose = timed_propose  # type: ignore[method-assign]
        verify = engine.target.verify
        engine.target.verify = lambda ids, proposal: self._timed("verify", verify, ids, proposal)  # type: ignore

    def close(self) -> None:
        """Back to the classes' methods: the workers are shared by every cell."""
        for worker in filter(None, (self.engine.draft, self.engine.target)):
            vars(worker).pop("propose", None)
            vars(worker).pop("verify", None)

    def _timed(self, part: str, fn: Callable[..., Any], *args: Any) -> Any:
        sync()
        start = time.perf_counter()
        out = fn(*args)
        sync()
        if self.counting:
            self.parts[part] += (time.perf_counter() - start) * 1000.0
        return out

    def run(self, prompts: list[list[int]], params: SamplingParams) -> list[Request]:
        reqs = [self.engine.add_request(prompt, params) for prompt in prompts]
        first = True
        while self.engine.has_unfinished():
            self.counting = not first  # the prompt's step prefills: not a decode step
            sync()
            start = time.perf_counter()
            self.engine.step()
            sync()
            if self.counting:
                self.step_ms += (time.perf_counter() - start) * 1000.0
                self.steps += 1
            first = False
        self.counting = False
        return reqs

    def report(self, copy_GBps: float, k: int) -> dict[str, float]:
        n = max(self.steps, 1)
        draft, verify = self.parts["draft"] / n, self.parts["verify"] / n
        step_bytes = self.drafted_bytes / max(self.proposals, 1)
        return {"step_ms": self.step_ms / n, "draft_ms": draft, "verify_ms": verify,
                "draft_ms_per_forward": draft / max(k, 1),
                "draft_bound_ms_per_forward": bound_ms(step_bytes, copy_GBps) / max(k, 1) if copy_GBps else 0.0,
                "host_other_ms": self.step_ms / n - draft - verify, "anatomy_steps": self.steps,
                "draft_bytes_per_forward": step_bytes / max(k, 1),
                "draft_bound_ms": bound_ms(step_bytes, copy_GBps) if self.proposals and copy_GBps else 0.0}


def capture_ahead(engine: LLMEngine, batch: int) -> int:
    """Every steady shape of this cell's batch and k, now: the verifier's windows (AR: its one-token steps), the
    draft model's feeds or the head's feedback forwards. Returns how many graphs were new."""
    k = engine.k if engine.draft is not None else 0
    captured = engine.target.runner.capture_ahead(batch, k, scoring=True)
    if engine.draft is not None:
        captured += engine.draft.runner.capture_ahead(batch, k, scoring=False)
    return captured


def measure(engine: LLMEngine, prompts: list[list[int]], args: argparse.Namespace,
            bytes_of: Callable[[list[int], int], int], copy_GBps: float) -> tuple[dict, list[list[int]]]:
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    captured = capture_ahead(engine, len(prompts))
    engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))  # warm: kernels, allocator
    sync()
    start = time.perf_counter()
    reqs: list[Request] = engine.generate(prompts, params)
    sync()
    seconds = time.perf_counter() - start
    tokens = sum(len(r.output_ids) for r in reqs)
    drafted = sum(r.stats.drafted for r in reqs)
    row = {"tokens_per_s": tokens / seconds, "seconds": seconds, "graphs_captured": captured,
           "acceptance": sum(r.stats.accepted for r in reqs) / drafted if drafted else 0.0,
           "tokens_per_step": tokens / sum(r.stats.steps for r in reqs)}
    clock = StepClock(engine, bytes_of)
    try:
        anatomy = clock.run(prompts, SamplingParams(max_tokens=args.anatomy_tokens, ignore_eos=True))
    finally:
        clock.close()
    row.update(clock.report(copy_GBps, engine.k))
    counted = sum(len(r.output_ids) for r in anatomy) - len(anatomy)  # the prompt's step made one token each
    row["anatomy_tokens_per_s"] = counted / (clock.step_ms / 1000.0) if clock.step_ms else 0.0
    return row, [r.output_ids for r in reqs]


def build(args: argparse.Namespace) -> dict[str, Any]:
    """The target, the draft model, the head and their runners, on cuda:0."""
    target_spec, draft_spec = SyntheticSpec(args.shape, "target", draft_layers=args.draft_layers,
                                            agree=args.agree).pair()
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    target = build_synthetic(target_spec, args.device, dtype)
    draft = build_synthetic(draft_spec, args.device, dtype)
    head = build_synthetic_head(target, args.agree, args.draft_vocab)
    capture, head_drafter = head_runners(target, head, args.num_blocks)
    cfg = target.config
    model_bytes = read_bytes(draft, draft.config.num_layers, cfg, ("model.embed_tokens",))
    head_bytes = read_bytes(head, 1, cfg, ("embed_tokens", "fc."))
    fc_bytes = head.fc.weight.numel() * head.fc.weight.element_size()
    return {
        "target": Verifier(ModelRunner(target, args.num_blocks, 16, args.device)),
        "capture": Verifier(capture),
        "drafters": {"model": Drafter(ModelRunner(draft, args.num_blocks, 16, args.device)), "head": head_drafter},
        "bytes_of": {"model": lambda lengths, k: draft_bytes(model_bytes, lengths, k),
                     "head": lambda lengths, k: draft_bytes(head_bytes, lengths, k) + fc_bytes},
        "closed": head_vocabulary(cfg.vocab_size, head.eagle.draft_vocab_size, 0).closed,
        "weights_GB": {"draft_model": model_bytes.weights / 1e9, "head": (head_bytes.weights + fc_bytes) / 1e9},
    }


def table(cells: list[dict]) -> str:
    lines = ["| batch | k | draft | tok/s | anatomy tok/s | vs AR | tokens/step | acceptance | step ms | draft ms "
             "| draft ms per forward | draft bound ms | verify ms | host/other ms | = AR |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ar = {c["batch"]: c["tokens_per_s"] for c in cells if c["draft"] == "AR"}
    for c in cells:
        if c["draft"] == "AR":
            lines.append(f"| {c['batch']} | - | AR | {c['tokens_per_s']:.0f} | {c['anatomy_tokens_per_s']:.0f} | "
                         f"1.00x | 1 | - | {c['step_ms']:.2f} | - | - | - | {c['verify_ms']:.2f} | "
                         f"{c['host_other_ms']:.2f} | - |")
            continue
        lines.append(f"| {c['batch']} | {c['k']} | {c['draft']} | {c['tokens_per_s']:.0f} | "
                     f"{c['anatomy_tokens_per_s']:.0f} | {c['tokens_per_s'] / ar[c['batch']]:.2f}x | "
                     f"{c['tokens_per_step']:.2f} | {c['acceptance']:.3f} | {c['step_ms']:.2f} | "
                     f"{c['draft_ms']:.2f} | {c['draft_ms_per_forward']:.3f} | {c['draft_bound_ms']:.2f} | "
                     f"{c['verify_ms']:.2f} | "
                     f"{c['host_other_ms']:.2f} | {'yes' if c['equals_ar'] else 'NO'} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.gpu.eagle_probe", description=__doc__)
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--agree", type=float, default=0.7)
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--draft-vocab", type=int, default=-1, help="the head's vocabulary (-1: the shape's published "
                   "size, 0: the target's whole vocabulary)")
    p.add_argument("--batches", type=int_list, default=[1, 16, 32, 64])
    p.add_argument("--ks", type=int_list, default=[4, 6])
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--anatomy-tokens", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--deadline-s", type=float, default=0.0, help="start no cell that would end past this (0: none)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--out", default="eagle_probe.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    began = time.monotonic()
    if args.draft_vocab < 0:
        args.draft_vocab = HEAD_VOCAB.get(args.shape, 0)
    parts = build(args)
    copy_GBps = ceilings()["copy_GBps"] if args.device.startswith("cuda") else 0.0  # CPU: a smoke run
    log(f"built in {time.monotonic() - began:.0f} s; copy {copy_GBps:.0f} GB/s; weights read per draft forward "
        f"{parts['weights_GB']}")
    tokenizer = Tokenizer(TINY_TARGET)  # stop ids and detokenizing only: the synthetic weights carry no language
    cells: list[dict] = []
    skipped: list[str] = []
    reference: dict[int, list[list[int]]] = {}
    longest = 0.0
    result: dict[str, Any] = {"args": vars(args), "copy_GBps": copy_GBps, "weights_GB": parts["weights_GB"]}

    def engine(draft: str, k: int, batch: int) -> LLMEngine:
        cfg = EngineConfig(mode="ar" if draft == "AR" else "sd", k=max(k, 1), max_num_seqs=batch, device=args.device)
        verifier = parts["capture"] if draft == "head" else parts["target"]
        return LLMEngine(verifier, parts["drafters"].get(draft), tokenizer, cfg)

    for k in args.ks:
        for batch in args.batches:
            prompts = head_prompts(parts["closed"], batch, args.prompt_len, seed=batch)
            for draft in (["AR"] if batch not in reference else []) + ["model", "head"]:
                name = f"batch {batch} k {k} {draft}"
                if args.deadline_s and time.monotonic() - began + 1.3 * longest > args.deadline_s:
                    skipped.append(name)
                    continue
                started = time.monotonic()
                bytes_of = parts["bytes_of"].get(draft, lambda lengths, k: 0)
                row, outputs = measure(engine(draft, k, batch), prompts, args, bytes_of, copy_GBps)
                if draft == "AR":
                    reference[batch] = outputs
                row.update(batch=batch, k=0 if draft == "AR" else k, draft=draft,
                           equals_ar=outputs == reference[batch])
                cells.append(row)
                longest = max(longest, time.monotonic() - started)
                log(f"{name}: {row['tokens_per_s']:.0f} tok/s (anatomy {row['anatomy_tokens_per_s']:.0f}), "
                    f"{row['graphs_captured']} graphs captured ahead, acceptance {row['acceptance']:.3f}, step "
                    f"{row['step_ms']:.2f} ms = draft {row['draft_ms']:.2f} ({row['draft_ms_per_forward']:.3f} per "
                    f"forward; bound {row['draft_bound_ms']:.2f}) + "
                    f"verify {row['verify_ms']:.2f} + host {row['host_other_ms']:.2f}, equals AR {row['equals_ar']}")
                result.update(cells=cells, skipped=skipped)
                Path(args.out).write_text(json.dumps(result, indent=1))
    result.update(cells=cells, skipped=skipped, seconds=time.monotonic() - began)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(cells))
    if skipped:
        print(f"skipped (deadline): {', '.join(skipped)}")
    return 0 if all(c["equals_ar"] for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
