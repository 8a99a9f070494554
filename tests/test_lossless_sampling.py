"""Sampled speculative decoding follows the target's distribution (chi-square tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

import minedraft.engine.verifier as verifier_module
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.rejection import Verdict
from minedraft.engine.sampling import STREAM_ACCEPT, STREAM_TARGET, sample_from, uniforms
from tests.conftest import engine_from_folders, make_hf_model

VOCAB = 6
PROMPT = [2, 4, 3]
SAMPLES = 6000


@pytest.fixture(scope="module")
def tiny_vocab_pair(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tinyvocab")
    target = make_hf_model(root / "target", "llama", seed=11, vocab_size=VOCAB, hidden_size=32, intermediate_size=48)
    make_hf_model(root / "draft", "llama", seed=12, vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=1, weight_scale=6.0)
    return root / "target", root / "draft", target


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """An independent numpy statement of temperature -> top-k -> top-p filtering."""
    x = logits.double().numpy() / temperature
    order = np.argsort(-x)
    keep = np.zeros_like(x, dtype=bool)
    keep[order[: top_k or len(x)]] = True
    probs = np.where(keep, np.exp(x - x.max()), 0.0)
    probs /= probs.sum()
    sorted_p = probs[order]
    before = np.cumsum(sorted_p) - sorted_p
    keep[order[before >= top_p]] = False
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum()


def joint_first_two(hf_model, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """P(first token = a, second = b) under the target, shape [V, V]."""
    with torch.no_grad():
        first = reference_probs(hf_model(torch.tensor([PROMPT])).logits[0, -1], temperature, top_k, top_p)
        rows = [hf_model(torch.tensor([[*PROMPT, a]])).logits[0, -1] for a in range(VOCAB)]
    second = np.stack([reference_probs(r, temperature, top_k, top_p) for r in rows])
    return first[:, None] * second


def sample_pairs(engine, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    params = [SamplingParams(max_tokens=2, temperature=temperature, top_k=top_k, top_p=top_p, seed=i,
                             ignore_eos=True) for i in range(SAMPLES)]
    reqs = engine.generate([PROMPT] * SAMPLES, params)
    counts = np.zeros((VOCAB, VOCAB))
    for r in reqs:
        counts[r.output_ids[0], r.output_ids[1]] += 1
    return counts


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    observed, expected = counts.ravel(), probs.ravel() * counts.sum()
    assert observed[expected == 0].sum() == 0, "sampled a token the target gives zero probability"
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def build(pair, mode: str):
    target, draft, _ = pair
    return engine_from_folders(target, draft if mode == "sd" else None, mode, k=2, block_size=8,
                               num_blocks=SAMPLES + 64, max_num_seqs=SAMPLES)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.8, 4, 0.9)])
def test_speculative_samples_follow_target_distribution(tiny_vocab_pair, temperature, top_k, top_p) -> None:
    probs = joint_first_two(tiny_vocab_pair[2], temperature, top_k, top_p)
    engine = build(tiny_vocab_pair, "sd")
    counts = sample_pairs(engine, temperature, top_k, top_p)
    assert chi_square_pvalue(counts, probs) > 1e-3
    assert engine.target.runner.allocator.num_free == engine.target.runner.allocator.num_blocks


def test_autoregressive_samples_follow_target_distribution(tiny_vocab_pair) -> None:
    probs = joint_first_two(tiny_vocab_pair[2], 1.0, 0, 1.0)
    counts = sample_pairs(build(tiny_vocab_pair, "ar"), 1.0, 0, 1.0)
    assert chi_square_pvalue(counts, probs) > 1e-3


def wrong_rule(draft_tokens, draft_probs, target_probs, target_logits, sampling, positions) -> Verdict:
    """A plausible bug: accept when u <= p(x) (forgetting q) and resample from p, not p - q."""
    batch, k = draft_tokens.shape
    p_x = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).double()
    accept = uniforms(sampling.seed, positions[:, :k], STREAM_ACCEPT) <= p_x
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(batch)
    final = sample_from(target_probs[rows, n_acc], uniforms(sampling.seed, positions[rows, n_acc], STREAM_TARGET))
    tokens = torch.full((batch, k + 1), -1, dtype=torch.long)
    tokens[:, :k] = torch.where(torch.arange(k) < n_acc.unsqueeze(1), draft_tokens, -1)
    tokens[rows, n_acc] = final
    return Verdict(tokens=tokens, counts=n_acc + 1, accepted=n_acc)


def test_the_chi_square_test_catches_a_wrong_acceptance_rule(tiny_vocab_pair, monkeypatch) -> None:
    probs = joint_first_two(tiny_vocab_pair[2], 1.0, 0, 1.0)
    monkeypatch.setattr(verifier_module, "verify_drafts", wrong_rule)
    counts = sample_pairs(build(tiny_vocab_pair, "sd"), 1.0, 0, 1.0)
    assert chi_square_pvalue(counts, probs) < 1e-6


def test_seeded_request_is_reproducible_whatever_its_batch(tiny_vocab_pair) -> None:
    engine = build(tiny_vocab_pair, "sd")
    alone = engine.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True))
    crowd = [SamplingParams(max_tokens=12, temperature=1.0, seed=s, ignore_eos=True) for s in (3, 7, 9)]
    batched = engine.generate([[1, 2], PROMPT, [5, 5, 5, 5]], crowd)
    assert batched[1].output_ids == alone[0].output_ids


def test_path_for_draft_dir_is_unused_in_ar_mode(tiny_vocab_pair) -> None:
    target, _, _ = tiny_vocab_pair
    engine = engine_from_folders(Path(target), Path("/nonexistent"), "ar")
    assert engine.draft is None
