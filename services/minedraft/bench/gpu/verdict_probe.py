"""What the greedy verdict costs per step: the torch rule against the one-kernel verdict, side by side.

Every greedy verify (and every AR step: k = 0) ends with the acceptance rule and the packing of its
verdict for the readback. Both variants run `engine.rejection.verify_drafts` on the same logits of the
8B vocabulary (the argmax over them included), in alternating rounds; "torch" is the rule with the
kernel switched off. Host us is the time the host spends queueing one call (the part that sits in line
with a step whose host work is not hidden), GPU us the events' time per call.

    python3 -m minedraft.bench.gpu.verdict_probe --out $OUT/verdict
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from minedraft.bench.flags import int_list
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine import rejection
from minedraft.engine.sampling import BatchSampling

VARIANTS = ("torch", "kernel")


def _case(batch: int, k: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(batch * 10 + k)
    logits = torch.randn((batch, k + 1, vocab), generator=gen, device=device)
    drafts = logits[:, :k].argmax(dim=-1)
    drafts[batch // 2:, k // 2:] += 1  # half the rows reject half way
    return logits, drafts


@contextmanager
def rule(variant: str) -> Iterator[None]:
    """verify_drafts with the kernel ("kernel", as shipped) or with it switched off ("torch")."""
    original = rejection._greedy_on_cuda
    if variant == "torch":
        rejection._greedy_on_cuda = lambda *args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        rejection._greedy_on_cuda = original  # type: ignore[assignment]


def _time(variant: str, logits: torch.Tensor, drafts: torch.Tensor, sampling: BatchSampling,
          calls: int) -> tuple[float, float]:
    """(host us, GPU us) per call of the variant."""
    with rule(variant):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            verdict = rejection.verify_drafts(drafts, None, logits, logits, sampling, None)
            assert verdict.packed is not None
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
    return host * 1e6 / calls, start.elapsed_time(end) * 1e3 / calls


def _verdict(variant: str, logits: torch.Tensor, drafts: torch.Tensor, sampling: BatchSampling) -> torch.Tensor:
    with rule(variant):
        packed = rejection.verify_drafts(drafts, None, logits, logits, sampling, None).packed
    assert packed is not None
    return packed


def probe(batches: list[int], ks: list[int], vocab: int, calls: int, rounds: int) -> list[dict]:
    device = torch.device("cuda")
    rows = []
    for batch in batches:
        sampling = BatchSampling.from_params([SamplingParams(temperature=0.0)] * batch, device)
        for k in ks:
            logits, drafts = _case(batch, k, vocab, device)
            for variant in VARIANTS:  # compiled and warm before either is timed
                _time(variant, logits, drafts, sampling, 3)
            got = {v: ([], []) for v in VARIANTS}
            for r in range(rounds):
                for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                    host, gpu = _time(variant, logits, drafts, sampling, calls)
                    got[variant][0].append(host)
                    got[variant][1].append(gpu)
            same = torch.equal(*(_verdict(v, logits, drafts, sampling) for v in VARIANTS))
            row = {"batch": batch, "k": k, "same_verdict": bool(same)}
            for variant, (host, gpu) in got.items():
                row[f"{variant}_host_us"] = statistics.median(host)
                row[f"{variant}_gpu_us"] = statistics.median(gpu)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> list[str]:
    out = ["| batch | k | torch host us | kernel host us | kernel / torch host | torch GPU us | kernel GPU us | "
           "same verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['batch']} | {r['k']} | {r['torch_host_us']:.1f} | {r['kernel_host_us']:.1f} | "
                   f"{r['kernel_host_us'] / r['torch_host_us']:.2f} | {r['torch_gpu_us']:.1f} | "
                   f"{r['kernel_gpu_us']:.1f} | {r['same_verdict']} |")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int_list, default=[1, 16, 64])
    p.add_argument("--ks", type=int_list, default=[0, 4, 6])
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)
    rows = probe(args.batches, args.ks, args.vocab, args.calls, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verdict_probe.json").write_text(json.dumps({"rows": rows}, indent=1))
    (args.out / "verdict_probe.md").write_text("\n".join(table(rows)) + "\n")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
