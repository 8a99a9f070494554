"""Sampled speculative decoding with penalties and biases keeps the target's processed distribution.

The second token is where drafts matter: when the first draft is accepted, the second is judged at a slot
whose history includes that draft, so a processing that forgot the drafts would bias it. The last test shows
the chi-square test catches exactly that mistake.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minedraft.engine.logits_processing as processing_module
from minedraft.core.sampling_params import SamplingParams
from tests.conftest import engine_from_folders, make_hf_model
from tests.test_lossless_sampling import PROMPT, SAMPLES, VOCAB, chi_square_pvalue

SETTINGS = {"repetition_penalty": 1.6, "frequency_penalty": 1.2, "presence_penalty": 0.6, "logit_bias": {4: 1.5}}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("penalty_pair")
    target = make_hf_model(root / "target", "llama", seed=21, vocab_size=VOCAB, hidden_size=32, intermediate_size=48)
    make_hf_model(root / "draft", "llama", seed=22, vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=1, weight_scale=6.0)
    return root / "target", root / "draft", target


def processed(logits: torch.Tensor, prompt: list[int], output: list[int]) -> np.ndarray:
    """Bias, then penalties, then softmax at temperature 1, from the definitions."""
    x = logits.double().numpy().copy()
    for t, b in SETTINGS["logit_bias"].items():
        x[t] += b
    r = SETTINGS["repetition_penalty"]
    for t in set(prompt + output):
        x[t] = x[t] / r if x[t] > 0 else x[t] * r
    for t in set(output):
        x[t] -= SETTINGS["frequency_penalty"] * output.count(t) + SETTINGS["presence_penalty"]
    p = np.exp(x - x.max())
    return p / p.sum()


def joint_first_two(hf_model) -> np.ndarray:
    with torch.no_grad():
        first = processed(hf_model(torch.tensor([PROMPT])).logits[0, -1], PROMPT, [])
        second = np.stack([processed(hf_model(torch.tensor([[*PROMPT, a]])).logits[0, -1], PROMPT, [a])
                           for a in range(VOCAB)])
    return first[:, None] * second


def sample_pairs(pair) -> tuple[np.ndarray, float]:
    engine = engine_from_folders(pair[0], pair[1], "sd", k=2, block_size=8, num_blocks=SAMPLES + 64,
                                 max_num_seqs=SAMPLES)
    params = [SamplingParams(max_tokens=2, temperature=1.0, seed=i, ignore_eos=True, **SETTINGS)
              for i in range(SAMPLES)]
    counts = np.zeros((VOCAB, VOCAB))
    reqs = engine.generate([PROMPT] * SAMPLES, params)
    for r in reqs:
        counts[r.output_ids[0], r.output_ids[1]] += 1
    accepted = sum(r.stats.accepted for r in reqs) / sum(r.stats.drafted for r in reqs)
    assert engine.target.runner.allocator.num_free == engine.target.runner.allocator.num_blocks
    return counts, accepted


def test_penalised_speculative_samples_follow_the_processed_target(pair) -> None:
    counts, acceptance = sample_pairs(pair)
    assert acceptance > 0.2, "the test needs accepted first drafts to judge the second slot"
    assert chi_square_pvalue(counts, joint_first_two(pair[2])) > 1e-3


def test_the_chi_square_test_catches_penalties_that_forget_the_drafts(pair, monkeypatch) -> None:
    original = processing_module.LogitsProcessing._penalise

    def stale(self, logits, states, drafts, lead=0):  # every slot penalised with the committed history only
        return torch.cat([original(self, logits[:, s:s + 1], states, drafts[:, :0]) for s in range(logits.shape[1])],
                         dim=1)

    monkeypatch.setattr(processing_module.LogitsProcessing, "_penalise", stale)
    counts, _ = sample_pairs(pair)
    assert chi_square_pvalue(counts, joint_first_two(pair[2])) < 1e-6
