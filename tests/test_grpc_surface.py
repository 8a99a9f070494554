"""The gRPC request surface beyond the basics: sampling extras, logprobs, n and best_of, honoured end to end.

A real grpc.aio server over EngineBackend (speculative mode, random pair) for what the engine does, and over a
scripted backend for what only the API layer decides (best_of's ranking, a failing child).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from minedraft.batch_manager.backend import GenerationChunk, UnavailableError
from minedraft.batch_manager.choices import FanOut
from minedraft.core.codec import sampling_from_api
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import generation_pb2 as pb
from tests.conftest import engine_from_folders, wait_until
from tests.engine_backend import EngineBackend, all_kv_free
from tests.test_grpc_api import LoopThread, Server, request, serve

PROMPT = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def served(random_pair: tuple[Path, Path], loop: LoopThread) -> Iterator[Server]:
    engine = engine_from_folders(*random_pair, "sd", k=3, block_size=4, num_blocks=512, max_num_seqs=4)
    with EngineBackend(engine, model_name="random", max_queue=8) as backend:
        yield from serve(loop, backend)


def words(response: pb.GenerateResponse | pb.Choice) -> list[str]:
    return response.text.split()


def test_every_field_maps_and_unset_is_the_core_default() -> None:
    assert sampling_from_api(pb.SamplingParameters(max_tokens=5, temperature=0.5, top_p=0.9)) == SamplingParams(
        max_tokens=5, temperature=0.5, top_p=0.9)
    given = pb.SamplingParameters(
        min_p=0.25, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.25, logit_bias={7: -2.5},
        min_tokens=3, allowed_token_ids=[4, 5], logprobs=0, prompt_logprobs=2, logprobs_mode="processed_logprobs",
        skip_special_tokens=False, spaces_between_special_tokens=False, include_stop_str_in_output=True,
        priority=-3)
    p = sampling_from_api(given)
    assert (p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.25, 0.5, -0.5, 1.25)
    assert (p.logit_bias, p.min_tokens, p.allowed_token_ids) == ({7: -2.5}, 3, [4, 5])
    assert (p.logprobs, p.prompt_logprobs, p.logprobs_mode) == (0, 2, "processed_logprobs")
    assert (p.skip_special_tokens, p.spaces_between_special_tokens, p.include_stop_str_in_output) == (
        False, False, True)
    assert p.priority == -3


def test_children_get_seeds_s_plus_i_and_logprobs_only_to_rank() -> None:
    params = SamplingParams(seed=7, prompt_logprobs=1)
    plain = FanOut.of(2, 0, streaming=True).child_params(params)
    assert [(c.seed, c.logprobs, c.prompt_logprobs) for c in plain] == [(7, None, 1), (8, None, None)]
    ranked = FanOut.of(1, 3, streaming=False).child_params(SamplingParams())
    assert [(c.seed, c.logprobs) for c in ranked] == [(None, 0)] * 3 and params.seed == 7


def test_stop_string_is_kept_with_include_stop_str_in_output(served: Server) -> None:
    plain = served.stub.Generate(request(PROMPT, ignore_eos=True))
    stop = words(plain)[3]
    cut = served.stub.Generate(request(PROMPT, ignore_eos=True, stop=[stop]))
    kept = served.stub.Generate(request(PROMPT, ignore_eos=True, stop=[stop], include_stop_str_in_output=True))
    assert cut.text == plain.text[:plain.text.index(stop)]
    assert kept.text == plain.text[:plain.text.index(stop) + len(stop)]
    assert cut.finish_reason == kept.finish_reason == "stop"


def test_truncate_prompt_tokens_keeps_the_last_tokens(served: Server) -> None:
    truncated = served.stub.Generate(request(PROMPT, truncate_prompt_tokens=5))
    assert truncated.usage.prompt_tokens == 5
    assert truncated.token_ids == served.stub.Generate(request(PROMPT[-5:])).token_ids
    text = served.stub.Generate(request("w5 w9 w13 w20", truncate_prompt_tokens=2))
    assert text.usage.prompt_tokens == 2
    assert served.stub.Generate(request(PROMPT, truncate_prompt_tokens=50)).usage.prompt_tokens == len(PROMPT)


def test_min_tokens_holds_off_a_stop_token(served: Server) -> None:
    plain = served.stub.Generate(request(PROMPT, ignore_eos=True))
    first = plain.token_ids[0]
    assert served.stub.Generate(request(PROMPT, stop_token_ids=[first])).usage.completion_tokens == 1
    held = served.stub.Generate(request(PROMPT, stop_token_ids=[first], min_tokens=4))
    assert held.usage.completion_tokens >= 4


def test_skip_special_tokens_false_keeps_their_text(random_pair: tuple[Path, Path], loop: LoopThread,
                                                    tmp_path: Path) -> None:
    """A copy of the target whose tokenizer calls the first greedy output token special."""
    folder = tmp_path / "target"
    shutil.copytree(random_pair[0], folder)
    engine = engine_from_folders(folder, None, "ar", block_size=4, num_blocks=64)
    (req,) = engine.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True))
    special = f"w{req.output_ids[0]}"
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"] = [{"id": req.output_ids[0], "content": special, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    engine = engine_from_folders(folder, None, "ar", block_size=4, num_blocks=64)
    with EngineBackend(engine, max_queue=2) as backend:
        for server in serve(loop, backend):
            skipped = server.stub.Generate(request(PROMPT, max_tokens=6, ignore_eos=True))
            kept = server.stub.Generate(request(PROMPT, max_tokens=6, ignore_eos=True, skip_special_tokens=False))
    assert special not in words(skipped)
    assert words(kept)[0] == special and [w for w in words(kept) if w != special] == words(skipped)


def test_n_seeded_equals_requests_seeded_s_plus_i(served: Server) -> None:
    sampling = {"temperature": 1.0, "seed": 11, "ignore_eos": True, "max_tokens": 12}
    one_by_one = [served.stub.Generate(request(PROMPT, **{**sampling, "seed": 11 + i})) for i in range(3)]
    assert len({tuple(r.token_ids) for r in one_by_one}) > 1  # the seeds do draw different outputs
    fanned = served.stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=PROMPT), n=3,
                                                     sampling=pb.SamplingParameters(**sampling)))
    assert [c.index for c in fanned.choices] == [0, 1, 2]
    assert [list(c.token_ids) for c in fanned.choices] == [list(r.token_ids) for r in one_by_one]
    assert [c.text for c in fanned.choices] == [r.text for r in one_by_one]
    assert (fanned.text, fanned.token_ids) == (fanned.choices[0].text, fanned.choices[0].token_ids)
    assert fanned.usage.completion_tokens == 36 and fanned.usage.prompt_tokens == len(PROMPT)

    chunks = list(served.stub.GenerateStream(pb.GenerateRequest(token_ids=pb.TokenIds(ids=PROMPT), n=3,
                                                                sampling=pb.SamplingParameters(**sampling))))
    assert {c.index for c in chunks} == {0, 1, 2}
    for i, choice in enumerate(fanned.choices):
        mine = [c for c in chunks if c.index == i]
        assert [t for c in mine for t in c.token_ids] == list(choice.token_ids)
        assert "".join(c.text for c in mine) == choice.text
        assert [c.finish_reason for c in mine][-1] == "length"


@pytest.mark.parametrize(("sampling", "extra", "name"), [
    ({"logprobs": 21}, {}, "logprobs"),
    ({"prompt_logprobs": 21}, {}, "prompt_logprobs"),
    ({"presence_penalty": 3.0}, {}, "presence_penalty"),
    ({"frequency_penalty": -3.0}, {}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, {}, "repetition_penalty"),
    ({"min_p": 2.0}, {}, "min_p"),
    ({"logprobs_mode": "softmax"}, {}, "logprobs_mode"),
    ({"logit_bias": {3: 500.0}}, {}, "logit_bias"),
    ({"logit_bias": {300: 1.0}}, {}, "logit_bias"),
    ({"allowed_token_ids": [300]}, {}, "allowed_token_ids"),
    ({"min_tokens": 30}, {}, "min_tokens"),
    ({}, {"n": 500}, "n"),
    ({}, {"n": 3, "best_of": 2}, "best_of"),
])
def test_out_of_range_fields_are_invalid_argument_naming_them(
        served: Server, sampling: dict[str, Any], extra: dict[str, int], name: str) -> None:
    req = pb.GenerateRequest(text="w5 w9", sampling=pb.SamplingParameters(max_tokens=4, **sampling), **extra)
    for call in (served.stub.Generate, lambda r: list(served.stub.GenerateStream(r))):
        with pytest.raises(grpc.RpcError) as info:
            call(req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert name in info.value.details()


def test_best_of_is_refused_on_streams(served: Server) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(served.stub.GenerateStream(pb.GenerateRequest(text="w5", n=1, best_of=2)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "best_of" in info.value.details()


def test_cancelled_n_stream_aborts_every_choice(served: Server) -> None:
    backend = served.backend
    aborted = backend.status()["aborted"]
    call = served.stub.GenerateStream(pb.GenerateRequest(text="w5 w9 w13", n=4, sampling=pb.SamplingParameters(
        max_tokens=200, temperature=0.0, ignore_eos=True)))
    assert next(call).token_ids
    backend.pause()  # only the aborts can end the children now
    try:
        wait_until(lambda: backend.status()["running"] == 4)
        call.cancel()
        wait_until(lambda: backend.status()["aborted"] == aborted + 4 and all_kv_free(backend.status()))
        assert backend.status()["running"] == 0 and backend.status()["waiting"] == 0
    finally:
        backend.resume()


def test_reflection_describes_the_new_fields(served: Server) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(served.channel)
    ask = reflection_pb2.ServerReflectionRequest(file_containing_symbol="minedraft.v1.GenerateRequest")
    (answer,) = stub.ServerReflectionInfo(iter([ask]))
    file = descriptor_pb2.FileDescriptorProto.FromString(answer.file_descriptor_response.file_descriptor_proto[0])
    fields = {m.name: {f.name for f in m.field} for m in file.message_type}
    assert {"n", "best_of"} <= fields["GenerateRequest"]
    assert {"logit_bias", "logprobs", "truncate_prompt_tokens", "priority"} <= fields["SamplingParameters"]
    assert {"index", "logprobs", "prompt_logprobs", "cumulative_logprob"} <= fields["GenerateChunk"]
    assert {"token_id", "logprob", "rank", "alternatives", "token"} <= fields["TokenLogprob"]


# ----- a scripted backend: each child's score is set by its seed -----

@dataclass
class ScriptedBackend:
    """Child seeded s scores `scores[s]` (one token, w<s>); the seed in `fail` raises, the seeds in `hang` wait."""

    tokenizer: Tokenizer
    scores: dict[int, float] = field(default_factory=dict)
    fail: int | None = None
    hang: frozenset[int] = frozenset()
    model_name: str = "scripted"
    max_context: int = 64
    calls: list[tuple[SamplingParams, str, str | None]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str, deadline: float | None = None,
                 partial: bool = True, share_prompt: str | None = None) -> AsyncIterator[GenerationChunk]:
        self.calls.append((params, request_id, share_prompt))
        return self._chunks(len(prompt_ids), params, request_id)

    async def _chunks(self, prompt_tokens: int, params: SamplingParams, request_id: str
                      ) -> AsyncIterator[GenerationChunk]:
        seed = params.seed or 0
        try:
            if seed == self.fail:
                raise UnavailableError("the verifier is gone")
            if seed in self.hang:
                await asyncio.Event().wait()
            score = self.scores.get(seed, -1.0)
            entries = None if params.logprobs is None else [TokenLogprob(seed, score, 2, [(0, score + 0.5)])]
            yield GenerationChunk(f"w{seed}", [seed], "length", prompt_tokens, 1, logprobs=entries,
                                  cumulative_logprob=score)
        finally:
            self.closed.append(request_id)


@pytest.fixture
def scripted(random_pair: tuple[Path, Path], loop: LoopThread) -> Iterator[Server]:
    yield from serve(loop, ScriptedBackend(Tokenizer(random_pair[0])))


def test_best_of_returns_the_highest_cumulative_logprobs(scripted: Server) -> None:
    backend: ScriptedBackend = scripted.backend
    backend.scores = {10: -3.0, 11: -1.0, 12: -5.0, 13: -2.0}
    req = pb.GenerateRequest(request_id="bo", text="w5", n=2, best_of=4, sampling=pb.SamplingParameters(seed=10))
    response = scripted.stub.Generate(req)
    assert [list(c.token_ids) for c in response.choices] == [[11], [13]]
    assert [c.index for c in response.choices] == [0, 1] and response.token_ids == [11]
    assert not response.logprobs and response.cumulative_logprob == 0.0  # forced on to rank, not asked for
    assert all(not c.logprobs and c.cumulative_logprob == 0.0 for c in response.choices)
    assert response.usage.completion_tokens == 4
    assert [(p.seed, p.logprobs, rid, share) for p, rid, share in backend.calls] == [
        (10 + i, 0, f"bo-{i}", "bo") for i in range(4)]

    req.sampling.logprobs = 1
    asked = scripted.stub.Generate(req)
    assert [c.cumulative_logprob for c in asked.choices] == [-1.0, -2.0]
    (entry,) = asked.choices[0].logprobs
    assert (entry.token_id, entry.logprob, entry.rank, entry.token) == (11, -1.0, 2, "w11")
    assert [(a.token_id, a.logprob, a.token) for a in entry.alternatives] == [(0, -0.5, "w0")]


def test_a_failing_child_closes_the_others(scripted: Server) -> None:
    backend: ScriptedBackend = scripted.backend
    backend.fail, backend.hang = 2, frozenset({0, 1, 3})
    for call in (scripted.stub.Generate, lambda r: list(scripted.stub.GenerateStream(r))):
        backend.closed.clear()
        with pytest.raises(grpc.RpcError) as info:
            call(pb.GenerateRequest(request_id="f", text="w5", n=4, sampling=pb.SamplingParameters(seed=0)))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        wait_until(lambda: sorted(backend.closed) == [f"f-{i}" for i in range(4)])
