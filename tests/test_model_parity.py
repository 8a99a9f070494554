"""Our model's logits against Hugging Face transformers on the same random weights."""

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
@pytest.mark.parametrize("tied", [False, True])
def test_prefill_and_incremental_decode_match_transformers(tmp_path: Path, arch: str, tied: bool) -> None:
    hf = make_hf_model(tmp_path, arch, seed=3, tie_word_embeddings=tied)
    ours = ModelRunner(load_model(tmp_path), num_blocks=64, block_size=4)
    torch.manual_seed(0)
    ids = torch.randint(0, 97, (2, 21))
    with torch.no_grad():
        ref = hf(ids).logits
    prompt_len = 13
    # Row 0: prefill 13 then decode one token at a time; row 1: prefill in one chunk of 21.
    out = ours.forward([0, 1], [ids[0, :prompt_len].tolist(), ids[1].tolist()], [0, 0], last_n=21)
    assert relative_error(out[1], ref[1]) < 1e-4
    assert relative_error(out[0, -prompt_len:], ref[0, :prompt_len]) < 1e-4
    tail = enumerate(ids[0, prompt_len:].tolist(), prompt_len)
    steps = [ours.forward([0], [[t]], [pos], last_n=1)[0, 0] for pos, t in tail]
    assert relative_error(torch.stack(steps), ref[0, prompt_len:]) < 1e-4
    ours.free(0)
    ours.free(1)
    assert ours.allocator.num_free == 64


def test_mixed_batch_of_prefill_and_multi_token_verify_windows(tmp_path: Path) -> None:
    """A prefill chunk and a 4-token window in one forward equal separate full passes."""
    hf = make_hf_model(tmp_path, "qwen2", seed=4)
    ours = ModelRunner(load_model(tmp_path), num_blocks=64, block_size=4)
    torch.manual_seed(1)
    a, b = torch.randint(0, 97, (1, 17)), torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        ref_a, ref_b = hf(a).logits[0], hf(b).logits[0]
    ours.forward([0], [a[0, :13].tolist()], [0], last_n=1)
    out = ours.forward([0, 1], [a[0, 13:].tolist(), b[0].tolist()], [13, 0], last_n=4)
    assert relative_error(out[0], ref_a[13:]) < 1e-4
    assert relative_error(out[1], ref_b[-4:]) < 1e-4
