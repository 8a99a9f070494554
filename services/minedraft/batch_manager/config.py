"""Batch manager settings: what a deployment (or a live SpeculationPolicy) chooses."""

from __future__ import annotations

from dataclasses import dataclass

from minedraft.batch_manager.policy import POLICY_NAMES, check_policy
from minedraft.core.errors import InvalidRequestError

DATA_PLANE_BACKENDS = ("gloo", "nccl")  # torch.distributed backends of the draft link: CPU, GPU
# Per-step token budget by the verifier's device type when --max-num-batched-tokens is 0. Small on a CPU, where
# a prompt token costs about a third of a millisecond on the bundled pair: a chunk must not stall decodes.
DEFAULT_BATCHED_TOKENS = {"cpu": 96, "cuda": 2048}
MIN_BATCHED_TOKENS = 16


@dataclass(slots=True)
class ManagerConfig:
    """Mode, k, batch caps and fallback thresholds of one batch manager.

    The fields named in `policy.POLICY_FIELDS` are live (GET/PUT /admin/policy); the others
    are fixed for the life of the process.
    """

    mode: str = "psd"
    k: int = 4
    k_min: int = 1
    max_num_seqs: int = 64
    pipeline_depth: int = 2
    rebalance_threshold: float = 0.0
    auto_min_tokens_per_step: float = 1.3
    auto_probe_steps: int = 200
    draft_selection: str = "fixed"
    tetris_extra: int = 3
    tetris_min_batch: int = 32
    max_queue: int = 1024
    data_plane_backend: str = "gloo"
    data_plane_timeout_s: int = 20
    draft_retry_s: float = 1.0
    stream_interval: int = 1  # a streaming request's chunk waits for this many new tokens (its first and last do not)
    # A verifier that loaded the draft model too (--colocated-draft) drafts while the draft service is lost
    # (instead of plain decoding); without it such a verifier leaves a configured draft service out.
    draft_stand_in: bool = False
    # Automatic prefix caching on both workers (vLLM's --enable-prefix-caching, on by default).
    enable_prefix_caching: bool = True
    # Verifier tokens per step: verify rows (k + 1 each) plus prompt chunks (vLLM's --max-num-batched-tokens);
    # 0: the default for the verifier's device (DEFAULT_BATCHED_TOKENS).
    max_num_batched_tokens: int = 0

    def policy(self) -> dict[str, object]:
        """The live-tunable part (what GET/PUT /admin/policy show)."""
        return {name: getattr(self, name) for name in POLICY_NAMES}

    def validate(self) -> None:
        check_policy(self.policy())
        if self.k_min > self.k:
            raise InvalidRequestError(f"k_min ({self.k_min}) must be <= k ({self.k})", param="k_min")
        if self.max_queue < 0:
            raise InvalidRequestError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.data_plane_backend not in DATA_PLANE_BACKENDS:
            raise InvalidRequestError(
                f"data_plane_backend must be one of {list(DATA_PLANE_BACKENDS)}, got {self.data_plane_backend!r}")
        if self.stream_interval < 1:
            raise InvalidRequestError(f"stream_interval must be >= 1 token, got {self.stream_interval}",
                                      param="stream_interval")
        if self.max_num_batched_tokens and self.max_num_batched_tokens < MIN_BATCHED_TOKENS:
            raise InvalidRequestError(f"max_num_batched_tokens must be 0 (the device's default) or >= "
                                      f"{MIN_BATCHED_TOKENS}, got {self.max_num_batched_tokens}",
                                      param="max_num_batched_tokens")
        if self.data_plane_timeout_s < 1 or self.draft_retry_s < 0:
            raise InvalidRequestError("data_plane_timeout_s must be >= 1 and draft_retry_s >= 0")
