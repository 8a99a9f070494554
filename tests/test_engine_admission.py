"""The in-process engine's admission: it admits while the next step's KV fits, stops at the first request that
does not, and its work grows linearly with the batch it admits (the running batch's need is summed once, not
again for every request admitted)."""

from __future__ import annotations

from pathlib import Path

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.kv_cache import BlockAllocator
from tests.conftest import engine_from_folders


def admitted(target: Path, draft: Path, requests: int, num_blocks: int) -> tuple[int, int]:
    """How many of `requests` one-block prompts the first step runs, and how many per-sequence block counts
    admission asked for."""
    engine = engine_from_folders(target, draft, "sd", k=2, block_size=4, num_blocks=num_blocks,
                                 max_num_seqs=requests)
    for i in range(requests):
        engine.add_request([2 + i % 50], SamplingParams(max_tokens=1, ignore_eos=True))
    calls = [0]
    count = BlockAllocator.extra_blocks_needed

    def counting(self: BlockAllocator, seq_id: int, num_tokens: int) -> int:
        calls[0] += 1
        return count(self, seq_id, num_tokens)

    BlockAllocator.extra_blocks_needed = counting  # type: ignore[method-assign]
    try:
        engine._admit()
    finally:
        BlockAllocator.extra_blocks_needed = count  # type: ignore[method-assign]
    return len(engine.running), calls[0]


def test_admission_is_linear_in_the_batch_and_stops_where_the_kv_runs_out(random_pair) -> None:
    target, draft = random_pair
    small, small_calls = admitted(target, draft, 100, 1024)
    large, large_calls = admitted(target, draft, 800, 4096)
    assert (small, large) == (100, 800)
    assert small_calls <= 2 * 100 and large_calls <= 2 * 800, (small_calls, large_calls)  # one per model each
    # A prompt of one token plus k drafts needs one block on each model: 60 blocks hold 60 sequences.
    capped, _ = admitted(target, draft, 100, 60)
    assert capped == 60
