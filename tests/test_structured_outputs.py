"""Structured outputs are exact under speculation: every output of a JSON schema parses and validates, at
temperature 0 and 0.8 over many seeds, in AR and SD; greedy structured output is the same in AR, SD and PSD
(the real workers); the first token of a sampled constrained output follows the masked target distribution
(a chi-square test that rejects the unmasked one), and a regex, a choice and a grammar are matched in full.
The bundled tiny pair, whose tokenizer gives the grammar its tokens."""

from __future__ import annotations

import asyncio
import json
import math
import re

import jsonschema
import pytest
import torch
from scipy.stats import chisquare

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.structured import StructuredOutput
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from tests.conftest import start_workers

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "minItems": 1,
                 "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "nickname": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
    },
    "required": ["name", "age", "color", "tags", "address", "nickname"],
    "additionalProperties": False,
}
PROMPTS = ["A person record: ", "def main():\n", "JSON:", "The answer is"]


def structured(kind: str, spec: object) -> StructuredOutput:
    return StructuredOutput(kind, spec if isinstance(spec, str) else json.dumps(spec))


@pytest.fixture(scope="module")
def engines() -> dict[str, LLMEngine]:
    return {mode: LLMEngine.from_folders(TINY_TARGET, TINY_DRAFT, EngineConfig(mode=mode, k=4))
            for mode in ("ar", "sd")}


