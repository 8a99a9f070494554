"""Packed (TETRIS) verify graphs, checked on the CPU without CUDA: the inputs a graph replays over (a bucket's
rows, dummy tokens scattered into the sink row, zero-length rows past the batch) give exactly what the unpadded
packed forward gives and write exactly the same KV, and both equal the padded [B, Q] forward; which shapes
capture_ahead names and which run eagerly once the set is closed (tests/gpu/test_tetris_on_cuda.py replays real
graphs)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import torch

from minedraft.engine.cuda_graphs import BATCH_BUCKETS, GraphCache
from minedraft.engine.ragged import packed_forward
from minedraft.engine.ragged_graphs import PackedCapture, PackedGraphs, PackedKey, PackedStep, selection_keys
from minedraft.engine.runner import ModelRunner
from tests.conftest import engine_from_folders, load_model
from tests.test_decoding import PROMPTS, greedy

K = 4  # drafts per row at most (k + extra): rows verify 0..K of them, a layout K + 1 wide


class StagedGraphs(PackedGraphs):
    """Packed graphs whose 'capture' keeps the static buffers and the step over them, without CUDA: a replay
    runs the step on exactly the inputs a graph would read."""

    def _capture(self, key: PackedKey) -> PackedCapture:
        self.steps[key] = self.stage(key)
        return self.steps[key]


class RecordingCache(GraphCache):
    """A GraphCache whose fixed-width captures only record their key."""

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__(runner.run, torch.device("cpu"), runner.max_blocks_per_seq)

    def _capture(self, key: tuple[int, int, int]):  # type: ignore[override]
        self.steps[key] = object()  # type: ignore[assignment]


def with_staged_graphs(runner: ModelRunner, fixed_too: bool = False) -> StagedGraphs:
    """Staged packed graphs on a CPU runner; with `fixed_too` its GraphCache is the runner's (for
    capture_ahead's bookkeeping: the runner can then run no forward), else one of its own."""
    cache = RecordingCache(runner)
    if fixed_too:
        runner.graphs = cache
    runner.packed_graphs = StagedGraphs(cache, PackedStep(runner.model, runner.cache, runner.backend),
                                        runner.config.vocab_size)
    return runner.packed_graphs


def splits(batch: int, seed: int) -> list[list[int]]:
    """Random per-row draft counts, each split with a row of 0 and a row of K; the last split all K (no dummy
    tokens at all in a K + 1 per-row graph)."""
    rng = random.Random(seed)
    out = []
    for _ in range(4):
        lengths = [rng.randint(0, K) for _ in range(batch)]
        lengths[rng.randrange(batch)], lengths[rng.randrange(batch)] = 0, K
        out.append(lengths)
    return [*out, [K] * batch]


