"""The last layer past its attention runs on the rows whose logits are asked for, and nothing changes.

Prefill of ragged prompts (padded rows, a row shorter than `last_n`) with the narrowing, then decode
from the KV it wrote, against Hugging Face transformers on the same weights, for every architecture
(sliding window and q/k norms included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from tests.conftest import ARCH_CONFIGS, make_hf_model


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("arch", sorted(ARCH_CONFIGS))
def test_narrowed_prefill_then_decode_match_transformers(tmp_path: Path, arch: str) -> None:
    hf = make_hf_model(tmp_path, arch, seed=5)
    ours = ModelRunner(load_model(tmp_path), num_blocks=64, block_size=4)
    mlp_rows: list[int] = []
    last_mlp = ours.model.model.layers[-1].mlp
    last_mlp.register_forward_hook(lambda _m, args, _out: mlp_rows.append(args[0].shape[0] * args[0].shape[1]))
    torch.manual_seed(2)
    full = [torch.randint(0, 97, (n,)).tolist() for n in (19, 11, 2)]
    prompts = [full[0][:15], full[1][:8], full[2][:2]]
    with torch.no_grad():
        refs = [hf(torch.tensor([ids])).logits[0] for ids in full]
    out = ours.forward([0, 1, 2], prompts, [0, 0, 0], last_n=3)
    assert mlp_rows == [3 * 3]  # 3 rows x last_n, not the 3 x 15 padded prompt rows
    for row, (prompt, ref) in enumerate(zip(prompts[:2], refs[:2], strict=True)):
        assert relative_error(out[row], ref[len(prompt) - 3 : len(prompt)]) < 1e-4
    assert relative_error(out[2, 1:], refs[2][:2]) < 1e-4  # fed 2 of last_n = 3: the last two are real
    for row, (prompt, ids, ref) in enumerate(zip(prompts[:2], full[:2], refs[:2], strict=True)):
        steps = [ours.forward([row], [[t]], [pos], last_n=1)[0, 0] for pos, t in enumerate(ids[len(prompt):],
                                                                                           len(prompt))]
        assert relative_error(torch.stack(steps), ref[len(prompt):]) < 1e-4


def test_asking_for_more_positions_than_were_fed_repeats_the_first(tmp_path: Path) -> None:
    """The runner's contract for rows that fed fewer tokens than `last_n`, also when every row fed one."""
    make_hf_model(tmp_path, "llama", seed=6)
    ours = ModelRunner(load_model(tmp_path), num_blocks=64, block_size=4)
    ours.forward([0], [[3, 4, 5]], [0], last_n=1)
    out = ours.forward([0], [[6]], [3], last_n=3)
    assert out.shape == (1, 3, 97)
    assert torch.equal(out[0, 0], out[0, 2]) and torch.equal(out[0, 1], out[0, 2])
