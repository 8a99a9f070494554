"""Logprobs and penalised decoding against Hugging Face transformers, in AR, SD, PSD and SD colocated.

The in-process engine covers AR and SD; PSD and the colocated verifier run the real worker processes (draft
service and verifier, gloo data plane) driven by the batch manager's coordinator in this process, so the
chunks it returns (logprobs included) are inspected directly. The oracle is transformers' log_softmax of the
same weights over prompt + output (fp32, 1e-4); penalised greedy output is checked against a decode written
from the definitions, one token at a time.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from minedraft.batch_manager.config import ManagerConfig
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.sampling_params import SamplingParams
from tests.conftest import engine_from_folders, pair_stack, serve_requests

EOS = 1  # the test tokenizer's end token
PROMPTS = [[5, 17, 33, 8, 60, 2, 9], [44, 3], [12, 12, 12, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83]]
PENALTIES = [
    {"repetition_penalty": 1.3},
    {"frequency_penalty": 2.0, "presence_penalty": -0.5},
    {"frequency_penalty": -2.0},  # the #18902 repro: a negative penalty loops on repeats
    {"logit_bias": {3: 2.5, 18: -100.0}, "min_tokens": 4},
]


@pytest.fixture(scope="module")
def hf(random_pair):
    return AutoModelForCausalLM.from_pretrained(random_pair[0]).float().eval()


def oracle(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([tokens])).logits[0].float(), dim=-1)


def reference_greedy(hf, prompt: list[int], n: int, p: SamplingParams) -> list[int]:
    """Plain greedy decoding with the processing spelled out from its definitions."""
    out: list[int] = []
    while len(out) < n:
        with torch.no_grad():
            x = hf(torch.tensor([prompt + out])).logits[0, -1].double()
        if len(out) < p.min_tokens:
            x[EOS] = float("-inf")
        for t, b in p.logit_bias.items():
            x[t] += b
        for t in set(prompt + out):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        for t in set(out):
            x[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
        out.append(int(x.argmax()))
        if out[-1] == EOS and len(out) >= p.min_tokens:
            break
    return out


def check_logprobs(hf, prompt: list[int], output: list[int], entries: list[TokenLogprob], top_n: int) -> None:
    ref = oracle(hf, prompt + output)
    assert [e.token_id for e in entries] == output
    for i, e in enumerate(entries):
        row = ref[len(prompt) - 1 + i]
        assert abs(e.logprob - row[e.token_id].item()) < 1e-4
        assert e.rank == int((row >= row[e.token_id]).sum())
        values, ids = row.topk(top_n)
        assert [t for t, _ in e.top] == ids.tolist()
        assert max(abs(v - r) for (_, v), r in zip(e.top, values.tolist(), strict=True)) < 1e-4


def check_prompt_logprobs(hf, prompt: list[int], entries: list[TokenLogprob | None]) -> None:
    ref = oracle(hf, prompt)
    assert entries[0] is None and len(entries) == len(prompt)
    for i, e in enumerate(entries[1:], start=1):
        assert e is not None and e.token_id == prompt[i]
        assert abs(e.logprob - ref[i - 1, prompt[i]].item()) < 1e-4


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_in_process_logprobs_and_penalties_match_the_oracle(random_pair, hf, mode: str) -> None:
    engine = engine_from_folders(random_pair[0], random_pair[1] if mode == "sd" else None, mode, k=3)
    params = SamplingParams(max_tokens=14, logprobs=4, prompt_logprobs=2, ignore_eos=True)
    reqs = engine.generate(PROMPTS, [params] * len(PROMPTS))
    for prompt, req in zip(PROMPTS, reqs, strict=True):
        check_logprobs(hf, prompt, req.output_ids, req.logprobs, 4)
        check_prompt_logprobs(hf, prompt, req.prompt_logprobs)
        assert all(e.rank == 1 and e.top[0] == (e.token_id, e.logprob) for e in req.logprobs)  # greedy, exactly
    for extra in PENALTIES:
        p = SamplingParams(max_tokens=12, **extra)
        got = engine.generate(PROMPTS, [p] * len(PROMPTS))
        assert [r.output_ids for r in got] == [reference_greedy(hf, pr, 12, p) for pr in PROMPTS], extra


def test_evaluation_harness_echo_batch_scores_every_prompt_token(random_pair, hf) -> None:
    """lm-eval's loglikelihood request: token-id prompts, max_tokens 1, prompt logprobs + the generated token's."""
    engine = engine_from_folders(random_pair[0], random_pair[1], "sd", k=3)
    params = SamplingParams(max_tokens=1, logprobs=1, prompt_logprobs=1, temperature=0.0, seed=1234)
    for prompt, req in zip(PROMPTS, engine.generate(PROMPTS, [params] * 3), strict=True):
        check_prompt_logprobs(hf, prompt, req.prompt_logprobs)
        check_logprobs(hf, prompt, req.output_ids, req.logprobs, 1)
        assert req.logprobs[0].logprob == max(v for _, v in req.logprobs[0].top)  # lm-eval's is_greedy


def test_processed_logprobs_are_the_sampled_distribution(random_pair, hf) -> None:
    engine = engine_from_folders(random_pair[0], random_pair[1], "sd", k=3)
    p = SamplingParams(max_tokens=6, temperature=0.7, top_k=5, seed=3, logprobs=5, logprobs_mode="processed_logprobs",
                       ignore_eos=True)
    req = engine.generate([PROMPTS[0]], [p])[0]
    ref = oracle(hf, PROMPTS[0] + req.output_ids)
    for i, e in enumerate(req.logprobs):
        row = ref[len(PROMPTS[0]) - 1 + i] / 0.7
        kept = row.topk(5).indices
        expected = torch.log_softmax(row[kept], dim=-1)
        assert sorted(t for t, _ in e.top) == sorted(kept.tolist())
        assert abs(e.logprob - expected[kept.tolist().index(e.token_id)].item()) < 1e-4


# ----- the services: PSD and the colocated verifier ------------------------------------------------------


@pytest.mark.parametrize("colocated", [False, True], ids=["psd", "sd-colocated"])
def test_services_logprobs_and_penalties_match_the_oracle(random_pair, hf, tmp_path: Path, colocated: bool) -> None:
    """The draft is the target's own folder: its unprocessed drafts are accepted until a penalty, bias or mask
    changes the target's choice, so accepted runs, rejections and bonus tokens all occur."""
    requests = [(pr, SamplingParams(max_tokens=14, logprobs=3, prompt_logprobs=1, ignore_eos=True), None)
                for pr in PROMPTS]
    requests += [(pr, SamplingParams(max_tokens=12, **extra), None) for extra in PENALTIES for pr in PROMPTS[:2]]
    requests += [(pr, SamplingParams(max_tokens=10, ignore_eos=True), None) for pr in PROMPTS]  # plain rows beside
    stack = pair_stack(random_pair[0], random_pair[0], tmp_path, colocated)
    config = ManagerConfig(mode="sd" if colocated else "psd", k=3)
    try:
        results, status = asyncio.run(asyncio.wait_for(
            serve_requests(stack, random_pair[0], config, colocated, requests), 240))
    finally:
        stack.stop()
    for (prompt, params, _), chunks in zip(requests, results, strict=True):
        output = [t for c in chunks for t in c.token_ids]
        if params.logprobs is not None:
            check_logprobs(hf, prompt, output, [e for c in chunks for e in c.logprobs or []], 3)
            check_prompt_logprobs(hf, prompt, next(c.prompt_logprobs for c in chunks if c.prompt_logprobs))
        else:
            assert all(c.logprobs is None for c in chunks)
            assert output == reference_greedy(hf, prompt, params.max_tokens, params)
    assert status["accepted_total"] > 0, "drafts must have been judged and some accepted"
    if not colocated:
        assert status["steps_by_kind"]["psd"] > 0, "both batches must have run at once"


