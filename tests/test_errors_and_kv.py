"""Bad input gives a clear error; every KV block comes back after finish or cancel."""

from __future__ import annotations

from pathlib import Path

import pytest

from minedraft.core.errors import InvalidRequestError, ModelLoadError
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.config import load_model_config
from minedraft.engine.kv_cache import BlockAllocator
from minedraft.engine.loader import load_model
from tests.conftest import engine_from_folders, make_hf_model


@pytest.fixture()
def sd_engine(random_pair: tuple[Path, Path]):
    target, draft = random_pair
    return engine_from_folders(target, draft, "sd", k=3, block_size=4, num_blocks=128)


@pytest.mark.parametrize(
    ("prompt", "params", "needle"),
    [
        ([], SamplingParams(), "prompt is empty"),
        ("", SamplingParams(), "prompt is empty"),
        ([1] * 200, SamplingParams(max_tokens=100), "over the model's context of 256"),
        ([1, 2], SamplingParams(temperature=-0.5), "temperature must be >= 0"),
        ([1, 2], SamplingParams(top_p=0.0), "top_p must be in (0, 1]"),
        ([1, 2], SamplingParams(top_p=1.5), "top_p must be in (0, 1]"),
        ([1, 2], SamplingParams(top_k=-1), "top_k must be >= 0"),
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens must be"),
        ([1, 500], SamplingParams(), "outside the vocabulary"),
    ],
)
def test_bad_requests_raise_clear_errors_and_engine_keeps_serving(sd_engine, prompt, params, needle) -> None:
    with pytest.raises(InvalidRequestError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        sd_engine.add_request(prompt, params)
    ok = sd_engine.generate([[3, 4, 5]], SamplingParams(max_tokens=5, ignore_eos=True))
    assert len(ok[0].output_ids) == 5


def test_k_below_one_is_rejected(random_pair: tuple[Path, Path]) -> None:
    target, draft = random_pair
    with pytest.raises(InvalidRequestError, match=r"k .* must be an integer >= 1"):
        engine_from_folders(target, draft, "sd", k=0)


def test_target_and_draft_with_different_vocabularies_are_rejected(tmp_path: Path, random_pair) -> None:
    target, _ = random_pair
    make_hf_model(tmp_path / "other", "llama", vocab_size=50)
    with pytest.raises(ModelLoadError, match="different vocabularies"):
        engine_from_folders(target, tmp_path / "other", "sd")


def test_broken_model_folders_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "missing")
    make_hf_model(tmp_path / "m", "llama")
    cfg = (tmp_path / "m" / "config.json").read_text()
    (tmp_path / "m" / "config.json").write_text(cfg.replace("LlamaForCausalLM", "GPT2LMHeadModel").replace(
        '"model_type": "llama"', '"model_type": "gpt2"'))
    with pytest.raises(ModelLoadError, match=r"GPT2LMHeadModel.*not supported"):
        load_model_config(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(cfg.replace('"hidden_size": 64', '"hidden_size": 32'))
    with pytest.raises(ModelLoadError, match="has shape"):
        load_model(tmp_path / "m")
    for f in (tmp_path / "m").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load_model(tmp_path / "m")


def test_every_block_is_free_after_requests_finish_or_are_cancelled(sd_engine) -> None:
    reqs = [sd_engine.add_request([1 + i, 2, 3, 4, 5], SamplingParams(max_tokens=40, ignore_eos=True))
            for i in range(6)]
    sd_engine.step()
    sd_engine.step()
    target_alloc = sd_engine.target.runner.allocator
    assert target_alloc.num_free < target_alloc.num_blocks
    sd_engine.abort(reqs[0].req_id)
    sd_engine.abort(reqs[3].req_id)
    assert reqs[0].finish_reason == "abort"
    assert 0 not in target_alloc.sequences()
    while sd_engine.has_unfinished():
        sd_engine.step()
    assert all(len(r.output_ids) == 40 for i, r in enumerate(reqs) if i not in (0, 3))
    assert target_alloc.num_free == target_alloc.num_blocks
    assert sd_engine.draft.runner.allocator.num_free == sd_engine.draft.runner.allocator.num_blocks


def test_allocator_rolls_back_and_refuses_overcommit() -> None:
    alloc = BlockAllocator(num_blocks=4, block_size=4)
    alloc.ensure(7, 10)
    assert len(alloc.table(7)) == 3 and alloc.num_free == 1
    alloc.truncate(7, 4)
    assert len(alloc.table(7)) == 1 and alloc.num_free == 3
    with pytest.raises(Exception, match="needs 4 more KV blocks, only 3 free"):
        alloc.ensure(7, 20)
    alloc.free(7)
    assert alloc.num_free == 4


def test_stop_strings_and_stop_token_ids_end_requests(sd_engine) -> None:
    free_run = sd_engine.generate([[3, 4, 5]], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    stop_token = free_run.output_ids[4]
    stopped = sd_engine.generate([[3, 4, 5]], SamplingParams(max_tokens=20, ignore_eos=True,
                                                             stop_token_ids=[stop_token]))[0]
    first = free_run.output_ids.index(stop_token)
    assert stopped.output_ids == free_run.output_ids[: first + 1]
    assert stopped.finish_reason == "stop"
    word = f"w{free_run.output_ids[6]}"
    by_text = sd_engine.generate([[3, 4, 5]], SamplingParams(max_tokens=20, ignore_eos=True, stop=[word]))[0]
    assert word not in by_text.text and by_text.finish_reason == "stop"
    assert free_run.text.startswith(by_text.text)
