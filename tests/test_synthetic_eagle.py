"""The synthetic EAGLE-3 head drafts through the engine's head path: exact, and as accepted as its agreement says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from minedraft.bench.peaked_head import successors
from minedraft.bench.synthetic_eagle import (
    build_synthetic_head,
    cycle_labels,
    head_prompts,
    head_runners,
    head_vocabulary,
    write_head,
    write_synthetic_head,
)
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic, synthetic_shared
from minedraft.bundled import TINY_TARGET
from minedraft.core.errors import ModelLoadError
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.drafter import Drafter
from minedraft.engine.eagle_pair import head_beside, head_drafter
from minedraft.engine.llm_engine import EngineConfig, LLMEngine, Request
from minedraft.engine.model import CausalLM
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier

DRAFT_VOCAB = 256  # of the tiny shape's 512
PARAMS = SamplingParams(max_tokens=32, ignore_eos=True)


def pair(agree: float) -> tuple[CausalLM, CausalLM]:
    target, draft = SyntheticSpec("tiny", "target", draft_layers=2, agree=agree).pair()
    return build_synthetic(target, "cpu", torch.float32), build_synthetic(draft, "cpu", torch.float32)


def generate(target: Verifier, drafter: Drafter | None, prompts: list[list[int]], k: int = 4) -> list[Request]:
    cfg = EngineConfig(mode="sd" if drafter is not None else "ar", k=k, device="cpu", dtype=torch.float32)
    return LLMEngine(target, drafter, Tokenizer(TINY_TARGET), cfg).generate(prompts, PARAMS)


def acceptance(reqs: list[Request]) -> float:
    return sum(r.stats.accepted for r in reqs) / sum(r.stats.drafted for r in reqs)


def prompts() -> list[list[int]]:
    return head_prompts(head_vocabulary(512, DRAFT_VOCAB, 0).closed, 6, 12, seed=3)


def test_cycle_labels_name_each_cycle_by_its_smallest_member() -> None:
    pi = torch.tensor([3, 0, 4, 1, 2, 5])  # cycles (0 3 1), (2 4), (5)
    assert cycle_labels(pi).tolist() == [0, 0, 2, 0, 2, 5]


def test_the_draft_vocabulary_holds_the_targets_path_from_its_closed_tokens() -> None:
    vocab = head_vocabulary(512, DRAFT_VOCAB, 0)
    pi = successors(512, False, 1.0, 0, torch.device("cpu"))
    assert vocab.ids.shape[0] == DRAFT_VOCAB and torch.equal(vocab.ids, torch.unique(vocab.ids))
    assert 0 < vocab.closed.shape[0] <= DRAFT_VOCAB
    assert torch.isin(pi[vocab.closed], vocab.closed).all()
    assert torch.isin(vocab.closed, vocab.ids).all()
    full = head_vocabulary(512, 0, 0)
    assert torch.equal(full.ids, torch.arange(512)) and torch.equal(full.closed, torch.arange(512))


def test_the_head_scores_its_draft_vocabulary_only() -> None:
    target, _ = pair(0.7)
    head = build_synthetic_head(target, 0.7, DRAFT_VOCAB)
    assert head.eagle.version == 3 and head.lm_head.weight.shape == (DRAFT_VOCAB, 128)
    logits = head.logits(torch.randn(2, 128))
    finite = torch.isfinite(logits[0])
    assert torch.equal(torch.nonzero(finite).squeeze(1), head_vocabulary(512, DRAFT_VOCAB, 0).ids)


def test_greedy_sd_with_the_head_equals_ar_token_for_token() -> None:
    target, _ = pair(0.7)
    head = build_synthetic_head(target, 0.7, DRAFT_VOCAB)
    ar = generate(Verifier(ModelRunner(target, 128, 16, "cpu")), None, prompts())
    for k in (1, 4):
        capture, drafter = head_runners(target, head, 128)
        sd = generate(Verifier(capture), drafter, prompts(), k)
        assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
        assert sum(r.stats.accepted for r in sd) > 0


@pytest.mark.parametrize("agree", [0.3, 0.9])
def test_the_heads_acceptance_is_the_draft_models_at_the_same_agreement(agree: float) -> None:
    """Both predict the draft's pi(x) of the newest token, so they accept alike (within zero-filled first steps)."""
    target, draft = pair(agree)
    capture, head_drafter = head_runners(target, build_synthetic_head(target, agree, DRAFT_VOCAB), 128)
    by_head = acceptance(generate(Verifier(capture), head_drafter, prompts()))
    by_model = acceptance(generate(Verifier(ModelRunner(target, 128, 16, "cpu")),
                                   Drafter(ModelRunner(draft, 128, 16, "cpu")), prompts()))
    assert abs(by_head - by_model) <= 0.03
    assert (by_head > 0.6) if agree == 0.9 else (by_head < 0.35)


