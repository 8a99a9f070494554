"""Drafting from a verdict on the device (engine/draft_ahead.py) on a GPU: the CUDA-graph replay with
device-side starts (`GraphCache.replay_on_device`) against the host path, bundled draft, fp32.

The bookkeeping must be identical; the drafts nearly so (the ahead path re-writes one cached position's
KV in a two-token forward, whose kernels may round differently from the one-token forward that wrote it)."""

from __future__ import annotations

import torch

from minedraft.bundled import TINY_DRAFT
from tests.test_draft_ahead import ahead_against_host


def test_drafts_ahead_on_cuda_match_the_host_path(cuda_device: torch.device) -> None:
    agreement = ahead_against_host(TINY_DRAFT, str(cuda_device))
    print(f"draft-ahead vs host path on {torch.cuda.get_device_name(cuda_device)}: {agreement:.3f} of drafts equal")
    assert agreement >= 0.95
