"""EAGLE heads composed with the rest: sampled output keeps the target's distribution, penalties and logprobs
leave greedy output as AR's, and through the services a head drafts colocated on the verifier while the draft
service is lost, then in PSD again; n > 1 choices equal single requests seeded s + i."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from minedraft.bench.client import put_policy
from minedraft.cli.local_stack import LocalStack
from minedraft.core.sampling_params import SamplingParams
from tests.conftest import engine_from_folders, make_hf_model
from tests.eagle_support import write_eagle_head
from tests.test_colocated_sd import PROMPTS, ar_reference, health, run_batch
from tests.test_draft_stand_in import stand_in_stack, steps, wait_for
from tests.test_lossless_sampling import SAMPLES, chi_square_pvalue, joint_first_two, sample_pairs

VOCAB = 6


@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tinyvocab-eagle")
    hf = make_hf_model(root / "target", "llama", seed=11, vocab_size=VOCAB, hidden_size=32, intermediate_size=48)
    return root, hf


@pytest.mark.parametrize(("layout", "tetris_extra"), [("safeailab-eagle", 0), ("speculators-eagle3", 0),
                                                     ("speculators-eagle3", 2)],
                         ids=["safeailab-eagle", "speculators-eagle3", "speculators-eagle3-tetris"])
def test_sampled_output_with_a_head_follows_the_target(tiny_vocab, layout: str, tetris_extra: int) -> None:
    """With TETRIS the head drafts k + extra and the batch's best k x B slots are verified: still the target's."""
    root, hf = tiny_vocab
    head = write_eagle_head(root / layout, root / "target", layout, seed=13, draft_vocab=4, scale=4.0)
    probs = joint_first_two(hf, 1.0, 0, 1.0)
    engine = engine_from_folders(root / "target", head, "sd", k=2, block_size=8, num_blocks=SAMPLES + 64,
                                 max_num_seqs=SAMPLES, draft_kind="eagle", tetris_extra=tetris_extra)
    counts = sample_pairs(engine, 1.0, 0, 1.0)
    assert chi_square_pvalue(counts, probs) > 1e-3
    assert engine.draft is not None and engine.draft.runner.allocator.num_free == SAMPLES + 64
    assert (engine.capacity.steps > 0) == (tetris_extra > 0)  # the selected steps, made on the device


def test_penalties_and_logprobs_with_a_head_keep_greedy_output(random_pair, tmp_path: Path) -> None:
    target, _ = random_pair
    head = write_eagle_head(tmp_path / "head", target, "speculators-eagle3", seed=5, draft_vocab=50)
    params = SamplingParams(max_tokens=24, ignore_eos=True, repetition_penalty=1.3, presence_penalty=0.4,
                            frequency_penalty=0.2, logprobs=2)
    prompts = [[5, 9, 13], [7] * 11, list(range(2, 30))]
    ar = engine_from_folders(target, None, "ar", block_size=4, num_blocks=256).generate(prompts, params)
    sd = engine_from_folders(target, head, "sd", k=3, block_size=4, num_blocks=256, draft_kind="eagle"
                             ).generate(prompts, params)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert all(len(r.logprobs or []) == 24 for r in sd)


@pytest.fixture()
def stand_in(random_pair: tuple[Path, Path], tmp_path: Path):
    target, _ = random_pair
    head = write_eagle_head(tmp_path / "head", target, "safeailab-eagle", seed=6)
    with stand_in_stack(target, head, tmp_path, draft_kind="eagle") as stack:
        yield stack


def complete(stack: LocalStack, **body: object) -> list[str]:
    r = httpx.post(f"http://127.0.0.1:{stack.cfg.http_port}/v1/completions", timeout=120,
                   json={"model": "target", "prompt": [4, 8, 15, 16, 23, 42], "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return [c["text"] for c in r.json()["choices"]]


def test_a_head_survives_draft_loss_colocated_and_recovery(stand_in: LocalStack, random_pair) -> None:
    reference = ar_reference(random_pair, PROMPTS, 24)
    up = wait_for(stand_in, "drafting")
    assert run_batch(stand_in, PROMPTS, 24) == reference
    assert steps(up, health(stand_in))["psd"] > 0
    sampled = {"temperature": 1.0, "max_tokens": 10, "seed": 11}
    fanned = complete(stand_in, n=3, **sampled)  # siblings, with the prefix cache on both workers
    assert fanned == [complete(stand_in, **{**sampled, "seed": 11 + i})[0] for i in range(3)]

    stand_in.kill("draft")
    put_policy(stand_in.admin_port, mode="psd", k=2)
    assert run_batch(stand_in, PROMPTS, 24) == reference
    lost = wait_for(stand_in, "lost_colocated")
    assert run_batch(stand_in, PROMPTS, 24) == reference
    after = health(stand_in)
    assert steps(lost, after)["sd"] > 0 and steps(lost, after)["ar"] == 0  # the head drafts on the verifier

    stand_in.start_draft()
    back = wait_for(stand_in, "drafting", timeout_s=120)
    assert run_batch(stand_in, PROMPTS, 24) == reference
    assert steps(back, health(stand_in))["psd"] > 0 and back["recoveries"] >= 1
