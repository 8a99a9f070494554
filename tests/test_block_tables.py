"""Block tables kept between forwards (engine/block_tables.py).

A kept table must equal the one `KVCache.block_table_tensor` builds for the same batch after any change
the allocator makes (adds, growth, truncation, frees, preemption and re-admission, prefix attaches,
forks), and be reused without rewriting a row when nothing changed: the draft's k forwards share one."""

from __future__ import annotations

import random

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.block_tables import BlockTables
from minedraft.engine.config import ModelConfig
from minedraft.engine.drafter import Drafter
from minedraft.engine.kv_cache import KVCache
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner


def cache(num_blocks: int = 64, block_size: int = 4) -> KVCache:
    cfg = ModelConfig(family="llama", vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
                      num_kv_heads=1, head_dim=8, rms_norm_eps=1e-5, max_position_embeddings=64,
                      tie_word_embeddings=False, qkv_bias=False, qk_norm=False)
    return KVCache(cfg, num_blocks, block_size)


def assert_fresh(tables: BlockTables, kv: KVCache, ids: list[int]) -> None:
    got = tables.get(ids).host
    want = kv.block_table_tensor(ids, "cpu", tables.multiple, tables.limit)
    assert got.shape == want.shape and torch.equal(got, want), (ids, got, want)


def test_a_kept_table_equals_a_fresh_one_after_every_kind_of_change() -> None:
    rng = random.Random(5)
    for multiple, limit in ((1, 0), (4, 10)):
        kv = cache()
        alloc = kv.allocator
        tables = BlockTables(alloc, multiple, limit)
        live: dict[int, int] = {}  # seq id -> tokens it holds blocks for
        next_id = 0
        for _ in range(400):
            op = rng.choice(("add", "grow", "grow", "truncate", "free", "preempt", "fork", "attach"))
            if live and alloc.num_free < 4:
                op = "free"
            if op == "add" or not live:
                live[next_id] = rng.randint(1, 12)
                alloc.ensure(next_id, live[next_id])
                next_id += 1
            elif op == "grow":
                s = rng.choice(list(live))
                live[s] = min(live[s] + rng.randint(0, 6), 36)
                if alloc.extra_blocks_needed(s, live[s]) <= alloc.num_free:
                    alloc.ensure(s, live[s])
            elif op == "truncate":
                s = rng.choice(list(live))
                alloc.truncate(s, rng.randint(0, len(alloc.table(s)) * kv.block_size))
            elif op in ("free", "preempt"):
                s = rng.choice(list(live))
                alloc.free(s)
                if op == "preempt" and alloc.num_free >= 3:  # requeued for recompute under the same id
                    alloc.ensure(s, 9)
                else:
                    del live[s]
            elif op == "fork" and alloc.table(parent := rng.choice(list(live))):
                alloc.share(parent, next_id, len(alloc.table(parent)) * kv.block_size)
                live[next_id] = 1
                next_id += 1
            elif op == "attach":
                s = rng.choice(list(live))
                blocks = alloc.table(s)[:1]
                alloc.publish(s, [bytes([s % 256, 1])], 0)
                if blocks:
                    alloc.attach(next_id, alloc.lookup([bytes([s % 256, 1])]))
                    live[next_id] = 1
                    next_id += 1
            batch = sorted(rng.sample(list(live), min(len(live), rng.randint(1, 5)))) if live else []
            if batch:
                assert_fresh(tables, kv, batch)
            for kept_batch in ([s for s in sorted(live)][:3], [s for s in sorted(live)][-2:]):
                if kept_batch:
                    assert_fresh(tables, kv, kept_batch)
        assert tables.rows_written > 0  # rows were updated in place, not only rebuilt


def test_an_unchanged_table_is_reused_and_a_grown_row_rewritten_alone() -> None:
    kv = cache()
    alloc = kv.allocator
    tables = BlockTables(alloc)
    for s in (1, 2, 3):
        alloc.ensure(s, 8)
    first = tables.get([1, 2, 3])
    revision, rebuilt = first.revision, tables.rebuilt
    for s in (1, 2, 3):
        alloc.ensure(s, 7)  # no new block: no change
    again = tables.get([1, 2, 3])
    assert again is first and again.revision == revision and tables.rebuilt == rebuilt
    alloc.ensure(2, 12)  # one row grows past the width: the table is rebuilt
    assert tables.get([1, 2, 3]).revision != revision and tables.rebuilt == rebuilt + 1
    alloc.ensure(1, 12)  # within the width: that row alone
    written = tables.rows_written
    assert_fresh(tables, kv, [1, 2, 3])
    assert tables.rows_written == written + 1


def test_the_drafts_forwards_share_one_table_and_one_upload(random_pair) -> None:
    _, draft = random_pair
    runner = ModelRunner(load_model(draft), 128, 4)
    drafter = Drafter(runner)
    ids = [1, 2, 3]
    for s in ids:
        drafter.add(s, [5, 6, 7, 8, 9][: s + 2], SamplingParams(max_tokens=64))
    drafter.propose(ids, 4)  # the first proposal builds the table
    uploads = []
    original = runner.to_device

    def counting(host: torch.Tensor) -> torch.Tensor:
        uploads.append(any(host is kept.host for kept in runner.tables._kept.values()))
        return original(host)

    runner.to_device = counting  # type: ignore[method-assign]
    for s in ids:
        drafter.commit(s, [10, 11], 1)
    rebuilt, written = runner.tables.rebuilt, runner.tables.rows_written
    drafter.propose(ids, 4)
    # The first forward and the reserve of the follow-ups change the table at most once each; the rest reuse it.
    assert runner.tables.rebuilt + runner.tables.rows_written - rebuilt - written <= 2 * len(ids)
    assert 1 <= sum(uploads) <= 2, uploads  # k = 4 forwards: the table goes to the device once per change
