"""Prefix caching for an EAGLE head, whose KV at position p depends on token p+1.

A head's block i (positions 16i..16i+15) holds pairs (token p+1, the target's state at p), so its content
is fixed by the tokens up to 16i+16, the first token of block i+1. Two prompts that share block i's
tokens but not the next token must not share the head's block i. So the head publishes block i under the
key of block i+1 (the hash chain through the next full block, a successor-aware key), and a sequence
with n reusable blocks attaches at most n-1 of the head's. The keys are still the batch manager's
(core/prefix_hash.py), shifted by one block.
"""

from __future__ import annotations

from minedraft.engine.prefix_cache import PrefixCaching
from minedraft.engine.sequence import SeqState


class ShiftedPrefixCaching(PrefixCaching):
    shift = 1

    def publishable(self, st: SeqState) -> int:
        """Block i is true once the pairs through its end are fed; its key needs block i+1's tokens."""
        return min(st.cached // self.alloc.block_size, st.length // self.alloc.block_size - 1)
