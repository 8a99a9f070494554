"""Prefix caching and chunked prefill inside one worker: the allocator's cache (keys, reference counts, LRU
eviction, tail blocks first) and a real verifier and drafter that attach cached blocks, publish only verified
ones and compute prompts in chunks, with the same tokens and KV as one whole prefill. The batch manager's side
and the services: test_prefix_cache_serving.py."""

from __future__ import annotations

import pytest
import torch

from minedraft.core.prefix_hash import ROOT, block_key, extend_keys
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.kv_cache import BlockAllocator
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.worker.membership import apply_membership, cache_report

BS = 16


def keys_of(tokens: list[int], salt: str | None = None) -> list[bytes]:
    return extend_keys([], tokens, BS, len(tokens) // BS, salt)


# ----- keys and the allocator ----------------------------------------------------------------


def test_keys_chain_over_every_earlier_token_and_the_salt() -> None:
    a, b = list(range(40)), list(range(40))
    b[3] = 99
    assert keys_of(a)[0] == block_key(ROOT, a[:16]) and len(keys_of(a)) == 2
    assert keys_of(a)[1] != keys_of(b)[1]  # block 1 is equal, its prefix is not
    assert keys_of(a, "tenant-1")[0] != keys_of(a)[0] and keys_of(a, "tenant-1")[1] != keys_of(a)[1]
    assert keys_of(a, "tenant-1") == keys_of(a, "tenant-1")


def test_published_blocks_stay_cached_when_freed_and_are_evicted_least_recent_tail_first() -> None:
    alloc = BlockAllocator(6, BS)
    alloc.ensure(1, 3 * BS)
    first = alloc.table(1)
    alloc.publish(1, keys_of(list(range(48))), 0)
    assert alloc.num_cached == 3 and alloc.lookup(keys_of(list(range(48)))) == first
    alloc.free(1)
    assert alloc.num_free == 6 and alloc.num_cached == 3  # free, still cached
    alloc.ensure(2, 3 * BS)  # the three blocks that never held a prefix go first
    assert not set(alloc.table(2)) & set(first) and alloc.evictions == 0
    alloc.ensure(2, 4 * BS)  # then the least recent cached block: sequence 1's tail
    assert alloc.table(2)[3] == first[2] and alloc.evictions == 1
    assert alloc.lookup(keys_of(list(range(48)))) == first[:2]


def test_a_held_cached_block_is_never_evicted_and_attach_takes_it_off_the_free_list() -> None:
    alloc = BlockAllocator(4, BS)
    tokens = list(range(32))
    alloc.ensure(1, 32)
    alloc.publish(1, keys_of(tokens), 0)
    alloc.free(1)
    blocks = alloc.lookup(keys_of(tokens))
    alloc.attach(2, blocks)
    assert [alloc.refs(b) for b in blocks] == [1, 1] and alloc.num_free == 2
    alloc.attach(3, blocks[:1])
    assert alloc.refs(blocks[0]) == 2
    alloc.ensure(4, 2 * BS)  # every free block
    assert not set(alloc.table(4)) & set(blocks) and alloc.lookup(keys_of(tokens)) == blocks
    with pytest.raises(ValueError):
        alloc.attach(2, blocks)  # a sequence that holds blocks already
    for seq in (2, 3, 4):
        alloc.free(seq)
    assert alloc.num_free == 4 and all(alloc.refs(b) == 0 for b in range(4))


def test_content_cached_twice_keeps_the_second_block_private() -> None:
    alloc = BlockAllocator(4, BS)
    tokens = list(range(16))
    alloc.ensure(1, 16)
    alloc.ensure(2, 16)
    alloc.publish(1, keys_of(tokens), 0)
    alloc.publish(2, keys_of(tokens), 0)
    assert alloc.num_cached == 1 and alloc.lookup(keys_of(tokens)) == alloc.table(1)


# ----- a real worker ---------------------------------------------------------------------------


def plan(step: int, add: list[control_pb2.SeqSpec] = (), remove: list[int] = (), verify: list[int] = (),
         prefill: list[tuple[int, int]] = ()) -> control_pb2.StepPlan:
    return control_pb2.StepPlan(step=step, add=add, remove=remove, verify_batch=verify,
                                prefill=[control_pb2.PrefillChunk(seq_id=s, end=e) for s, e in prefill])


def spec(seq_id: int, tokens: list[int], salt: str = "", cache: bool = True,
         prompt_logprobs: int | None = None) -> control_pb2.SeqSpec:
    sampling = control_pb2.SeqSampling()
    if prompt_logprobs is not None:
        sampling.prompt_logprobs = prompt_logprobs
    return control_pb2.SeqSpec(seq_id=seq_id, tokens=tokens, prompt_len=len(tokens), prefix_cache=cache,
                               cache_salt=salt, sampling=sampling, skip_cache_read=prompt_logprobs is not None)


def greedy_ar(worker: Verifier, seq_id: int, steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        rows, _ = worker.commit([seq_id], worker.read_back(worker.judge([seq_id], None)))
        out.append(rows[0][0])
    return out


@pytest.fixture(scope="module")
def target(random_pair):
    return load_model(random_pair[0])


def verifier(target, num_blocks: int = 64) -> Verifier:
    return Verifier(ModelRunner(target, num_blocks, BS))


PROMPT = [(7 * i + 3) % 90 + 2 for i in range(3 * BS + 5)]  # 3 full blocks + 5 tokens


def test_a_repeated_prompt_attaches_its_full_blocks_and_decodes_the_same(target) -> None:
    worker = verifier(target)
    apply_membership(worker, plan(0, add=[spec(1, PROMPT)]))
    assert worker.seqs[1].cached == 0  # nothing cached yet
    cold = greedy_ar(worker, 1, 6)
    apply_membership(worker, plan(1, remove=[1], add=[spec(2, PROMPT)]))
    assert worker.seqs[2].cached == 3 * BS  # floor((16 * 3 + 5 - 1) / 16) blocks
    assert greedy_ar(worker, 2, 6) == cold
    stats = control_pb2.PrefixCacheStats()
    cache_report(worker, stats)
    assert (stats.queries, stats.hits) == (2 * len(PROMPT), 3 * BS)
    # its output is cached too: prompt + 6 tokens = 59 -> 3 blocks; + 12 -> 4 blocks (the 59th token's block)
    apply_membership(worker, plan(2, remove=[2], add=[spec(3, PROMPT + cold + [5, 6, 7, 8, 9])]))
    assert worker.seqs[3].cached == 3 * BS
    exact = PROMPT[:2 * BS]
    apply_membership(worker, plan(3, add=[spec(4, exact)]))  # ends on a block boundary: its last block recomputed
    assert worker.seqs[4].cached == BS


def test_salt_caching_off_and_prompt_logprobs_get_no_hit(target) -> None:
    worker = verifier(target)
    apply_membership(worker, plan(0, add=[spec(1, PROMPT, salt="a")]))
    greedy_ar(worker, 1, 1)
    apply_membership(worker, plan(1, add=[spec(2, PROMPT, salt="b"), spec(3, PROMPT, cache=False),
                                          spec(4, PROMPT, salt="a", prompt_logprobs=1), spec(5, PROMPT, salt="a")]))
    assert [worker.seqs[s].cached for s in (2, 3, 4, 5)] == [0, 0, 0, 3 * BS]


def test_only_verified_kv_is_published(target) -> None:
    """After a verify with rejected drafts, the blocks holding drafted positions are not cached."""
    worker = verifier(target)
    prompt = PROMPT[:BS + 2]  # 18 tokens
    apply_membership(worker, plan(0, add=[spec(1, prompt)]))
    drafts = torch.tensor([[95] * 14])  # almost surely all rejected: KV for 18..31 written, then dropped
    worker.commit([1], worker.read_back(worker.judge([1], Proposal(drafts, None))))
    st = worker.seqs[1]
    assert st.length <= 18 + 15 and worker.runner.allocator.num_cached == min(st.cached, st.length - 1) // BS


@pytest.mark.parametrize("chunk", [16, 21, 52])
def test_chunked_prefill_gives_the_kv_and_tokens_of_one_whole_prefill(target, chunk: int) -> None:
    whole, chunked = verifier(target), verifier(target)
    apply_membership(whole, plan(0, add=[spec(1, PROMPT, cache=False)]))
    expected = greedy_ar(whole, 1, 8)
    apply_membership(chunked, plan(0, add=[spec(1, PROMPT, cache=False)]))
    step, end = 1, 0
    while end < len(PROMPT) - 1:
        end = min(end + chunk, len(PROMPT) - 1)
        apply_membership(chunked, plan(step, prefill=[(1, end)]))
        assert chunked.seqs[1].cached == end
        step += 1
    assert greedy_ar(chunked, 1, 8) == expected
    for (k1, v1), (k2, v2) in zip(whole.runner.cache.layers, chunked.runner.cache.layers, strict=True):
        t1, t2 = whole.runner.allocator.table(1), chunked.runner.allocator.table(1)
        assert torch.allclose(k1[t1].flatten(0, 1)[:50], k2[t2].flatten(0, 1)[:50], atol=1e-5)
        assert torch.allclose(v1[t1].flatten(0, 1)[:50], v2[t2].flatten(0, 1)[:50], atol=1e-5)


def test_a_chunk_short_of_the_cache_does_nothing_and_one_past_it_computes_the_rest(target, random_pair) -> None:
    drafter = Drafter(ModelRunner(load_model(random_pair[1]), 64, BS))
    apply_membership(drafter, plan(0, add=[spec(1, PROMPT)], prefill=[(1, 40)]))
    assert drafter.seqs[1].cached == 40 and drafter.runner.allocator.num_cached == 2
    apply_membership(drafter, plan(1, add=[spec(2, PROMPT)], prefill=[(2, 20)]))
    assert drafter.seqs[2].cached == 32  # the cache reached further than the chunk
    apply_membership(drafter, plan(2, prefill=[(2, 100)]))
    assert drafter.seqs[2].cached == len(PROMPT) - 1  # never the last token: its logits are the first step's
    proposal = drafter.propose([2], 3)
    assert proposal.tokens.shape == (1, 3)
    stats = control_pb2.PrefixCacheStats()
    cache_report(drafter, stats)
    assert stats.prefill_tokens == 40 + (len(PROMPT) - 1 - 32) and stats.hits == 32
    assert SamplingParams().cache_salt is None


def test_block_tables_round_their_width_up_within_the_limit() -> None:
    """On the Triton path a growing context keeps one table-width class (no kernel compile mid-prompt)."""
    from minedraft.engine.config import ModelConfig
    from minedraft.engine.kv_cache import KVCache

    cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=4096,
                      tie_word_embeddings=False, qkv_bias=False, qk_norm=False)
    cache = KVCache(cfg, 64, BS)
    cache.allocator.ensure(1, 17 * BS)
    cache.allocator.ensure(2, 2 * BS)
    assert cache.block_table_tensor([1, 2], "cpu").shape == (2, 17)
    table = cache.block_table_tensor([1, 2], "cpu", multiple=16, limit=40)
    assert table.shape == (2, 32) and table[0, :17].tolist() == cache.allocator.table(1)
    assert table[1, 2:].tolist() == [0] * 30  # padding entries, never read
    assert cache.block_table_tensor([1], "cpu", multiple=16, limit=20).shape == (1, 20)