def psd_launching_ahead(random_pair, tmp_path: Path, requests: list) -> tuple[list[list], dict, str]:
    """The requests through PSD with both workers launching ahead: their chunks, the status, the verifier's log."""
    stack = pair_stack(random_pair[0], random_pair[0], tmp_path, colocated=False, launch_ahead=True)
    try:
        results, status = asyncio.run(asyncio.wait_for(
            serve_requests(stack, random_pair[0], ManagerConfig(mode="psd", k=3), False, requests), 240))
    finally:
        stack.stop()
    assert status["steps_by_kind"]["psd"] > 0 and status["accepted_total"] > 0
    return results, status, (tmp_path / "verifier.log").read_text()


def test_psd_launching_verifies_ahead_keeps_penalised_output_exact(random_pair, hf, tmp_path: Path) -> None:
    """Penalised greedy batches (no logprobs, no grammar) are verified ahead of the previous verdict's readback:
    each row's processing reads its batch's committed history, the other batch's commit queued behind it."""
    requests = [(pr, SamplingParams(max_tokens=12, **extra), None) for extra in PENALTIES for pr in PROMPTS]
    results, _, log = psd_launching_ahead(random_pair, tmp_path, requests)
    for (prompt, params, _), chunks in zip(requests, results, strict=True):
        assert [t for c in chunks for t in c.token_ids] == reference_greedy(hf, prompt, params.max_tokens, params)
    assert "verifies are launched ahead" in log


def test_psd_launching_verifies_ahead_keeps_logprobs_exact(random_pair, hf, tmp_path: Path) -> None:
    """Rows asking for logprobs (penalised ones among them) are verified ahead of the previous verdict's readback
    too: the verify computes their logprobs on the device beside its verdict and they come back with it, so
    each row's tokens and logprobs still match the oracle's, penalties included."""
    requests = [(pr, SamplingParams(max_tokens=12, logprobs=2, ignore_eos=True, **extra), None)
                for extra in ({}, *PENALTIES[:2]) for pr in PROMPTS * 2]
    results, _, log = psd_launching_ahead(random_pair, tmp_path, requests)
    for (prompt, params, _), chunks in zip(requests, results, strict=True):
        output = [t for c in chunks for t in c.token_ids]
        assert output == reference_greedy(hf, prompt, params.max_tokens, params)
        # raw logprobs (the default mode): the oracle's of the unprocessed logits, penalised rows too
        check_logprobs(hf, prompt, output, [e for c in chunks for e in c.logprobs or []], 2)
    counts = re.search(r"(\d+) of (\d+) verify steps were launched ahead", log)
    assert counts is not None and int(counts.group(1)) > 0, "logprobs rows are launched ahead"
