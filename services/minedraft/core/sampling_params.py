"""Per-request decoding settings, with the checks a request must pass (no torch here)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

from minedraft.core.errors import InvalidRequestError

MIN_TEMPERATURE = 1e-5  # below this, logits / temperature can overflow float32; use 0 for greedy


@dataclass(slots=True)
class SamplingParams:
    """Per-request decoding settings (OpenAI/vLLM names)."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequestError naming the first field that cannot be served."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}",
                                      param="max_tokens")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidRequestError(f"{name} must be a finite number, got {value!r}", param=name)
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}", param="temperature")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise InvalidRequestError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE}, got "
                                      f"{self.temperature}: smaller values overflow the scaled logits",
                                      param="temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0 (0 disables it), got {self.top_k}", param="top_k")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequestError(f"seed must be in [0, 2**63), got {self.seed}", param="seed")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty", param="stop")
        if vocab_size is not None and any(not 0 <= t < vocab_size for t in self.stop_token_ids):
            raise InvalidRequestError(f"stop_token_ids must be in [0, {vocab_size})", param="stop_token_ids")

    def resolved_seed(self) -> int:
        """The request's seed, drawn from the OS when the user gave none."""
        if self.seed is None:
            self.seed = secrets.randbits(63)
        return self.seed