def run(engine: LLMEngine, params: list[SamplingParams], prompts: list[str] | None = None) -> list:
    prompts = prompts or [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    return engine.generate(prompts, params)


@pytest.mark.parametrize("mode", ["ar", "sd"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_output_of_a_json_schema_parses_and_validates(engines, mode: str, temperature: float) -> None:
    so = structured("json_schema", SCHEMA)
    seeds = range(12) if temperature else range(4)
    reqs = run(engines[mode], [SamplingParams(max_tokens=160, temperature=temperature, seed=s, structured=so)
                               for s in seeds])
    for req in reqs:
        assert req.finish_reason == "stop", req.text
        jsonschema.validate(json.loads(req.text), SCHEMA)
    if temperature:
        assert len({r.text for r in reqs}) > 1, "different seeds should sample different records"
    if mode == "sd":
        assert sum(r.stats.accepted for r in reqs) > 0, "the draft's masked proposals must be accepted at times"


def test_greedy_structured_output_is_the_same_in_ar_and_sd(engines) -> None:
    cases = [structured("json_schema", SCHEMA), structured("json_object", ""),
             structured("regex", r"[0-9]{3}-[a-z]{2,4}"), structured("choice", ["yes", "no", "maybe not"]),
             structured("grammar", 'root ::= "(" [a-z]+ ( " " [a-z]+ )* ")"')]
    params = [SamplingParams(max_tokens=120, structured=so) for so in cases for _ in PROMPTS]
    prompts = [p for _ in cases for p in PROMPTS]
    ar = [r.output_ids for r in run(engines["ar"], params, prompts)]
    sd = [r.output_ids for r in run(engines["sd"], [SamplingParams(max_tokens=120, structured=p.structured)
                                                  for p in params], prompts)]
    assert ar == sd
    texts = [r.text for r in run(engines["ar"], params[len(PROMPTS) * 2:], prompts[len(PROMPTS) * 2:])]
    regex, choice, grammar = texts[:4], texts[4:8], texts[8:]
    assert all(re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", t) for t in regex), regex
    assert all(t in ("yes", "no", "maybe not") for t in choice), choice
    assert all(re.fullmatch(r"\([a-z]+( [a-z]+)*\)", t) for t in grammar), grammar


def masked_first_token_distribution(so: StructuredOutput, prompt: list[int], temperature: float,
                                    masked: bool = True) -> torch.Tensor:
    """The target's distribution of the first output token, from its own logits, masked with the grammar."""
    import numpy as np
    from llguidance import LLMatcher, LLTokenizer

    engine = LLMEngine.from_folders(TINY_TARGET, None, EngineConfig(mode="ar"))
    runner = engine.target.runner
    runner.allocator.ensure(0, len(prompt))
    logits = runner.forward([0], [prompt], [0], last_n=1)[0, -1].float()
    if masked:
        tok = LLTokenizer((TINY_TARGET / "tokenizer.json").read_text(), n_vocab=logits.shape[0], eos_token=[0])
        bits = np.unpackbits(np.frombuffer(LLMatcher(tok, so.grammar()).compute_bitmask(), dtype=np.uint8),
                             bitorder="little")[: logits.shape[0]].astype(bool)
        logits = logits.masked_fill(~torch.from_numpy(bits), float("-inf"))
    return torch.softmax(logits / temperature, dim=-1)


def test_the_first_sampled_token_follows_the_masked_target_distribution(engines) -> None:
    """SD's first token under a grammar against the exact masked target distribution (the target's own logits,
    masked with the grammar's first mask)."""
    so = structured("regex", r"(cat|dog|cow|owl|ant|bee)s? [0-9]")
    prompt = "Animals: "
    ids = Tokenizer(TINY_TARGET).encode(prompt)
    n = 1200
    reqs = run(engines["sd"], [SamplingParams(max_tokens=1, temperature=1.0, seed=s, structured=so) for s in range(n)],
               [prompt] * n)
    counts: dict[int, int] = {}
    for r in reqs:
        counts[r.output_ids[0]] = counts.get(r.output_ids[0], 0) + 1
    expected = masked_first_token_distribution(so, ids, 1.0)
    support = sorted(int(t) for t in torch.nonzero(expected > 1e-9).flatten())
    assert set(counts) <= set(support), "a token outside the grammar was sampled"
    observed = [counts.get(t, 0) for t in support]
    assert chisquare(observed, frequencies(expected, support, n)).pvalue > 1e-3
    # Sampling without the target's mask puts tokens outside the support (asserted above); a rule with the right
    # support but the wrong weights (the square root of the target's) must be rejected too: the test can fail.
    unmasked = masked_first_token_distribution(so, ids, 1.0, masked=False)
    tilted = unmasked[support] ** 0.5
    assert chisquare(observed, frequencies(tilted, list(range(len(support))), n)).pvalue < 1e-6


def frequencies(probs: torch.Tensor, support: list[int], n: int) -> list[float]:
    weights = [float(probs[t]) for t in support]
    total = math.fsum(weights)
    out = [n * w / total for w in weights]
    out[-1] += n - math.fsum(out)  # sums to n exactly, as chisquare checks
    return out


@pytest.fixture(scope="module")
def psd_workers(tmp_path_factory: pytest.TempPathFactory):
    stack = start_workers(LocalStack(StackConfig(target=str(TINY_TARGET), draft=str(TINY_DRAFT), grpc_port=free_port(),
                                                 http_port=free_port(), num_blocks=512,
                                                 log_dir=tmp_path_factory.mktemp("logs"))))
    yield stack
    stack.stop()


def test_greedy_structured_output_in_psd_is_ars(engines, psd_workers) -> None:
    so = structured("json_schema", SCHEMA)
    params = [SamplingParams(max_tokens=160, structured=so) for _ in PROMPTS]
    expected = [r.output_ids for r in run(engines["ar"], params, PROMPTS)]
    tokenizer = Tokenizer(TINY_TARGET)

    async def served() -> list[list[int]]:
        coordinator = Coordinator.over_grpc(tokenizer, "tiny", f"127.0.0.1:{psd_workers.target_port}",
                                            f"127.0.0.1:{psd_workers.draft_port}", ManagerConfig(mode="psd", k=4))
        await coordinator.start(connect_timeout=120)
        while coordinator.status()["draft_state"] != "drafting":
            await asyncio.sleep(0.05)
        try:
            async def one(prompt: str) -> list[int]:
                p = SamplingParams(max_tokens=160, structured=so)
                return [t async for c in coordinator.generate(tokenizer.encode(prompt), p, "s") for t in c.token_ids]

            return await asyncio.gather(*(one(p) for p in PROMPTS))
        finally:
            await coordinator.stop()

    assert asyncio.run(asyncio.wait_for(served(), 120)) == expected


def test_a_grammar_the_models_tokenizer_cannot_serve_is_refused_before_any_worker_sees_it() -> None:
    from llguidance import LLMatcher

    from minedraft.core.errors import InvalidRequestError
    from minedraft.core.structured import GrammarChecker

    tokenizer = Tokenizer(TINY_TARGET)
    checker = GrammarChecker(tokenizer.backend.to_str(), tokenizer.vocab_size, [0])
    fine = structured("regex", "[a-z]+")
    checker.check(fine)
    unknown = StructuredOutput("llguidance", LLMatcher.grammar_from_lark('start: <|no_such_token|> "a"'),
                               param="structured_outputs")
    unknown.check()  # valid on its own
    with pytest.raises(InvalidRequestError) as err:
        checker.check(unknown)
    assert err.value.param == "structured_outputs" and "no_such_token" in str(err.value)