def kv_of(runner: ModelRunner, seq_ids: list[int], lengths: list[int]) -> list[torch.Tensor]:
    """Each layer's keys and values of positions 0..lengths[b]-1 of every sequence, read through its block
    table (runners that reserved different blocks hold the same KV at other places)."""
    size = runner.cache.allocator.block_size
    slots = [torch.tensor([runner.allocator.table(s)[p // size] * size + p % size for p in range(n)])
             for s, n in zip(seq_ids, lengths, strict=True)]
    return [t.flatten(0, 1)[torch.cat(slots)] for layer in runner.cache.layers for t in layer]


@pytest.mark.parametrize("batch", [3, 4, 6], ids=["below-bucket", "full-bucket", "bucket-8"])
def test_padded_packed_forward_equals_unpadded_and_padded(random_pair: tuple[Path, Path], batch: int) -> None:
    """Host and device draft counts alike: the staged graph reads its counts from the host on even splits and
    from a device tensor on odd ones; a fourth runner runs eagerly with device counts and a token bound above
    the valid tokens (dummies into its own sink row)."""
    target, _ = random_pair
    staged_runner, packed, padded, counted = (ModelRunner(load_model(target), 96, 4) for _ in range(4))
    graphs = with_staged_graphs(staged_runner)
    bucket = GraphCache.bucket(batch)
    assert bucket is not None
    graphs.capture_ahead([(bucket, K + 1, K + 1, bucket * (K + 1))])  # room for K drafts in every row
    rng = random.Random(batch)
    prompts = [[rng.randrange(97) for _ in range(rng.randint(2, 11))] for _ in range(batch)]
    for runner in (staged_runner, packed, padded, counted):
        for seq_id, prompt in enumerate(prompts):
            runner.forward([seq_id], [prompt], [0], last_n=1)
    seq_ids, starts, fed = list(range(batch)), [len(p) for p in prompts], [1] * batch
    padding = 0
    for trial, lengths in enumerate(splits(batch, seed=batch)):
        drafts = [[rng.randrange(97) if j < n else 0 for j in range(K)] for n in lengths]
        ids = torch.tensor([[p[-1], *row] for p, row in zip(prompts, drafts, strict=True)])
        query_lens = [1 + n for n in lengths]
        valid = sum(query_lens)
        padding += bucket * (K + 1) - valid
        counts = torch.tensor(lengths)
        got = packed_forward(staged_runner, seq_ids, ids, starts, fed, counts if trial % 2 else lengths, K + 1,
                             valid)
        want = packed_forward(packed, seq_ids, ids, starts, fed, lengths, K + 1, valid)
        bounded = packed_forward(counted, seq_ids, ids, starts, fed, counts, K + 1, valid + 3)
        ref = padded.forward_ids(seq_ids, ids, starts, query_lens, last_n=K + 1)  # right-aligned
        assert got.shape == want.shape == bounded.shape == (batch, K + 1, 97)
        assert torch.equal(got, want) and torch.equal(bounded, want), lengths
        written = [s + q for s, q in zip(starts, query_lens, strict=True)]
        got_kv, want_kv = kv_of(staged_runner, seq_ids, written), kv_of(packed, seq_ids, written)
        for got_t, want_t, bounded_t in zip(got_kv, want_kv, kv_of(counted, seq_ids, written), strict=True):
            assert torch.equal(got_t, want_t) and torch.equal(bounded_t, want_t), lengths
        for got_t, ref_t in zip(got_kv, kv_of(padded, seq_ids, written), strict=True):
            torch.testing.assert_close(got_t, ref_t, rtol=1e-5, atol=1e-6)
        for b, n in enumerate(lengths):
            torch.testing.assert_close(got[b, : n + 1], ref[b, K - n :], rtol=1e-5, atol=1e-5)
            assert torch.equal(got[b, n + 1 :], got[b, n : n + 1].expand(K - n, -1))  # later slots repeat slot n
    assert graphs.replays == 5 and packed.packed_graphs is None  # every split replayed the staged buffers
    assert padding > 0  # dummy tokens were there to be ignored


def test_greedy_tetris_through_staged_graphs_equals_ar(random_pair: tuple[Path, Path]) -> None:
    """Through the verifier (TETRIS's k x batch budgets, batches shrinking as rows finish) with every steady
    packed verify going through a bucket's padded buffers."""
    target, draft = random_pair
    ar = engine_from_folders(target, None, "ar", block_size=4, num_blocks=256).generate(PROMPTS, greedy(30))
    engine = engine_from_folders(target, draft, "sd", k=2, block_size=4, num_blocks=256, tetris_extra=2)
    graphs = with_staged_graphs(engine.target.runner)
    sd = engine.generate(PROMPTS, greedy(30))
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert graphs.replays == engine.total_steps - 1  # all but the first verify, which feeds the prompts
    # k x batch drafts: at most k + 1 = 3 packed tokens per row of a bucket, in a layout k + extra + 1 = 5 wide
    # k x batch drafts: at most k + 1 = 3 packed tokens per row of a bucket, in a layout k + extra + 1 = 5 wide
    assert graphs.steps and all(key[1:3] == (5, 5) and key[3] <= 3 * key[0] for key in graphs.steps), list(graphs.steps)


def test_capture_ahead_names_the_packed_verifies_selection_takes(random_pair: tuple[Path, Path]) -> None:
    target, _ = random_pair
    runner = ModelRunner(load_model(target), 16, 4)
    assert runner.packed_graphs is None and runner.capture_ahead(64, 4, True, selection=(3, 32)) == 0  # a CPU
    graphs = with_staged_graphs(runner, fixed_too=True)
    fixed = 9 * 5  # buckets 1..64 x windows 1..5
    # per k: batch x (k + 1) tokens (budget k x batch) down to half of it, half a token per row apart
    per_bucket = {1: 3, 2: 5, 3: 5, 4: 7}
    assert runner.capture_ahead(64, 4, scoring=True, selection=(3, 32)) == fixed + 3 * sum(per_bucket.values())
    assert [key[3] for key in graphs.steps if key[:3] == (64, 8, 8)] == [320, 288, 256, 224, 192, 160, 128]
    assert [key[3] for key in graphs.steps if key[:3] == (48, 5, 5)] == [96, 72, 48]
    assert {key[:3] for key in graphs.steps} == {(b, k + 4, k + 4) for b in (32, 48, 64) for k in (1, 2, 3, 4)}
    assert runner.capture_ahead(64, 4, scoring=True, selection=(3, 32)) == 0  # all there already
    assert {key[0] for key in selection_keys(64, 4, 3, 20)} == {24, 32, 48, 64}
    assert selection_keys(64, 4, 3, 65) == [] and selection_keys(64, 4, -1, 1) == []
    assert selection_keys(32, 2, 0, 32) == [(32, 2, 2, t) for t in (64, 48, 32)] + [(32, 3, 3, t) for t in
                                                                                   (96, 80, 64, 48, 32)]
    assert sorted({key[1] for key in selection_keys(32, 8, 8, 32)}) == [10, 11, 12, 13, 14, 15, 16]  # <= 16 wide
    assert len(selection_keys(BATCH_BUCKETS[-1], 2, 3, 1)) == 5 + 8 * (len(BATCH_BUCKETS) - 1)  # bucket 1: 2 + 3
    drafter = ModelRunner(load_model(target), 16, 4)
    drafter_graphs = with_staged_graphs(drafter, fixed_too=True)
    assert drafter.capture_ahead(64, 4, scoring=False, selection=(3, 32)) == fixed and not drafter_graphs.steps

    class OwnStep(ModelRunner):  # verifies padded (engine/ragged.py packs only the plain step)
        def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super().run(*args, **kwargs)

    own = OwnStep(load_model(target), 16, 4)
    own_graphs = with_staged_graphs(own, fixed_too=True)
    assert own.capture_ahead(64, 4, scoring=True, selection=(3, 32)) == fixed and not own_graphs.steps


def test_a_closed_set_replays_only_its_packed_shapes_and_says_once_what_runs_eagerly(
        random_pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    target, _ = random_pair
    runner = ModelRunner(load_model(target), 16, 4)
    graphs = with_staged_graphs(runner, fixed_too=True)
    assert graphs.find(40, 8, 8, 200, 10) == (48, 8, 8, 216)  # open: what the step needs, to the grain (24)
    assert graphs.find(40, 8, 8, 120, 10) == (48, 8, 8, 120)  # a pruned step gets its own, fewer tokens
    assert graphs.find(40, 17, 8, 40, 10) is None and graphs.find(300, 8, 8, 300, 10) is None  # no graph fits
    runner.capture_ahead(64, 4, scoring=True, selection=(3, 32))
    captured = dict(graphs.steps)
    assert graphs.find(40, 8, 8, 200, 10) == (48, 8, 8, 216)  # k = 4, extra 3: 40 rows, 160 drafts
    assert graphs.find(48, 8, 8, 240, 10) == (48, 8, 8, 240)  # the bucket full
    assert graphs.find(33, 8, 8, 100, 10) == (48, 8, 8, 120)  # fewer tokens: the fewest that hold them
    assert graphs.find(40, 8, 8, 40, 10) == (48, 8, 8, 96)  # pruned below the smallest (96): padded up to it
    assert graphs.find(40, 6, 6, 120, 10) == (48, 6, 6, 120)  # k = 2
    with caplog.at_level(logging.INFO, logger="minedraft.engine.cuda_graphs"):
        assert graphs.find(40, 9, 9, 200, 10) is None  # tetris_extra raised to 4
        assert graphs.find(44, 9, 9, 220, 10) is None  # the same shape, other tokens: said once
        assert graphs.find(48, 8, 8, 241, 10) is None  # more tokens than the bucket's graphs hold
        assert graphs.find(20, 8, 8, 100, 10) is None  # a batch below tetris_min_batch's bucket
    eager = [r.getMessage() for r in caplog.records if "runs eagerly" in r.getMessage()]
    assert len(eager) == 3 and "packed verify of up to 48 sequences x 9 tokens" in eager[0], eager
    assert "24 sequences x 8 tokens" in eager[2]
    assert graphs.steps == captured  # nothing captured once the set closed


def test_the_layout_scatters_dummies_into_the_sink_and_picks_each_rows_slots() -> None:
    from minedraft.engine.ragged_graphs import PackedLayout

    layout = PackedLayout(batch=4, rows=5, q=3, width=3, tokens=8)  # a bucket of 4, 2 tokens per row
    view = torch.full((layout.heads + 7,), -9, dtype=torch.long).numpy()
    layout.write(view, starts=[10, 20], fed=[1, 1], drafts=[2, 0])
    starts, fed, drafts, _ = layout.split(torch.from_numpy(view[: layout.heads]))
    assert starts.tolist() == [10, 20, 0, 0, 0] and fed.tolist() == [1, 1, 0, 0, 0]
    assert drafts.tolist() == [2, 0, 0, 0, 0]
    assert (view[layout.heads :] == -9).all()  # nothing written past the heads
    lens, offsets, rows, picked = layout.indices(fed, drafts)
    assert lens.tolist() == [3, 1, 0, 0, 0] and offsets.tolist() == [0, 3, 4, 4, 4]
    assert rows.tolist() == [0, 1, 2, 3, 12, 12, 12, 12]  # row 1's token at [1, 0]; dummies at the sink's [4, 0]
    assert picked.tolist() == [[0, 1, 2], [3, 3, 3], [0, 0, 0], [0, 0, 0]]
    # a row that feeds two committed tokens before its drafts (a prompt's last part): its slots start after them
    lens, _, rows, picked = layout.indices(torch.tensor([2, 1, 0, 0, 0]), torch.tensor([1, 1, 0, 0, 0]))
    assert lens.tolist() == [3, 2, 0, 0, 0] and rows.tolist() == [0, 1, 2, 3, 4, 12, 12, 12]
    assert picked.tolist() == [[1, 2, 2], [3, 4, 4], [0, 0, 0], [0, 0, 0]]
    layout.write(view, starts=[10, 20], fed=[1, 1], drafts=None)  # the counts come from the device
    assert view[2 * 5 : 3 * 5].tolist() == [0] * 5
