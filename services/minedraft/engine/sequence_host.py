"""A model runner plus the sequences it holds KV for: what the drafter and the verifier share."""

from __future__ import annotations

import logging

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.grammar import GrammarMasks
from minedraft.engine.prefix_cache import PrefixCaching
from minedraft.engine.runner import ModelRunner
from minedraft.engine.sampling import BatchSampling
from minedraft.engine.sequence import SeqState

log = logging.getLogger(__name__)


class SequenceHost:
    """A model runner plus the sequences it currently holds KV for."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.seqs: dict[int, SeqState] = {}
        self.shared_tokens = 0  # prompt positions forks took from a sibling instead of computing them
        self.prefix = PrefixCaching(runner.allocator)
        self.grammars = GrammarMasks(runner.config.vocab_size, runner.device, runner.config.eos_token_ids)
        self.grammars.tokenizer_dir = getattr(runner.model, "source_dir", None)

    @property
    def vocab_size(self) -> int:
        return self.runner.config.vocab_size

    def add(self, seq_id: int, tokens: list[int], params: SamplingParams, prompt_len: int | None = None,
            prefix_cache: bool = False, cache_salt: str | None = None, read_cache: bool = True) -> None:
        """Start tracking a sequence (`prompt_len`: how many of `tokens` are prompt; None: all); its KV is
        computed lazily on its first step or by `prefill` chunks. With `prefix_cache` it starts from its cached
        prefix (unless not `read_cache`) and publishes its verified blocks."""
        if seq_id in self.seqs:
            raise KeyError(f"sequence {seq_id} is already present")
        params.resolved_seed()
        st = SeqState(seq_id, list(tokens), params, prompt_len=len(tokens) if prompt_len is None else prompt_len)
        self.seqs[seq_id] = st
        if params.structured is not None:
            self.grammars.add(seq_id, params.structured.grammar(), st.tokens[st.prompt_len:])
        if prefix_cache:
            self.prefix.admit(st, cache_salt, read_cache)

    def prefill(self, chunks: list[tuple[int, int]]) -> int:
        """Compute the KV of tokens[:end] for each (seq id, end), from where each sequence's KV reaches, in one
        forward (the logits are not needed: a chunk never reaches the last token). Returns the tokens fed."""
        rows = []
        for seq_id, end in chunks:
            st = self.seqs.get(seq_id)
            if st is not None and min(end, st.length - 1) > st.cached:
                rows.append((st, min(end, st.length - 1)))
        if not rows:
            return 0
        self.runner.forward([st.seq_id for st, _ in rows], [st.tokens[st.cached:end] for st, end in rows],
                            [st.cached for st, _ in rows], last_n=1)
        fed = sum(end - st.cached for st, end in rows)
        for st, end in rows:
            st.cached = end
            self.prefix.publish(st)
        self.prefix.counts.prefill_tokens += fed
        return fed

    def fork(self, seq_id: int, parent_id: int, num_tokens: int) -> int:
        """Right after `add`: let `seq_id` share the KV of its first `num_tokens` tokens (whole blocks, its last
        token excluded) with `parent_id`, when the parent is here with those tokens cached and the same ones.
        Returns the positions shared; 0 leaves the sequence to compute its prompt itself (still exact)."""
        child, parent = self.seqs.get(seq_id), self.seqs.get(parent_id)
        alloc = self.runner.allocator
        if child is None or parent is None or child.cached or seq_id == parent_id or alloc.table(seq_id):
            return 0
        num_tokens = min(num_tokens, child.length)
        span = (max(0, num_tokens - 1) // alloc.block_size) * alloc.block_size
        if span == 0 or parent.cached < span or parent.tokens[:span] != child.tokens[:span]:
            return 0
        child.cached = alloc.share(parent_id, seq_id, num_tokens)
        self.shared_tokens += child.cached
        log.info("sequence %d shares %d prompt tokens of sequence %d's KV", seq_id, child.cached, parent_id)
        return child.cached

    def remove(self, seq_id: int) -> None:
        """Forget a sequence and give its KV blocks back at once."""
        self.seqs.pop(seq_id, None)
        self.prefix.forget(seq_id)
        self.grammars.forget(seq_id)
        self.runner.free(seq_id)

    def blocks_needed(self, seq_ids: list[int], lookahead: int) -> int:
        """Extra KV blocks a step with `lookahead` positions beyond the committed tokens needs."""
        alloc = self.runner.allocator
        return sum(alloc.extra_blocks_needed(s, self.seqs[s].length + lookahead) for s in seq_ids)

    def sampling(self, seq_ids: list[int]) -> BatchSampling:
        return BatchSampling.from_params([self.seqs[s].params for s in seq_ids], self.runner.device)
