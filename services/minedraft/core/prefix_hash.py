"""Content keys of full KV blocks, for automatic prefix caching.

A block's key chains its parent's key with the block's token ids, so equal keys mean equal
tokens at equal positions from the start of the sequence, hence equal KV on one model. The
optional salt joins only the first block's key: it then separates every later block too, so
requests of different salts never share a block (vLLM's cache_salt). The chain starts from a
fixed root and uses sha256, so the batch manager and both workers, in separate processes,
compute the same keys without exchanging them.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

ROOT = hashlib.sha256(b"minedraft prefix cache v1").digest()


def block_key(parent: bytes, tokens: Sequence[int], salt: str | None = None) -> bytes:
    digest = hashlib.sha256(parent)
    digest.update(array("q", tokens).tobytes())
    if salt:
        digest.update(b"\x00salt\x00" + salt.encode())
    return digest.digest()


def extend_keys(keys: list[bytes], tokens: Sequence[int], block_size: int, num_blocks: int,
                salt: str | None = None) -> list[bytes]:
    """Grow `keys` (those of the first blocks of `tokens`) to cover the first `num_blocks` full blocks."""
    num_blocks = min(num_blocks, len(tokens) // block_size)
    while len(keys) < num_blocks:
        i = len(keys)
        parent = keys[-1] if keys else ROOT
        keys.append(block_key(parent, tokens[i * block_size:(i + 1) * block_size], salt if i == 0 else None))
    return keys


def reusable_blocks(num_tokens: int, block_size: int) -> int:
    """Full blocks a sequence of `num_tokens` may take from the cache: its last token is always computed
    (its logits are needed), so a prompt that ends on a block boundary recomputes that whole block."""
    return max(0, num_tokens - 1) // block_size
