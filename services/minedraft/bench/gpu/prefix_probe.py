"""Where a batch of cache hits spends its first step: many rows that attach a long cached prefix and feed a
short suffix, verified the first time (any Triton kernel variant its shapes need is compiled then) and again
with fresh rows of the same shapes. Run on one GPU with the synthetic Llama-3-8B-shaped target:

    python -m minedraft.bench.gpu.prefix_probe --rows 63 --prefix 2048 --suffix 16 --json-out probe.json

Prints the host-clock time of each verify (judge + commit) and of a cold prefill of the prefix.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from minedraft.bench.synthetic_pair import SyntheticSpec, load_synthetic
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1000.0


def probe(rows: int, prefix: int, suffix: int, rounds: int, logprobs: int | None, shape: str = "llama3-8b",
          device: str = "cuda:0") -> dict[str, object]:
    target, _ = SyntheticSpec(shape, "target", 0.02, 4).pair()
    model = load_synthetic(str(target), device, torch.bfloat16)
    blocks = (rows + 2) * (-(-(prefix + suffix + 8) // 16))
    worker = Verifier(ModelRunner(model, blocks, 16, device))
    vocab = model.config.vocab_size
    shared = [(13 * i) % (vocab - 100) + 100 for i in range(prefix)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    worker.add(0, [*shared, 7], params, prefix_cache=True)
    out: dict[str, object] = {"rows": rows, "prefix": prefix, "suffix": suffix}
    out["cold_prefill_ms"] = timed(lambda: worker.verify([0], None))
    verifies = []
    for r in range(rounds):
        ids = list(range(1 + r * rows, 1 + (r + 1) * rows))
        for seq_id in ids:
            own = [(seq_id * 31 + j) % (vocab - 100) + 100 for j in range(suffix)]
            worker.add(seq_id, shared + own, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=logprobs),
                       prefix_cache=True)
        hits = sum(worker.seqs[s].cached for s in ids)
        first = timed(lambda ids=ids: worker.verify(ids, None))
        verifies.append({"round": r, "hit_tokens": hits, "first_verify_ms": first,
                         "second_verify_ms": timed(lambda ids=ids: worker.verify(ids, None))})
        for seq_id in ids:
            worker.remove(seq_id)
    out["verifies"] = verifies
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=63)
    p.add_argument("--prefix", type=int, default=2048)
    p.add_argument("--suffix", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--logprobs", type=int, default=None, help="every row asks for logprobs (as an API client may)")
    p.add_argument("--shape", default="llama3-8b", help="a synthetic shape (bench/synthetic_pair.py)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--json-out", default="")
    args = p.parse_args()
    result = probe(args.rows, args.prefix, args.suffix, args.rounds, args.logprobs, args.shape, args.device)
    print(json.dumps(result, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
