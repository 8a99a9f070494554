"""What a worker (draft or target side) remembers about one sequence."""

from __future__ import annotations

from dataclasses import dataclass

from minedraft.core.sampling_params import SamplingParams


@dataclass(slots=True)
class SeqState:
    """Committed tokens (prompt + accepted output) and how many of them are in the KV cache."""

    seq_id: int
    tokens: list[int]
    params: SamplingParams
    cached: int = 0
    prompt_len: int = 0  # tokens[:prompt_len] are the prompt; the rest is output (penalties tell them apart)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def uncached(self) -> list[int]:
        return self.tokens[self.cached :]
