"""EAGLE heads in both published layouts: loading, and greedy SD with a head equal to AR in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minedraft.core.errors import ModelLoadError
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.eagle_config import load_eagle_config
from minedraft.engine.eagle_pair import head_beside
from minedraft.engine.loader import load_model
from tests.conftest import engine_from_folders
from tests.eagle_support import LAYOUTS, write_eagle_head

PROMPTS = [[5, 9, 13], [7] * 11, list(range(2, 40)), [42]]


@pytest.fixture(scope="module", params=LAYOUTS)
def head(request: pytest.FixtureRequest, random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Path, Path, str]:
    target, _ = random_pair
    layout = request.param
    folder = write_eagle_head(tmp_path_factory.mktemp(layout), target, layout, seed=3, draft_vocab=60)
    return target, folder, layout


def test_layout_and_version_are_read_from_config(head: tuple[Path, Path, str]) -> None:
    target, folder, layout = head
    cfg = load_eagle_config(folder, load_model(target).config)
    assert cfg.layout == layout.split("-")[0]
    assert cfg.version == (3 if layout.endswith("eagle3") else 1)
    assert cfg.feature_width == 64 * (3 if cfg.version == 3 else 1)


def test_head_shares_the_targets_embedding_and_maps_its_vocabulary(head: tuple[Path, Path, str]) -> None:
    target_dir, folder, layout = head
    target = load_model(target_dir)
    drafter = head_beside(target, folder, 32, 4, "cpu", torch.float32)
    model = drafter.head_runner.head
    assert torch.equal(model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert model.embed_tokens.weight.data_ptr() != target.model.embed_tokens.weight.data_ptr()  # a copy
    logits = model.logits(torch.randn(2, 64))
    assert logits.shape == (2, 97)
    if layout.endswith("eagle3"):  # a reduced vocabulary: only the d2t image is reachable
        assert int(torch.isfinite(logits[0]).sum()) == 60
    else:
        assert torch.equal(model.lm_head.weight, target.lm_head.weight)


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_sd_with_a_head_equals_greedy_ar(head: tuple[Path, Path, str], k: int) -> None:
    target, folder, _ = head
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    ar = engine_from_folders(target, None, "ar", block_size=4, num_blocks=256).generate(PROMPTS, params)
    engine = engine_from_folders(target, folder, "sd", k=k, block_size=4, num_blocks=256, draft_kind="eagle")
    sd = engine.generate(PROMPTS, params)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert engine.draft is not None and engine.draft.runner.allocator.num_free == 256
    assert engine.draft.features_received > 0  # type: ignore[attr-defined]


def test_a_head_for_another_target_is_refused(random_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = random_pair
    folder = write_eagle_head(tmp_path / "head", draft, "safeailab-eagle")  # hidden 32, the target's is 64
    with pytest.raises(ModelLoadError, match="hidden states of width"):
        load_eagle_config(folder, load_model(target).config)
