"""A model runner plus the sequences it holds KV for: what the drafter and the verifier share."""

from __future__ import annotations

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.runner import ModelRunner
from minedraft.engine.sampling import BatchSampling
from minedraft.engine.sequence import SeqState


class SequenceHost:
    """A model runner plus the sequences it currently holds KV for."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.seqs: dict[int, SeqState] = {}

    @property
    def vocab_size(self) -> int:
        return self.runner.config.vocab_size

    def add(self, seq_id: int, tokens: list[int], params: SamplingParams, prompt_len: int | None = None) -> None:
        """Start tracking a sequence (`prompt_len`: how many of `tokens` are prompt; None: all); its KV is
        computed lazily on its first step."""
        if seq_id in self.seqs:
            raise KeyError(f"sequence {seq_id} is already present")
        params.resolved_seed()
        self.seqs[seq_id] = SeqState(seq_id, list(tokens), params, prompt_len=len(tokens) if prompt_len is None
                                     else prompt_len)

    def remove(self, seq_id: int) -> None:
        """Forget a sequence and give its KV blocks back at once."""
        self.seqs.pop(seq_id, None)
        self.runner.free(seq_id)

    def blocks_needed(self, seq_ids: list[int], lookahead: int) -> int:
        """Extra KV blocks a step with `lookahead` positions beyond the committed tokens needs."""
        alloc = self.runner.allocator
        return sum(alloc.extra_blocks_needed(s, self.seqs[s].length + lookahead) for s in seq_ids)

    def sampling(self, seq_ids: list[int]) -> BatchSampling:
        return BatchSampling.from_params([self.seqs[s].params for s in seq_ids], self.runner.device)
