"""TETRIS on the GPU path: the packed ragged forward on the Triton kernels equals the padded one, and greedy
TETRIS SD equals AR on the bundled pair (CUDA only; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.loader import load_model
from minedraft.engine.ragged import packed_forward
from minedraft.engine.runner import ModelRunner
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
    got = packed_forward(packed, list(range(4)), ids, starts, query_lens, lengths, 6)
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
