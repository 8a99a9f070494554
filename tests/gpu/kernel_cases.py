"""Random mixed batches for the paged-attention kernel, and one case's run against the reference.

Every case draws fresh random inputs: a batch mixing decode (1), verify windows (3, 5, 7)
and prefill chunks (up to 300 tokens) at contexts up to ~1000, shuffled non-contiguous
block tables, GQA, optional sliding window. The KV cache starts out NaN everywhere except
each sequence's history, the step's keys/values are stored with `write_kv_triton` (compared
bit-exactly with `attention.write_kv`), and the attention output buffer is NaN-poisoned
before the kernel runs. The reference (`attention.build_metadata` + `attention.paged_attention`)
runs in float32 on CPU on the same (dtype-rounded) values.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

TOLERANCE = {"fp32": 1e-3, "bf16": 2e-2}
BLOCK_SIZE = 16


@dataclass(frozen=True)
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
        return (f"{self.dtype}-D{self.head_dim}-kv{self.kv_heads}x{self.group}-win{win}-split{splits}"
                f"-B{len(self.query_lens)}-q[{lens}]-ctx{max(self.contexts)}")


@dataclass(frozen=True)
class Outcome:
    rel_err: float
    written: bool  # every valid output element was written (no NaN left)
    pad_zero: bool  # padding query tokens are zeros
    cache_ok: bool  # the Triton KV write equals the reference write bit for bit


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


CORNERS = [
    # Pure decode, pure verify, one long prefill chunk, split-KV decode.
    ("fp32", 64, 2, 4, None, 1, [1, 1, 1], [1, 17, 700]),
    ("bf16", 128, 1, 4, None, 3, [5, 5], [5, 1000]),
    ("fp32", 128, 2, 1, None, None, [300], [300]),
    ("bf16", 64, 1, 4, 64, None, [7, 1, 300], [520, 64, 900]),
    ("fp32", 64, 1, 4, 100, 4, [1, 3], [999, 160]),
    # Empty rows (graph-bucket padding), window 1, a non-power-of-two group, window > context.
    ("bf16", 128, 1, 7, 1, None, [0, 5, 1], [0, 40, 33]),
    ("fp32", 64, 2, 8, 2000, 2, [0, 3, 9], [50, 300, 9]),
]


def make_cases(count: int, quick: bool, seed: int = 0) -> list[Case]:
    """The fixed corners, then `count` random cases (smaller ones when `quick`, for the interpreter)."""
    rng = random.Random(seed)
    cases = [Case(d, dim, kvh, grp, win, splits, q, c, 1, False) for d, dim, kvh, grp, win, splits, q, c in CORNERS]
    for _ in range(count):
        batch = rng.randint(1, 4 if quick else 8)
        rows = [_row(rng, 300 if not quick or rng.random() < 0.3 else 40, 1000) for _ in range(batch)]
        cases.append(Case(
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
        ))
    return cases


def block_table(need: list[int], extra_cols: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """A shuffled table; padding columns point at blocks no row owns (they stay NaN)."""
    max_blocks = max(need) + extra_cols
    num_blocks = sum(need) + 8
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    spare = perm[sum(need):]
    table = torch.empty((len(need), max_blocks), dtype=torch.long)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(perm[used : used + n])
        used += n
        for col in range(n, max_blocks):
            table[b, col] = spare[(b + col) % len(spare)]
    return table, num_blocks


def run_case(case: Case, device: torch.device, gen: torch.Generator) -> Outcome:
    from minedraft.engine import attention
    from minedraft.engine.cuda import paged_attention_triton, write_kv_triton

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[case.dtype]
    batch, width = len(case.query_lens), max(case.query_lens)
    kvh, dim = case.kv_heads, case.head_dim
    heads = kvh * case.group
    starts = [c - q for c, q in zip(case.contexts, case.query_lens, strict=True)]
    table, num_blocks = block_table([-(-c // BLOCK_SIZE) for c in case.contexts], case.extra_cols, gen)

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
    q, k, v = fused[:, :, :heads], fused[:, :, heads : heads + kvh], fused[:, :, heads + kvh :]
    if not case.strided_q:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()

    qlens = torch.tensor(case.query_lens, dtype=torch.long)
    start_t = torch.tensor(starts, dtype=torch.long)
    valid = torch.arange(width).unsqueeze(0) < qlens.unsqueeze(1)
    meta = attention.build_metadata(start_t, qlens, width, table, BLOCK_SIZE, case.window)
    scale = dim**-0.5

    # Reference on CPU: NaN-free copy of the cache, plain-torch write and attention in fp32.
    ref_k, ref_v = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    attention.write_kv(ref_k, ref_v, k, v, meta)
    ref = attention.paged_attention(q.float(), ref_k.float(), ref_v.float(), meta, scale)

    dk, dv = k_cache.to(device), v_cache.to(device)
    write_kv_triton(dk, dv, k.to(device), v.to(device), meta.slot_mapping.to(device))
    q_dev = fused.to(device)[:, :, :heads] if case.strided_q else q.to(device)
    out = torch.full((batch, width, heads, dim), float("nan"), dtype=dtype, device=device)
    paged_attention_triton(q_dev, dk, dv, table.to(device), start_t.to(device), qlens.to(device), scale,
                           case.window, out=out, num_splits=case.splits)
    out, dk, dv = out.cpu(), dk.cpu(), dv.cpu()

    got, want = out[valid].float(), ref[valid]
    return Outcome(
        rel_err=float((got.nan_to_num(1e6) - want).norm() / want.norm()),
        written=not bool(torch.isnan(got).any()),
        pad_zero=bool((out[~valid] == 0).all()),
        cache_ok=torch.equal(dk.nan_to_num(0.0), ref_k) and torch.equal(dv.nan_to_num(0.0), ref_v),
    )
