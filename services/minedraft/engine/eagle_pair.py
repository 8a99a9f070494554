"""Building the two halves of EAGLE drafting: a target runner that captures, a head drafter beside it.

`--draft-kind eagle` makes the verifier capture what the head reads (its config says which states) and
the draft side load the head with the target's embedding and lm_head copied onto its own device.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minedraft.engine.eagle_config import load_eagle_config
from minedraft.engine.eagle_drafter import EagleDrafter
from minedraft.engine.eagle_loader import TargetShared, load_eagle_head, load_head_for_target, target_shared
from minedraft.engine.eagle_runner import EagleRunner
from minedraft.engine.hidden_capture import CapturingRunner
from minedraft.engine.model import CausalLM


def capturing_runner(model: CausalLM, head_dir: str | Path, num_blocks: int, block_size: int,
                     device: str | torch.device, keeps: bool = True) -> CapturingRunner:
    """The target's runner, keeping what the head reads: the layers whose inputs an EAGLE-3 head taps, or
    (EAGLE-1/2) the last hidden state. A tensor-parallel follower runs the same forwards (their all-reduces
    must match rank 0's) but keeps nothing (`keeps` False): only rank 0 ships states."""
    taps = load_eagle_config(head_dir, model.config).aux_layers
    return CapturingRunner(model, num_blocks, block_size, device, taps, keeps=keeps)


def head_drafter(head_dir: str | Path, target_dir: str | Path, num_blocks: int, block_size: int,
                 device: str | torch.device, dtype: torch.dtype, shared: TargetShared = target_shared) -> EagleDrafter:
    """A draft service's head: reads only the target's embedding and lm_head (from its folder by default)."""
    head = load_head_for_target(head_dir, target_dir, device, dtype, shared)
    return EagleDrafter(EagleRunner(head, num_blocks, block_size, device))


def head_beside(model: CausalLM, head_dir: str | Path, num_blocks: int, block_size: int,
                device: str | torch.device, dtype: torch.dtype) -> EagleDrafter:
    """A head next to a loaded target (colocated, in-process): its embedding and head copied over."""
    head = load_eagle_head(head_dir, model.model.embed_tokens.weight, model.lm_head.weight, model.config, device,
                           dtype)
    head.source_dir = model.source_dir
    return EagleDrafter(EagleRunner(head, num_blocks, block_size, device))
