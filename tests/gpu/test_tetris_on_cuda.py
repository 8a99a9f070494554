"""TETRIS on the GPU path: the packed ragged forward on the Triton kernels equals the padded one, a replayed
packed graph equals the eager packed forward for random selections, a verifier that captured ahead replays
every steady packed verify (nothing eager, nothing captured while serving), and greedy TETRIS SD equals AR on
the bundled pair, with graphs and without (CUDA only; skipped elsewhere)."""

from __future__ import annotations

import random

import pytest
import torch

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.loader import load_model
from minedraft.engine.ragged import packed_forward
from minedraft.engine.ragged_graphs import PackedGraphs, PackedKey
from minedraft.engine.runner import ModelRunner
from minedraft.engine.tetris import select_lengths
from tests.conftest import engine_from_folders

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_packed_forward_equals_padded_on_triton() -> None:
    padded, packed = (ModelRunner(load_model(TINY_TARGET, "cuda", torch.bfloat16), 256, 16, "cuda",
                                  cuda_graphs=False) for _ in range(2))
    prompts = [[5, 9, 13, 2] * 5, [7] * 9, [3, 4], list(range(10, 60))]
    for runner in (padded, packed):
        for seq_id, prompt in enumerate(prompts):
            runner.forward([seq_id], [prompt], [0], last_n=1)
    lengths = [5, 0, 2, 3]
    ids = torch.tensor([[p[-1], 11, 12, 13, 14, 15] for p in prompts], device="cuda")
    starts = [len(p) for p in prompts]
    query_lens = [1 + n for n in lengths]
    ref = padded.forward_ids(list(range(4)), ids, starts, query_lens, last_n=6)
    got = packed_forward(packed, list(range(4)), ids, starts, [1] * 4, lengths, 6, sum(query_lens))
    for b, n in enumerate(lengths):
        assert torch.equal(got[b, : n + 1].argmax(-1), ref[b, 6 - (n + 1):].argmax(-1))
        torch.testing.assert_close(got[b, : n + 1], ref[b, 6 - (n + 1):], rtol=0.05, atol=0.15)


def test_greedy_tetris_sd_equals_ar_on_cuda() -> None:
    prompts = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = "] * 4
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    cfg = {"device": "cuda", "dtype": torch.float32}
    ar = engine_from_folders(TINY_TARGET, None, "ar", **cfg).generate(prompts, params)
    sd = engine_from_folders(TINY_TARGET, TINY_DRAFT, "sd", k=3, tetris_extra=3, **cfg).generate(prompts, params)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert sum(r.stats.accepted for r in sd) > 0


EXTRA = 3  # the policy's default tetris_extra
# (atol, rtol, the top-two margin above which the greedy token must agree): bf16 differs by GEMM shape
TOLERANCE = {torch.bfloat16: (0.15, 0.05, 0.3), torch.float32: (1e-3, 1e-3, 1e-3)}


def tetris_lengths(batch: int, k: int, rng: random.Random) -> list[int]:
    """A selection as the drafter makes it: k x batch drafts of k + EXTRA per row, prefix-closed, with a row
    verified to k + EXTRA and a row to 0."""
    rows = [[rng.expovariate(1.0) for _ in range(k + EXTRA)] for _ in range(batch)]
    scores = torch.tensor([rng.gauss(0.0, 3.0) for _ in rows]).unsqueeze(1) - torch.tensor(rows).cumsum(1)
    scores[0] += 100.0
    scores[1] -= 100.0
    lengths = select_lengths(scores, k * batch).tolist()
    assert sum(lengths) == k * batch and lengths[0] == k + EXTRA and lengths[1] == 0
    return lengths


@pytest.mark.parametrize(("batch", "dtype"), [(40, torch.bfloat16), (32, torch.float32), (40, torch.float32)],
                         ids=["bf16-below-bucket-48", "fp32-bucket-32", "fp32-below-bucket-48"])
