"""Our greedy AR and SD token for token against vLLM's, on the bundled pair and on a Qwen3 pair.

vLLM (its CPU build) is a second, independent implementation of the same models: identical
greedy tokens from both say our model code, paged attention and speculative steps compute what
the checkpoints mean. It runs in its own environment; CI does not install it (3.4 GB does not fit
the 30-minute budget). Locally:

    scripts/setup_vllm_env.sh && .venv/bin/pytest tests/test_vllm_fidelity.py

(or MINEDRAFT_VLLM_PYTHON=/path/to/venv/bin/python). Without it every test here is skipped with
the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minedraft.bench.vllm_peer import PeerConfig, VllmPeer, VllmUnavailable, vllm_importable, vllm_python
from minedraft.bench.workload import code_prompts
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from tests.conftest import engine_from_folders, make_hf_model

K = 4
MAX_TOKENS = 40
QWEN3_VOCAB = 97


@pytest.fixture(scope="module")
def vllm_env() -> Path:
    try:
        python = vllm_python()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    if not vllm_importable(python):
        pytest.skip(f"{python} cannot import vllm; run scripts/setup_vllm_env.sh")
    return python


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A random Qwen3 target (q/k norms, head_dim 32: vLLM's CPU attention needs >= 32) and a
    one-layer Qwen3 draft over the same vocabulary."""
    root = tmp_path_factory.mktemp("qwen3_pair")
    make_hf_model(root / "target", "qwen3", seed=21, head_dim=32, vocab_size=QWEN3_VOCAB)
    make_hf_model(root / "draft", "qwen3", seed=22, head_dim=32, vocab_size=QWEN3_VOCAB, num_hidden_layers=1,
                  hidden_size=32, intermediate_size=48)
    return root / "target", root / "draft"


def our_greedy(target: Path, draft: Path | None, prompts: list[list[int]]) -> list[list[int]]:
    engine = engine_from_folders(target, draft, "sd" if draft else "ar", k=K)
    reqs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    return [r.output_ids for r in reqs]


def vllm_greedy(python: Path, target: Path, draft: Path | None, prompts: list[list[int]],
                max_model_len: int) -> list[list[int]]:
    config = PeerConfig(str(target), str(draft) if draft else None, K, threads=1, max_num_seqs=len(prompts),
                        max_model_len=max_model_len, skip_tokenizer=True)
    with VllmPeer(config, python) as peer:
        return peer.generate(prompts, MAX_TOKENS).outputs


def check_pair(python: Path, target: Path, draft: Path, prompts: list[list[int]], max_model_len: int) -> None:
    ours_ar = our_greedy(target, None, prompts)
    ours_sd = our_greedy(target, draft, prompts)
    assert ours_sd == ours_ar  # lossless on our side
    assert all(len(out) == MAX_TOKENS for out in ours_ar)
    assert vllm_greedy(python, target, None, prompts, max_model_len) == ours_ar
    assert vllm_greedy(python, target, draft, prompts, max_model_len) == ours_sd


def test_bundled_pair_greedy_ar_and_sd_equal_vllm(vllm_env: Path) -> None:
    prompts = code_prompts(Tokenizer(TINY_TARGET), 6, 32)
    prompts.append([5, 9, 13])  # and a short one
    check_pair(vllm_env, TINY_TARGET, TINY_DRAFT, prompts, max_model_len=1024)


def test_qwen3_pair_greedy_ar_and_sd_equal_vllm(vllm_env: Path, qwen3_pair: tuple[Path, Path]) -> None:
    prompts = [[(7 * i + 3 * j) % (QWEN3_VOCAB - 2) + 2 for j in range(5 + 3 * i)] for i in range(5)]
    check_pair(vllm_env, *qwen3_pair, prompts, max_model_len=256)
