#!/usr/bin/env python
"""Check the Triton kernels (paged attention, KV write, fused norm/rope/SwiGLU) against the
plain-torch reference.

    python scripts/check_cuda_kernels.py --device cuda            # full sweep + decode benchmark
    TRITON_INTERPRET=1 python scripts/check_cuda_kernels.py --device cpu --quick

Every case draws fresh random inputs: a batch mixing decode (1), verify windows (3, 5, 7)
and prefill chunks (up to 300 tokens) at contexts up to ~1000, shuffled non-contiguous
block tables, GQA, optional sliding window. The KV cache starts out NaN everywhere except
each sequence's history, the step's keys/values are stored with `write_kv_triton` (compared
bit-exactly with `attention.write_kv`), and the attention output buffer is NaN-poisoned
before the kernel runs. The reference (`attention.build_metadata` + `attention.paged_attention`)
runs in float32 on CPU on the same (dtype-rounded) values. A case passes when every valid
output element was written, padding tokens are zero, the cache matches, and
||out - ref|| / ||ref|| over valid tokens is below 1e-3 (fp32) or 2e-2 (bf16).
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time
from dataclasses import dataclass

TOLERANCE = {"fp32": 1e-3, "bf16": 2e-2}
BLOCK_SIZE = 16


@dataclass
class Case:
    dtype: str
    head_dim: int
    kv_heads: int
    group: int
    window: int | None
    splits: int | None  # None: the wrapper's own heuristic
    query_lens: list[int]
    contexts: list[int]  # tokens in the sequence after this step (start + query_len)
    extra_cols: int  # unused block-table columns past the longest row
    strided_q: bool  # q / k / v as views into one fused qkv tensor

    def label(self) -> str:
        lens = ",".join(str(n) for n in self.query_lens)
        if len(lens) > 22:
            lens = lens[:19] + "..."
        win = str(self.window) if self.window else "-"
        splits = "auto" if self.splits is None else str(self.splits)
        return (
            f"{self.dtype:<4} D={self.head_dim:<3} kv={self.kv_heads}x{self.group} win={win:<4} split={splits:<4} "
            f"B={len(self.query_lens)} q=[{lens}] ctx<={max(self.contexts)}"
        )


def _row(rng: random.Random, max_prefill: int, max_ctx: int) -> tuple[int, int]:
    kind = rng.random()
    if kind < 0.3:
        qlen = 1
    elif kind < 0.7:
        qlen = rng.choice([3, 5, 7])
    else:
        qlen = rng.randint(8, max_prefill)
    start = 0 if qlen > 7 and rng.random() < 0.3 else rng.randint(0, max(0, max_ctx - qlen))
    return qlen, start + qlen


def make_cases(quick: bool, seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases: list[Case] = []
    # Fixed corners first: pure decode, pure verify, one long prefill chunk, split-KV decode.
    corners = [
        ("fp32", 64, 2, 4, None, 1, [1, 1, 1], [1, 17, 700]),
        ("bf16", 128, 1, 4, None, 3, [5, 5], [5, 1000]),
        ("fp32", 128, 2, 1, None, None, [300], [300]),
        ("bf16", 64, 1, 4, 64, None, [7, 1, 300], [520, 64, 900]),
        ("fp32", 64, 1, 4, 100, 4, [1, 3], [999, 160]),
        # Empty rows (graph-bucket padding), window 1, a non-power-of-two group, window > context.
        ("bf16", 128, 1, 7, 1, None, [0, 5, 1], [0, 40, 33]),
        ("fp32", 64, 2, 8, 2000, 2, [0, 3, 9], [50, 300, 9]),
    ]
    for dtype, dim, kvh, grp, win, splits, qlens, ctxs in corners:
        cases.append(Case(dtype, dim, kvh, grp, win, splits, qlens, ctxs, 1, False))
    count = 12 if quick else 150
    for _ in range(count):
        batch = rng.randint(1, 4 if quick else 8)
        rows = [_row(rng, 300 if not quick or rng.random() < 0.3 else 40, 1000) for _ in range(batch)]
        cases.append(
            Case(
                dtype=rng.choice(["fp32", "bf16"]),
                head_dim=rng.choice([64, 128]),
                kv_heads=rng.choice([1, 2]) if quick else rng.choice([1, 2, 4, 8]),
                group=rng.choice([1, 4]),
                window=rng.choice([None, None, rng.randint(1, 300)]),
                splits=rng.choice([None, None, 1, rng.randint(2, 5)]),
                query_lens=[q for q, _ in rows],
                contexts=[c for _, c in rows],
                extra_cols=rng.randint(0, 3),
                strided_q=rng.random() < 0.5,
            )
        )
    return cases


def run_case(case: Case, device, gen):
    import torch

    from minedraft.engine import attention
    from minedraft.engine.cuda import paged_attention_triton, write_kv_triton

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[case.dtype]
    batch = len(case.query_lens)
    width = max(case.query_lens)
    kvh, dim = case.kv_heads, case.head_dim
    heads = kvh * case.group
    starts = [c - q for c, q in zip(case.contexts, case.query_lens, strict=True)]

    need = [-(-c // BLOCK_SIZE) for c in case.contexts]
    max_blocks = max(need) + case.extra_cols
    num_blocks = sum(need) + 8
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    spare = perm[sum(need) :]
    table = torch.empty((batch, max_blocks), dtype=torch.long)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(perm[used : used + n])
        used += n
        for col in range(n, max_blocks):  # padding columns point at NaN-only blocks
            table[b, col] = spare[(b + col) % len(spare)]

    # Cache: NaN everywhere except each row's history positions [0, start).
    shape = (num_blocks, BLOCK_SIZE, kvh, dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    for b, start in enumerate(starts):
        pos = torch.arange(start)
        blocks = table[b, pos // BLOCK_SIZE]
        k_cache[blocks, pos % BLOCK_SIZE] = torch.randn(start, kvh, dim, generator=gen).to(dtype)
        v_cache[blocks, pos % BLOCK_SIZE] = torch.randn(start, kvh, dim, generator=gen).to(dtype)

    fused = torch.randn(batch, width, heads + 2 * kvh, dim, generator=gen).to(dtype)
    if case.strided_q:
        q, k, v = fused[:, :, :heads], fused[:, :, heads : heads + kvh], fused[:, :, heads + kvh :]
    else:
        q = fused[:, :, :heads].contiguous()
        k = fused[:, :, heads : heads + kvh].contiguous()
        v = fused[:, :, heads + kvh :].contiguous()

    qlens = torch.tensor(case.query_lens, dtype=torch.long)
    start_t = torch.tensor(starts, dtype=torch.long)
    offsets = torch.arange(width).unsqueeze(0)
    valid = offsets < qlens.unsqueeze(1)
    meta = attention.build_metadata(start_t, qlens, width, table, BLOCK_SIZE, case.window)
    scale = dim**-0.5

    # Reference on CPU: NaN-free copy of the cache, plain-torch write and attention in fp32.
    ref_k, ref_v = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    attention.write_kv(ref_k, ref_v, k, v, meta)
    ref = attention.paged_attention(q.float(), ref_k.float(), ref_v.float(), meta, scale)

    # Triton on the target device.
    dk, dv = k_cache.to(device), v_cache.to(device)
    write_kv_triton(dk, dv, k.to(device), v.to(device), meta.slot_mapping.to(device))
    q_dev = fused.to(device)[:, :, :heads] if case.strided_q else q.to(device)
    out = torch.full((batch, width, heads, dim), float("nan"), dtype=dtype, device=device)
    paged_attention_triton(
        q_dev,
        dk,
        dv,
        table.to(device),
        start_t.to(device),
        qlens.to(device),
        scale,
        case.window,
        out=out,
        num_splits=case.splits,
    )
    out = out.cpu()
    dk, dv = dk.cpu(), dv.cpu()

    cache_ok = torch.equal(dk.nan_to_num(0.0), ref_k) and torch.equal(dv.nan_to_num(0.0), ref_v)
    got, want = out[valid].float(), ref[valid]
    written = not bool(torch.isnan(got).any())
    pad_zero = bool((out[~valid] == 0).all())
    err = float((got.nan_to_num(1e6) - want).norm() / want.norm())
    ok = written and pad_zero and cache_ok and err < TOLERANCE[case.dtype]
    return ok, err, written, pad_zero, cache_ok


def fused_checks(device, gen) -> int:
    """The fused element-wise kernels against `engine/fused.py`'s torch code on the same
    inputs: add+RMSNorm (with and without a residual), rope + KV store from a fused qkv
    tensor (with padding slots), silu * up. Returns the number of failures."""
    import torch

    from minedraft.engine import fused
    from minedraft.engine.attention import AttentionMetadata
    from minedraft.engine.cuda.fused_kernels import add_rms_norm_triton, rope_store_triton, silu_mul_triton

    def rel(got, want) -> float:
        got, want = got.float().cpu(), want.float().cpu()
        return float((got - want).norm() / want.norm().clamp(min=1e-30))

    failures = 0
    print(f"\n{'fused kernel':<58} {'rel err':>9}  result")
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        for rows, cols, with_res in ((1, 4096, False), (3, 4096, True), (5, 1000, True), (2, 128, True)):
            x = torch.randn(rows, cols, generator=gen).to(dtype)
            res = torch.randn(rows, cols, generator=gen).to(dtype) if with_res else None
            w = (1 + 0.1 * torch.randn(cols, generator=gen)).to(dtype)
            ref_out, ref_res = fused.add_rms_norm(x, res, w, 1e-5, "torch")
            res_dev = None if res is None else res.to(device)
            out, new_res = add_rms_norm_triton(x.to(device), res_dev, w.to(device), 1e-5)
            err = max(rel(out, ref_out), rel(new_res, ref_res))
            ok = err < tol
            failures += not ok
            print(f"{'add_rms_norm ' + str(dtype)[6:] + f' {rows}x{cols} residual={with_res}':<58} {err:9.2e}  "
                  f"{'PASS' if ok else 'FAIL'}")
        shapes = ((1, 1, 32, 8, 128), (3, 5, 16, 4, 128), (2, 3, 7, 1, 64), (4, 1, 4, 2, 32))
        for batch, width, heads, kvh, dim in shapes:
            blocks, bs = 16, BLOCK_SIZE
            qkv = torch.randn(batch, width, (heads + 2 * kvh) * dim, generator=gen).to(dtype)
            pos = torch.randint(0, 200, (batch, width), generator=gen)
            slots = torch.randperm(blocks * bs, generator=gen)[: batch * width].view(batch, width)
            slots[0, -1] = -1  # a padding token: stores nothing
            inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
            freqs = pos.float().unsqueeze(-1) * inv
            emb = torch.cat((freqs, freqs), -1).unsqueeze(-2)
            cos, sin = emb.cos(), emb.sin()
            meta = AttentionMetadata(pos, slots, torch.zeros(batch, 1, dtype=torch.long), pos[:, 0],
                                     torch.full((batch,), width), backend="torch")
            kc, vc = torch.zeros(blocks, bs, kvh, dim, dtype=dtype), torch.zeros(blocks, bs, kvh, dim, dtype=dtype)
            ref_q = fused.rope_and_store(qkv, (cos, sin), (kc, vc), meta, heads, kvh, dim)
            dkc, dvc = torch.zeros_like(kc, device=device), torch.zeros_like(vc, device=device)
            q = rope_store_triton(qkv.to(device), cos.to(device), sin.to(device), slots.to(device), dkc, dvc,
                                  heads, kvh, dim)
            err = max(rel(q, ref_q), rel(dkc, kc), rel(dvc, vc))
            ok = err < tol
            failures += not ok
            print(f"{'rope_store ' + str(dtype)[6:] + f' B={batch} Q={width} H={heads} Hkv={kvh} D={dim}':<58} "
                  f"{err:9.2e}  {'PASS' if ok else 'FAIL'}")
        for rows, inter in ((1, 14336), (6, 1000)):
            gu = torch.randn(rows, 2 * inter, generator=gen).to(dtype)
            err = rel(silu_mul_triton(gu.to(device)), fused.silu_and_mul(gu, "torch"))
            ok = err < tol
            failures += not ok
            print(f"{'silu_mul ' + str(dtype)[6:] + f' {rows}x{inter}':<58} {err:9.2e}  {'PASS' if ok else 'FAIL'}")
    return failures


def graph_check(device) -> bool:
    """CUDA only: capture the kernels in a CUDA graph, change the metadata in place, replay."""
    import torch

    from minedraft.engine.cuda import paged_attention_triton, write_kv_triton

    gen = torch.Generator().manual_seed(1)
    batch, width, kvh, grp, dim, cols = 4, 5, 8, 4, 128, 72
    heads = kvh * grp
    num_blocks = batch * cols
    table = torch.randperm(num_blocks, generator=gen).view(batch, cols).to(device)
    kc = torch.randn(num_blocks, BLOCK_SIZE, kvh, dim, generator=gen).bfloat16().to(device)
    vc = torch.randn(num_blocks, BLOCK_SIZE, kvh, dim, generator=gen).bfloat16().to(device)
    q = torch.randn(batch, width, heads, dim, generator=gen).bfloat16().to(device)
    k = torch.randn(batch, width, kvh, dim, generator=gen).bfloat16().to(device)
    v = torch.randn(batch, width, kvh, dim, generator=gen).bfloat16().to(device)
    starts = torch.zeros(batch, dtype=torch.long, device=device)
    qlens = torch.zeros(batch, dtype=torch.long, device=device)
    slots = torch.full((batch, width), -1, dtype=torch.long, device=device)
    out = torch.empty_like(q)

    def step():
        write_kv_triton(kc, vc, k, v, slots)
        paged_attention_triton(q, kc, vc, table, starts, qlens, dim**-0.5, out=out)

    def set_meta(start_list, qlen_list):
        starts.copy_(torch.tensor(start_list))
        qlens.copy_(torch.tensor(qlen_list))
        offs = torch.arange(width, device=device)
        pos = starts.unsqueeze(1) + offs
        slot = table.gather(1, pos // BLOCK_SIZE) * BLOCK_SIZE + pos % BLOCK_SIZE
        slots.copy_(torch.where(offs < qlens.unsqueeze(1), slot, -1))

    set_meta([10, 200, 511, 900], [5, 1, 3, 5])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    set_meta([700, 3, 1000, 64], [2, 5, 1, 4])
    graph.replay()
    got = out.clone()
    step()
    torch.cuda.synchronize()
    valid = torch.arange(width, device=device) < qlens.unsqueeze(1)
    return bool(torch.equal(got[valid], out[valid]))


def bench(device, sweep_splits: bool) -> None:
    """Decode/verify timing. Each figure is a CUDA-graph replay of `reps` launches over disjoint
    KV regions (>= 512 MiB in all, so L2 cannot hold them), divided by `reps`: no launch overhead,
    no cache reuse. `eager` is one plain launch through the Python wrapper, for comparison."""
    import torch
    import triton

    from minedraft.engine.cuda import paged_attention_triton
    from minedraft.engine.cuda.paged_attention import _choose_splits, _launch_config

    heads, kvh, dim, ctx = 32, 8, 128, 1024
    cols = ctx // BLOCK_SIZE
    scale = dim**-0.5
    print(f"\ndecode benchmark: H={heads} Hkv={kvh} D={dim} bf16, context {ctx}, do_bench median")
    header = f"{'B':>4} {'Q':>3} {'splits':>6} {'graph us':>9} {'KV GB/s':>9} {'eager us':>9}"
    print(header + ("  best forced split" if sweep_splits else ""))

    def time_graph(qs, kc, vc, tables, starts, qlens, outs, splits):
        reps = qs.shape[0]

        def run_all():
            for r in range(reps):
                paged_attention_triton(qs[r], kc, vc, tables[r], starts, qlens, scale, out=outs[r], num_splits=splits)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run_all()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_all()
        return triton.testing.do_bench(graph.replay, return_mode="median") / reps

    for width in (1, 5):
        for batch in (1, 2, 4, 8, 16, 32, 64):
            kv_bytes = 2 * batch * ctx * kvh * dim * 2
            reps = max(2, min(256, -(-(512 << 20) // kv_bytes)))
            num_blocks = reps * batch * cols
            tables = torch.randperm(num_blocks, device=device).view(reps, batch, cols)
            kc = torch.randn(num_blocks, BLOCK_SIZE, kvh, dim, device=device, dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            qs = torch.randn(reps, batch, width, heads, dim, device=device, dtype=torch.bfloat16)
            outs = torch.empty_like(qs)
            starts = torch.full((batch,), ctx - width, dtype=torch.long, device=device)
            qlens = torch.full((batch,), width, dtype=torch.long, device=device)
            rows = width * (heads // kvh)
            block_m, block_n = _launch_config(rows, dim)[:2]
            splits = _choose_splits(triton.cdiv(rows, block_m) * batch * kvh, cols * BLOCK_SIZE, block_n, qs.device)
            ms = time_graph(qs, kc, vc, tables, starts, qlens, outs, None)
            eager_call = functools.partial(
                paged_attention_triton, qs[0], kc, vc, tables[0], starts, qlens, scale, out=outs[0]
            )
            eager = triton.testing.do_bench(eager_call, return_mode="median")
            line = f"{batch:>4} {width:>3} {splits:>6} {ms * 1e3:>9.1f} {kv_bytes / (ms * 1e-3) / 1e9:>9.1f} "
            line += f"{eager * 1e3:>9.1f}"
            if sweep_splits:
                forced = {n: time_graph(qs, kc, vc, tables, starts, qlens, outs, n) for n in (1, 2, 4, 8, 16)}
                best = min(forced, key=forced.get)
                line += f"  {best:>2}: {kv_bytes / (forced[best] * 1e-3) / 1e9:7.1f} GB/s"
            print(line, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    parser.add_argument("--quick", action="store_true", help="small sweep (for the CPU interpreter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-bench", action="store_true", help="skip the CUDA timing and graph check")
    parser.add_argument("--bench-only", action="store_true", help="CUDA: skip the correctness sweep")
    parser.add_argument("--sweep-splits", action="store_true", help="CUDA: also time forced key-split counts")
    parser.add_argument("--fused-only", action="store_true", help="only the fused norm/rope/SwiGLU kernels")
    args = parser.parse_args()

    if args.device == "cpu":
        # The interpreter must be selected before triton is first imported.
        if os.environ.get("TRITON_INTERPRET", "1") in ("", "0"):
            parser.error("--device cpu runs the kernels under Triton's interpreter: unset TRITON_INTERPRET=0")
        os.environ["TRITON_INTERPRET"] = "1"

    import torch

    from minedraft.engine.cuda import HAS_TRITON

    if not HAS_TRITON:
        print("triton is not installed", file=sys.stderr)
        return 2
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_name == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device", file=sys.stderr)
        return 2
    if device_name == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("CPU runs need TRITON_INTERPRET=1 (pass --device cpu)", file=sys.stderr)
        return 2
    device = torch.device(device_name)

    gen = torch.Generator().manual_seed(args.seed)
    if args.fused_only:
        failures = fused_checks(device, gen)
        print(f"fused kernels: {'all pass' if not failures else f'{failures} failed'}")
        return 1 if failures else 0
    cases = [] if args.bench_only and device_name == "cuda" else make_cases(args.quick, args.seed)
    failures = 0
    if cases:
        interpret = os.environ.get("TRITON_INTERPRET", "0")
        print(f"device={device_name} interpret={interpret} seed={args.seed} cases={len(cases)}")
        print(f"{'#':>3}  {'case':<78} {'rel err':>9}  {'result'}")
        began = time.perf_counter()
        for index, case in enumerate(cases):
            try:
                ok, err, written, pad_zero, cache_ok = run_case(case, device, gen)
                checks = (("unwritten", written), ("pad!=0", pad_zero), ("cache", cache_ok))
                notes = [name for name, good in checks if not good]
                status = "PASS" if ok else "FAIL " + " ".join(notes)
                err_text = f"{err:9.2e}"
            except Exception as exc:  # report and keep going
                ok, status, err_text = False, f"FAIL {type(exc).__name__}: {exc}"[:120], f"{'-':>9}"
            failures += not ok
            print(f"{index:>3}  {case.label():<78} {err_text}  {status}", flush=True)
        print(f"{len(cases) - failures}/{len(cases)} passed in {time.perf_counter() - began:.1f}s")
        failures += fused_checks(device, gen)

    if device_name == "cuda" and not args.no_bench:
        graph_ok = graph_check(device)
        print(f"cuda graph capture/replay with changed metadata: {'PASS' if graph_ok else 'FAIL'}")
        failures += not graph_ok
        bench(device, args.sweep_splits)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
