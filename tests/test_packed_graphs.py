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


def kv_of(runner: ModelRunner) -> list[torch.Tensor]:
    return [t.clone() for layer in runner.cache.layers for t in layer]


@pytest.mark.parametrize("batch", [3, 4, 6], ids=["below-bucket", "full-bucket", "bucket-8"])
def test_padded_packed_forward_equals_unpadded_and_padded(random_pair: tuple[Path, Path], batch: int) -> None:
    target, _ = random_pair
    staged_runner, packed, padded = (ModelRunner(load_model(target), 96, 4) for _ in range(3))
    graphs = with_staged_graphs(staged_runner)
    bucket = GraphCache.bucket(batch)
    assert bucket is not None
    graphs.capture_ahead([(bucket, K + 1, K + 1, K + 1)])  # room for K drafts in every row of the bucket
    rng = random.Random(batch)
    prompts = [[rng.randrange(97) for _ in range(rng.randint(2, 11))] for _ in range(batch)]
    for runner in (staged_runner, packed, padded):
        for seq_id, prompt in enumerate(prompts):
            runner.forward([seq_id], [prompt], [0], last_n=1)
    seq_ids, starts = list(range(batch)), [len(p) for p in prompts]
    padding = 0
    for lengths in splits(batch, seed=batch):
        drafts = [[rng.randrange(97) if j < n else 0 for j in range(K)] for n in lengths]
        ids = torch.tensor([[p[-1], *row] for p, row in zip(prompts, drafts, strict=True)])
        query_lens = [1 + n for n in lengths]
        padding += bucket * (K + 1) - sum(query_lens)
        got = packed_forward(staged_runner, seq_ids, ids, starts, query_lens, lengths, K + 1)
        want = packed_forward(packed, seq_ids, ids, starts, query_lens, lengths, K + 1)
        ref = padded.forward_ids(seq_ids, ids, starts, query_lens, last_n=K + 1)  # right-aligned
        assert got.shape == want.shape == (batch, K + 1, 97)
        assert torch.equal(got, want), lengths
        for got_kv, want_kv in zip(kv_of(staged_runner), kv_of(packed), strict=True):
            assert torch.equal(got_kv, want_kv), lengths
        for got_kv, ref_kv in zip(kv_of(staged_runner), kv_of(padded), strict=True):
            torch.testing.assert_close(got_kv, ref_kv, rtol=1e-5, atol=1e-6)
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
    assert graphs.steps and all(key[1:3] == (5, 5) and key[3] <= 3 for key in graphs.steps), list(graphs.steps)


def test_capture_ahead_names_the_packed_verifies_selection_takes(random_pair: tuple[Path, Path]) -> None:
    target, _ = random_pair
    runner = ModelRunner(load_model(target), 16, 4)
    assert runner.packed_graphs is None and runner.capture_ahead(64, 4, True, selection=(3, 32)) == 0  # a CPU
    graphs = with_staged_graphs(runner, fixed_too=True)
    fixed = 9 * 5  # buckets 1..64 x windows 1..5
    # per k: k + 1 tokens per row (budget k x batch) down to half of it (a floor pruned the rest)
    per_k = {1: (2, 1), 2: (3, 2, 1), 3: (4, 3, 2), 4: (5, 4, 3, 2)}
    assert runner.capture_ahead(64, 4, scoring=True, selection=(3, 32)) == fixed + 3 * 12
    assert list(graphs.steps) == [(b, k + 4, k + 4, m) for b in (32, 48, 64) for k in (1, 2, 3, 4) for m in per_k[k]]
    assert runner.capture_ahead(64, 4, scoring=True, selection=(3, 32)) == 0  # all there already
    assert selection_keys(64, 4, 3, 20) == [(b, k + 4, k + 4, m) for b in (24, 32, 48, 64) for k in range(1, 5)
                                            for m in per_k[k]]
    assert selection_keys(64, 4, 3, 65) == [] and selection_keys(64, 4, -1, 1) == []
    assert selection_keys(32, 2, 0, 32) == [(32, 2, 2, 2), (32, 2, 2, 1), (32, 3, 3, 3), (32, 3, 3, 2), (32, 3, 3, 1)]
    assert sorted({key[1] for key in selection_keys(32, 8, 8, 32)}) == [10, 11, 12, 13, 14, 15, 16]  # <= 16 wide
    assert len(selection_keys(BATCH_BUCKETS[-1], 2, 3, 1)) == 5 * len(BATCH_BUCKETS)
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
    assert graphs.find(40, 8, 8, 40 * 5, 10) == (48, 8, 8, 5)  # open: what the step needs, captured on first use
    assert graphs.find(40, 8, 8, 40 * 3, 10) == (48, 8, 8, 3)  # a pruned step gets its own, fewer tokens
    assert graphs.find(40, 17, 8, 40, 10) is None and graphs.find(300, 8, 8, 300, 10) is None  # no graph fits
    runner.capture_ahead(64, 4, scoring=True, selection=(3, 32))
    captured = dict(graphs.steps)
    assert graphs.find(40, 8, 8, 40 * 5, 10) == (48, 8, 8, 5)  # k = 4, extra 3: 40 rows, 160 drafts
    assert graphs.find(48, 8, 8, 48 * 5, 10) == (48, 8, 8, 5)  # the bucket full
    assert graphs.find(33, 8, 8, 100, 10) == (48, 8, 8, 3)  # fewer tokens: the fewest per row that hold them
    assert graphs.find(40, 8, 8, 40, 10) == (48, 8, 8, 2)  # pruned below the smallest (2): padded up to it
    assert graphs.find(40, 6, 6, 40 * 3, 10) == (48, 6, 6, 3)  # k = 2
    with caplog.at_level(logging.INFO, logger="minedraft.engine.cuda_graphs"):
        assert graphs.find(40, 9, 9, 40 * 5, 10) is None  # tetris_extra raised to 4
        assert graphs.find(44, 9, 9, 44 * 5, 10) is None  # the same shape: said once
        assert graphs.find(48, 8, 8, 48 * 5 + 1, 10) is None  # more tokens than the bucket's graph holds
        assert graphs.find(20, 8, 8, 20 * 5, 10) is None  # a batch below tetris_min_batch's bucket
    eager = [r.getMessage() for r in caplog.records if "runs eagerly" in r.getMessage()]
    assert len(eager) == 3 and "packed verify of up to 48 sequences x 9 tokens" in eager[0], eager
    assert "24 sequences x 8 tokens" in eager[2]
    assert graphs.steps == captured  # nothing captured once the set closed


def test_the_layout_scatters_dummies_into_the_sink_and_picks_each_rows_slots() -> None:
    from minedraft.engine.ragged_graphs import PackedLayout

    layout = PackedLayout(batch=4, rows=5, q=3, width=3, tokens=8)  # a bucket of 4, 2 tokens per row
    view = torch.full((layout.heads + 7,), -9, dtype=torch.long).numpy()
    layout.write(view, starts=[10, 20], query_lens=[3, 1], lengths=[2, 0])
    starts, lens, rows, picked, _ = layout.split(torch.from_numpy(view[: layout.heads]))
    assert starts.tolist() == [10, 20, 0, 0, 0] and lens.tolist() == [3, 1, 0, 0, 0]
    assert rows.tolist() == [0, 1, 2, 3, 12, 12, 12, 12]  # row 1's token at [1, 0]; dummies at the sink's [4, 0]
    assert picked.tolist() == [[0, 1, 2], [3, 3, 3], [0, 0, 0], [0, 0, 0]]
    assert (view[layout.heads :] == -9).all()  # nothing written past the heads
