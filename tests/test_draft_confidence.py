"""The synthetic draft's confidence knobs (`:calib=C`, `:miscal=M`, bench/draft_confidence.py): the damped
share of tokens, the draft's largest probability after damped and kept tokens, and its unchanged choices."""

from __future__ import annotations

import pytest
import torch

from minedraft.bench.draft_confidence import damped_tokens
from minedraft.bench.peaked_head import successors
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.core.errors import ModelLoadError
from minedraft.engine.runner import ModelRunner

CPU = torch.device("cpu")


def test_spec_carries_the_knobs_and_old_specs_print_as_before() -> None:
    spec = SyntheticSpec("small", "draft", 0.02, 2, 0.7, 0.8, 0.1)
    assert str(spec) == "synthetic:small:draft:alpha=0.02:draft_layers=2:agree=0.7:calib=0.8:miscal=0.1"
    assert SyntheticSpec.parse(str(spec)) == spec
    assert spec.damped and not spec.pair()[0].damped  # the target is never damped
    plain = SyntheticSpec.parse("synthetic:llama3-8b:target:alpha=0.02:draft_layers=4:agree=0.7")
    assert (plain.calib, plain.miscal, str(plain).endswith(":agree=0.7")) == (0.0, 0.0, True)
    for bad in ("synthetic:tiny:draft:calib=0.5", "synthetic:tiny:draft:agree=0.7:calib=1.5",
                "synthetic:tiny:draft:agree=0.7:miscal=-0.1"):
        with pytest.raises(ModelLoadError):
            SyntheticSpec.parse(bad)


def test_damped_shares_follow_calib_on_wrong_choices_and_miscal_on_right_ones() -> None:
    vocab = 20000
    same = successors(vocab, True, 0.7, 0, CPU) == successors(vocab, False, 0.7, 0, CPU)
    damped = damped_tokens(vocab, 0.7, 0.8, 0.1, 0)
    assert abs(damped[~same].float().mean().item() - 0.8) < 0.02
    assert abs(damped[same].float().mean().item() - 0.1) < 0.02
    assert torch.equal(damped_tokens(vocab, 0.7, 0.8, 0.1, 0), damped)  # the same in every process
    assert not damped_tokens(vocab, 0.7, 0.0, 0.0, 0).any()
    assert torch.equal(damped_tokens(vocab, 0.7, 1.0, 0.0, 0), ~same)


def draft_logits(shape: str, calib: float, dtype: torch.dtype, prompt: list[int]) -> torch.Tensor:
    model = build_synthetic(SyntheticSpec(shape, "draft", 0.02, 2, 0.7, calib), "cpu", dtype)
    return ModelRunner(model, 64, 16).forward([0], [prompt], [0], last_n=len(prompt))[0].float()


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_damping_lowers_max_q_where_the_draft_is_wrong_and_keeps_its_choice(shape: str) -> None:
    vocab = 512 if shape == "tiny" else 1024
    prompt = torch.randint(2, vocab, (384,), generator=torch.Generator().manual_seed(3)).tolist()
    calibrated = draft_logits(shape, 1.0, torch.bfloat16, prompt)
    plain = draft_logits(shape, 0.0, torch.bfloat16, prompt)
    pi = successors(vocab, True, 0.7, 0, CPU)
    assert torch.equal(calibrated.argmax(-1), pi[torch.tensor(prompt)])  # the draft's choice is unchanged
    assert torch.equal(plain.argmax(-1), calibrated.argmax(-1))
    damped = damped_tokens(vocab, 0.7, 1.0, 0.0, 0)[torch.tensor(prompt)]
    assert 60 < int(damped.sum()) < 170  # about 0.3 of the positions follow a token the draft gets wrong
    max_q = calibrated.softmax(-1).amax(-1)
    assert 0.2 < max_q[damped].mean().item() < 0.5
    assert max_q[~damped].mean().item() > 0.9
    if shape == "small":  # wide enough that an undamped choice is sure, damped or not elsewhere
        assert max_q[~damped].min().item() > 0.999
        assert plain.softmax(-1).amax(-1).min().item() > 0.999
        assert max_q[damped].max().item() < 0.8
