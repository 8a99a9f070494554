"""An EAGLE head's prefix cache: its block i holds pairs reaching token 16(i+1), so it is keyed through it."""

from __future__ import annotations

from pathlib import Path

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.eagle_pair import head_beside
from minedraft.engine.loader import load_model
from tests.eagle_support import write_eagle_head


def test_a_head_block_is_reused_only_with_the_token_after_it(random_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target_dir, _ = random_pair
    head = write_eagle_head(tmp_path / "head", target_dir, "safeailab-eagle")
    drafter = head_beside(load_model(target_dir), head, 64, 16, "cpu", torch.float32)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    first = [(3 * i) % 90 + 2 for i in range(50)]
    drafter.add(1, first, params, prefix_cache=True)
    drafter.commit(1, [60], 0, (0, torch.randn(51, 64)))  # the target's states for every position so far
    drafter.propose([1], 2)
    assert drafter.seqs[1].cached == 50  # pairs 0..49 are true
    assert drafter.features_received == 50
    # Same first 16 tokens, another 17th: a draft model would share block 0, the head's block 0 read token 16.
    drafter.add(2, [*first[:16], 95, *first[17:]], params, prefix_cache=True)
    assert drafter.seqs[2].cached == 0
    drafter.add(3, [*first[:48], 5, 6], params, prefix_cache=True)  # blocks 0 and 1 with their successors
    assert drafter.seqs[3].cached == 32
