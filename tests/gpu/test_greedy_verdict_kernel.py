"""The greedy verdict kernel (engine/cuda/greedy_verdict.py) against the torch rule in engine/rejection.py:
the same packed rows (accepted count, emitted tokens, -1 past them) and counts, for full and ragged rows,
k = 0 (AR) to 6, rows that agree everywhere, nowhere and up to a random slot; on CUDA, through
`verify_drafts` too."""

from __future__ import annotations

import pytest
import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.rejection import verify_drafts
from minedraft.engine.sampling import BatchSampling


def case(batch: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target argmax [B, k+1], drafts [B, k] agreeing with it up to a per-row slot (some rows all the way,
    some -1 pruned slots), and ragged lengths [B]."""
    gen = torch.Generator().manual_seed(seed)
    argmax = torch.randint(0, 50, (batch, k + 1), generator=gen)
    drafts = argmax[:, :k].clone()
    agree_to = torch.randint(0, k + 1, (batch,), generator=gen)
    agree_to[0] = k  # one row agrees everywhere (its bonus slot emits), ...
    agree_to[-1] = 0 if batch > 1 else k  # ... and one nowhere
    for b in range(batch):
        if agree_to[b] < k:
            drafts[b, agree_to[b]] = (argmax[b, agree_to[b]] + 1) % 50
        if b % 5 == 3 and k:
            drafts[b, -1] = -1
    lengths = torch.randint(0, k + 1, (batch,), generator=gen)
    return argmax, drafts, lengths


def reference(argmax: torch.Tensor, drafts: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """The packed verdict, row by row in Python."""
    k = drafts.shape[1]
    rows = []
    for b in range(argmax.shape[0]):
        limit = k if lengths is None else int(lengths[b])
        n = 0
        while n < limit and int(drafts[b, n]) == int(argmax[b, n]):
            n += 1
        rows.append([n] + [int(argmax[b, s]) if s <= n else -1 for s in range(k + 1)])
    return torch.tensor(rows, dtype=torch.long)


@pytest.mark.parametrize("batch, k", [(1, 0), (3, 1), (5, 4), (64, 4), (17, 6)])
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
def test_the_kernel_writes_the_rules_packed_verdict(batch: int, k: int, ragged: bool,
                                                    kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.greedy_verdict import greedy_verdict_triton

    argmax, drafts, lengths = case(batch, k, 100 * batch + k)
    lens = lengths if ragged else None
    packed, counts = greedy_verdict_triton(argmax.to(kernel_device), drafts.to(kernel_device),
                                           None if lens is None else lens.to(kernel_device))
    want = reference(argmax, drafts, lens)
    assert packed.cpu().tolist() == want.tolist()
    assert counts.cpu().tolist() == (want[:, 0] + 1).tolist()
    if not ragged and batch > 1:
        assert int(want[0, 0]) == k and int(want[-1, 0]) == 0


@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
def test_verify_drafts_on_cuda_equals_the_torch_rule(ragged: bool, cuda_device: torch.device) -> None:
    argmax, drafts, lengths = case(33, 4, 7)
    logits = torch.full((33, 5, 50), -3.0)
    logits.scatter_(2, argmax.unsqueeze(2), 4.0)
    positions = torch.arange(5).expand(33, 5)
    rows = [SamplingParams(temperature=0.0)] * 33
    sampling = BatchSampling.from_params(rows, torch.device("cpu"))
    assert sampling.all_greedy
    want = verify_drafts(drafts, None, logits, logits, sampling, positions, lengths if ragged else None)
    on = BatchSampling.from_params(rows, cuda_device)
    got = verify_drafts(drafts.to(cuda_device), None, logits.to(cuda_device), logits.to(cuda_device), on,
                        positions.to(cuda_device), lengths.to(cuda_device) if ragged else None)
    assert got.packed is not None and got.packed.cpu().tolist() == want.packed.tolist()  # type: ignore[union-attr]
    assert got.tokens.cpu().tolist() == want.tokens.tolist()
    assert got.accepted.cpu().tolist() == want.accepted.tolist() == reference(argmax, drafts, lengths if ragged
                                                                              else None)[:, 0].tolist()
    assert got.counts.cpu().tolist() == want.counts.tolist()
