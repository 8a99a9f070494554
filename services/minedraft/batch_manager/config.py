"""Batch manager settings: what a deployment (or a live SpeculationPolicy) chooses."""

from __future__ import annotations

from dataclasses import dataclass

from minedraft.core.errors import InvalidRequestError
from minedraft.core.validation import validate_k

MODES = ("psd", "sd", "ar", "auto")
POLICY_FIELDS = ("mode", "k", "max_num_seqs", "pipeline_depth")


@dataclass(slots=True)
class ManagerConfig:
    """Mode, k, batch caps and fallback thresholds of one batch manager."""

    mode: str = "psd"
    k: int = 4
    max_num_seqs: int = 64
    max_queue: int = 1024
    pipeline_depth: int = 2
    data_plane_backend: str = "gloo"
    data_plane_timeout_s: int = 20
    draft_retry_s: float = 1.0
    auto_min_tokens_per_step: float = 1.3
    auto_probe_steps: int = 200

    def policy(self) -> dict[str, object]:
        """The live-tunable part (what GET/PUT /admin/policy show)."""
        return {name: getattr(self, name) for name in POLICY_FIELDS}

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InvalidRequestError(f"mode must be one of {MODES}, got {self.mode!r}")
        validate_k(self.k)
        if self.pipeline_depth < 1 or self.max_num_seqs < 1:
            raise InvalidRequestError("pipeline_depth and max_num_seqs must be >= 1")
