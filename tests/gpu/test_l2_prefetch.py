"""Weights sent towards L2 on a side stream during a captured few-token forward (engine/l2_prefetch.py): with
MINEDRAFT_L2_PREFETCH_MB set, the engine's CUDA graphs fork the prefetches and join them, and greedy tokens are
those of the engine without them; off by default and outside captures."""

from __future__ import annotations

import pytest
import torch


def test_prefetching_forks_inside_captures_only_and_leaves_the_tokens(
        cuda_device: torch.device, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    if torch.cuda.get_device_capability(cuda_device)[0] < 9:
        pytest.skip("the bulk prefetch needs Hopper")
    from minedraft.bench import synthetic_pair
    from minedraft.core.sampling_params import SamplingParams
    from minedraft.core.tokenizer import Tokenizer
    from minedraft.engine import l2_prefetch
    from minedraft.engine.cuda import l2_prefetch as kernel
    from minedraft.engine.llm_engine import EngineConfig, LLMEngine
    from minedraft.engine.runner import ModelRunner
    from minedraft.engine.verifier import Verifier
    from tests.conftest import write_word_tokenizer

    spec = synthetic_pair.SyntheticSpec("small", "target")
    write_word_tokenizer(tmp_path, synthetic_pair.SHAPES["small"].vocab_size, eos_id=0)
    issued: list[bool] = []
    real = kernel.prefetch_l2

    def counted(tensor: torch.Tensor, nbytes: int) -> None:
        issued.append(torch.cuda.is_current_stream_capturing())
        real(tensor, nbytes)

    monkeypatch.setattr(kernel, "prefetch_l2", counted)
    prompts = [[5, 17, 300, 9], [44, 2, 2, 901, 13, 7], [600]]
    tokens = {}
    for megabytes in ("0", "2"):
        monkeypatch.setenv(l2_prefetch.ENV, megabytes)
        l2_prefetch.budget_bytes.cache_clear()
        model = synthetic_pair.build_synthetic(spec, cuda_device, torch.bfloat16)
        engine = LLMEngine(Verifier(ModelRunner(model, 256, 16, cuda_device)), None, Tokenizer(tmp_path),
                           EngineConfig(mode="ar", device=str(cuda_device), num_blocks=256))
        tokens[megabytes] = [r.output_ids for r in engine.generate(prompts, SamplingParams(max_tokens=24,
                                                                                            ignore_eos=True))]
        if megabytes == "0":
            assert not issued
    l2_prefetch.budget_bytes.cache_clear()
    assert tokens["2"] == tokens["0"]
    assert issued.count(True) > 0, "no captured forward forked a prefetch"
    assert issued.count(False) <= 1  # at most the one launch outside a capture that compiles the kernel