def test_the_written_folder_loads_as_the_same_head(tmp_path: Path) -> None:
    target, _ = pair(0.7)
    head = build_synthetic_head(target, 0.7, DRAFT_VOCAB)
    loaded = head_beside(target, write_head(head, tmp_path / "head"), 64, 16, "cpu", torch.float32)
    assert loaded.head_runner.head.eagle == head.eagle
    _, built = head_runners(target, head, 64)
    ids = torch.tensor([[5, 9, 13, 4, 40, 41]])
    features = torch.randn(1, 6, head.eagle.feature_width)
    want = built.head_runner.forward_features([0], ids, features, [0], [6], [6], last_n=6)
    got = loaded.head_runner.forward_features([0], ids, features, [0], [6], [6], last_n=6)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_bf16_head_written_and_loaded_by_a_draft_service_drafts_as_built(tmp_path: Path) -> None:
    """In bf16 `fuse_projections` registers the head's own weights again under fused names: the folder still holds
    the checkpoint's names, and a draft service builds what the head shares with a synthetic target itself."""
    spec, _ = SyntheticSpec("tiny", "target", draft_layers=2, agree=0.7).pair()
    target = build_synthetic(spec, "cpu", torch.bfloat16)
    folder = write_synthetic_head(spec, 0.7, DRAFT_VOCAB, tmp_path / "head", "cpu", torch.bfloat16)
    assert not [n for n in safe_open(str(folder / "model.safetensors"), "pt").keys() if n.endswith("_weight")]  # noqa: SIM118
    served = head_drafter(folder, str(spec), 64, 16, "cpu", torch.bfloat16, synthetic_shared)
    _, built = head_runners(target, build_synthetic_head(target, 0.7, DRAFT_VOCAB), 64)
    ids = torch.tensor([[5, 9, 13, 4, 40, 41]])
    features = torch.randn(1, 6, built.head_runner.head.eagle.feature_width, dtype=torch.bfloat16)
    want = built.head_runner.forward_features([0], ids, features, [0], [6], [6], last_n=6)
    got = served.head_runner.forward_features([0], ids, features, [0], [6], [6], last_n=6)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_what_a_synthetic_target_shares_is_its_own_embedding_and_head() -> None:
    spec = SyntheticSpec("tiny", "target", 0.02, 2, 0.7)
    target = build_synthetic(spec, "cpu", torch.bfloat16)
    embed, lm_head, cfg = synthetic_shared(str(spec), "cpu", torch.bfloat16)
    assert torch.equal(embed, target.model.embed_tokens.weight) and torch.equal(lm_head, target.lm_head.weight)
    assert cfg.vocab_size == 512 and cfg.num_layers == 4
    with pytest.raises(ModelLoadError, match="drafts for a target"):
        synthetic_shared(str(SyntheticSpec("tiny", "draft", 0.02, 2, 0.7)), "cpu", torch.bfloat16)
