"""An EAGLE head drafting from a verdict on the device (engine/eagle_ahead.py) on a GPU: the first forward's
CUDA-graph replay with device-side starts and lengths against the host path, bundled head, fp32.

The bookkeeping must be identical; the drafts nearly so (the ahead path's first forward is kd + 1 wide whatever
the verdict accepted, so its kernels may round differently from the host path's, which is as wide as the
accepted tokens)."""

from __future__ import annotations

import torch

from tests.test_eagle_draft_ahead import head_ahead_against_host


def test_head_drafts_ahead_on_cuda_match_the_host_path(cuda_device: torch.device) -> None:
    agreement = head_ahead_against_host(str(cuda_device))
    print(f"head draft-ahead vs host path on {torch.cuda.get_device_name(cuda_device)}: {agreement:.3f} equal")
    assert agreement >= 0.95
