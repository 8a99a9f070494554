"""A worker's side of automatic prefix caching: look a new sequence up, publish what it verified.

The batch manager decides which sequences take part and with which salt (SeqSpec.prefix_cache);
the worker hashes their committed tokens block by block (core/prefix_hash.py) with the same keys
the manager computes. A sequence joining with the prefix cache attaches the longest cached run
of its full blocks (never its last token's block: that token's logits are needed), so its first
step computes only the rest. Only verified KV is published: the blocks fully inside the
committed tokens whose KV the worker holds, less the last committed position, which a draft
step may write again (engine/draft_ahead.py); drafted, unverified positions never are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minedraft.core.prefix_hash import extend_keys, reusable_blocks
from minedraft.engine.kv_cache import BlockAllocator
from minedraft.engine.sequence import SeqState


@dataclass(slots=True)
class SeqPrefix:
    salt: str | None
    keys: list[bytes] = field(default_factory=list)  # of the sequence's first full blocks, as far as hashed
    published: int = 0  # blocks published so far


@dataclass(slots=True)
class CacheCounts:
    """What a host's cache did since the counts were last taken (tokens, as vLLM counts them)."""

    queries: int = 0
    hits: int = 0
    prefill_tokens: int = 0
    evictions: int = 0


class PrefixCaching:
    """Lookups and publishing for the sequences of one host (one model, one KV cache)."""

    shift = 0  # block i is cached under the key of block i + shift (engine/eagle_prefix.py)

    def __init__(self, allocator: BlockAllocator) -> None:
        self.alloc = allocator
        self.seqs: dict[int, SeqPrefix] = {}
        self.counts = CacheCounts()
        self._evictions_seen = 0

    def admit(self, st: SeqState, salt: str | None, read: bool) -> int:
        """Track a sequence that just joined (holding no block); with `read`, attach its cached prefix and
        return the positions found (its KV now starts there)."""
        prefix = SeqPrefix(salt)
        self.seqs[st.seq_id] = prefix
        if not read:
            return 0
        bs = self.alloc.block_size
        keys = extend_keys(prefix.keys, st.tokens, bs, reusable_blocks(st.length, bs), salt)
        blocks = self.alloc.lookup(keys[self.shift:])
        self.counts.queries += st.length
        if blocks:
            self.alloc.attach(st.seq_id, blocks)
            st.cached = len(blocks) * bs
            prefix.published = len(blocks)
        self.counts.hits += st.cached
        return st.cached

    def publish(self, st: SeqState) -> None:
        """Publish the sequence's newly verified full blocks (call after its KV and tokens moved on)."""
        prefix = self.seqs.get(st.seq_id)
        if prefix is None:
            return
        bs = self.alloc.block_size
        count = self.publishable(st)
        if count <= prefix.published:
            return
        extend_keys(prefix.keys, st.tokens, bs, count + self.shift, prefix.salt)
        self.alloc.publish(st.seq_id, prefix.keys[self.shift:count + self.shift], prefix.published)
        prefix.published = count

    def publishable(self, st: SeqState) -> int:
        """Full blocks of verified KV: inside the committed tokens the KV holds, less the last position."""
        return min(st.cached, st.length - 1) // self.alloc.block_size

    def forget(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)

    def take_counts(self) -> CacheCounts:
        """The counts since the last call (then zero)."""
        counts, self.counts = self.counts, CacheCounts()
        counts.evictions = self.alloc.evictions - self._evictions_seen
        self._evictions_seen = self.alloc.evictions
        return counts