def test_replayed_packed_graph_equals_eager_packed_forward(batch: int, dtype: torch.dtype) -> None:
    graphed, eager = (ModelRunner(load_model(TINY_TARGET, "cuda", dtype), 1024, 16, "cuda", cuda_graphs=graphs)
                      for graphs in (True, False))
    assert graphed.packed_graphs is not None and eager.packed_graphs is None
    graphed.capture_ahead(batch, 4, scoring=True, selection=(EXTRA, 32))
    captured_ms, keys = graphed.graph_capture_ms, set(graphed.packed_graphs.steps)
    rng = random.Random(batch)
    prompts = [[rng.randrange(40, 2000) for _ in range(rng.randint(3, 40))] for _ in range(batch)]
    for runner in (graphed, eager):
        for seq_id, prompt in enumerate(prompts):
            runner.forward([seq_id], [prompt], [0], last_n=1)
    seq_ids, starts = list(range(batch)), [len(p) for p in prompts]
    atol, rtol, margin = TOLERANCE[dtype]
    guarded = slots = 0
    for trial, k in enumerate([4, 2, 4, 1, 3]):
        lengths = tetris_lengths(batch, k, rng)
        width = k + EXTRA + 1
        drafts = torch.tensor([[rng.randrange(40, 2000) if j < n else -1 for j in range(width - 1)] for n in lengths])
        last = torch.tensor([[p[-1]] for p in prompts])
        ids = torch.cat((last, drafts.clamp(min=0)), dim=1).cuda()  # as verify_logits feeds a steady batch
        query_lens = [1 + n for n in lengths]
        counts = torch.tensor(lengths, device="cuda") if trial % 2 else lengths  # selected on the device, or not
        got = packed_forward(graphed, seq_ids, ids, starts, [1] * batch, counts, width, sum(query_lens))
        want = packed_forward(eager, seq_ids, ids, starts, [1] * batch, lengths, width, sum(query_lens))
        assert graphed.packed_graphs.replays == trial + 1  # replayed, not eager
        for b, n in enumerate(lengths):
            torch.testing.assert_close(got[b, : n + 1], want[b, : n + 1], rtol=rtol, atol=atol)
            top = want[b, : n + 1].topk(2, dim=-1).values
            sure = (top[:, 0] - top[:, 1]) > margin
            assert torch.equal(got[b, : n + 1].argmax(-1)[sure], want[b, : n + 1].argmax(-1)[sure]), (trial, b)
            guarded, slots = guarded + int(sure.sum()), slots + n + 1
    assert dtype == torch.bfloat16 or guarded >= 0.5 * slots, (guarded, slots)
    assert graphed.graph_capture_ms == captured_ms and set(graphed.packed_graphs.steps) == keys  # none while serving


def test_greedy_tetris_sd_with_graphs_captured_ahead_replays_every_steady_verify(
        monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = "] * 4
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    cfg = {"device": "cuda", "dtype": torch.float32}
    ar = engine_from_folders(TINY_TARGET, None, "ar", **cfg).generate(prompts, params)
    engine = engine_from_folders(TINY_TARGET, TINY_DRAFT, "sd", k=3, tetris_extra=EXTRA, **cfg)
    runner = engine.target.runner
    graphs = runner.packed_graphs
    assert graphs is not None and runner.graphs is not None
    # k = 1..3 at every bucket up to 16 (the in-process engine selects at any batch size), each with batch x
    # (k + 1) tokens down to half of it, half a token per row apart: 2 + 3 + 3 packed graphs at bucket 1, 3 + 5 + 5
    # at the others
    assert runner.capture_ahead(len(prompts), 3, scoring=True, selection=(EXTRA, 1)) == 5 * 4 + 8 + 4 * 13
    captured_ms = runner.graph_capture_ms
    found: list[PackedKey | None] = []
    find = PackedGraphs.find

    def recording_find(self: PackedGraphs, *args: int) -> PackedKey | None:
        found.append(find(self, *args))
        return found[-1]

    monkeypatch.setattr(PackedGraphs, "find", recording_find)
    reqs = [engine.add_request(p, params) for p in prompts]
    engine.step()  # the first verify feeds the prompts (not a steady shape; it may run eagerly)
    found.clear()
    replays, eager = graphs.replays, set(runner.graphs.eager)
    while engine.has_unfinished():
        engine.step()
    assert [r.output_ids for r in reqs] == [r.output_ids for r in ar]
    assert sum(r.stats.accepted for r in reqs) > 0
    assert found and all(key is not None for key in found), found  # every steady packed verify had its graph
    assert graphs.replays - replays == len(found) == engine.total_steps - 1
    assert runner.graph_capture_ms == captured_ms  # nothing captured while serving
    assert runner.graphs.eager == eager  # and no steady step ran eagerly (it would have said so once)
