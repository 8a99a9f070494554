"""Logprobs and logits processing over gRPC, end to end on the engine (speculative mode, random pair)."""

from __future__ import annotations

import grpc
import pytest

from minedraft.proto import generation_pb2 as pb
from tests.test_grpc_api import request
from tests.test_grpc_surface import PROMPT, Server, loop, served

__all__ = ["loop", "served"]  # fixtures, imported to be found


def test_greedy_logprobs_are_rank_1_and_equal_the_top_alternative(served: Server) -> None:
    response = served.stub.Generate(request(PROMPT, logprobs=3, ignore_eos=True))
    assert len(response.logprobs) == len(response.token_ids) == 20
    for token_id, entry in zip(response.token_ids, response.logprobs, strict=True):
        assert (entry.token_id, entry.rank) == (token_id, 1)
        assert len(entry.alternatives) == 3
        assert entry.alternatives[0].token_id == token_id
        assert entry.logprob == entry.alternatives[0].logprob  # unrounded: exactly equal
        assert [a.logprob for a in entry.alternatives] == sorted((a.logprob for a in entry.alternatives),
                                                                 reverse=True)
        assert entry.token == f"w{token_id}" and entry.alternatives[1].token.startswith("w")
    assert response.cumulative_logprob == pytest.approx(sum(e.logprob for e in response.logprobs), abs=1e-4)
    assert response.choices[0].logprobs == response.logprobs

    chunks = list(served.stub.GenerateStream(request(PROMPT, logprobs=3, ignore_eos=True)))
    assert [e for c in chunks for e in c.logprobs] == list(response.logprobs)
    assert chunks[-1].cumulative_logprob == response.cumulative_logprob


def test_logprobs_0_is_the_chosen_token_alone_and_unset_is_none(served: Server) -> None:
    alone = served.stub.Generate(request(PROMPT, logprobs=0, max_tokens=4))
    assert len(alone.logprobs) == 4 and all(not e.alternatives and e.rank == 1 for e in alone.logprobs)
    plain = served.stub.Generate(request(PROMPT, max_tokens=4))
    assert not plain.logprobs and plain.cumulative_logprob == 0.0


def test_prompt_logprobs_are_of_prompt_tokens_after_the_first(served: Server) -> None:
    response = served.stub.Generate(request(PROMPT, prompt_logprobs=2, max_tokens=3))
    assert [e.token_id for e in response.prompt_logprobs] == PROMPT[1:]
    assert all(len(e.alternatives) == 2 and e.rank >= 1 for e in response.prompt_logprobs)
    chunks = list(served.stub.GenerateStream(request(PROMPT, prompt_logprobs=2, max_tokens=3)))
    assert [len(c.prompt_logprobs) for c in chunks if c.prompt_logprobs] == [len(PROMPT) - 1]
    assert chunks[0].prompt_logprobs == response.prompt_logprobs


def test_penalties_change_a_greedy_output(served: Server) -> None:
    plain = served.stub.Generate(request(PROMPT, ignore_eos=True))
    assert len(set(plain.token_ids)) < len(plain.token_ids)  # it repeats itself: something to penalise
    for penalty in ({"repetition_penalty": 2.0}, {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        penalised = served.stub.Generate(request(PROMPT, ignore_eos=True, **penalty))
        assert penalised.token_ids != plain.token_ids, penalty


def test_logit_bias_and_allowed_token_ids_steer_greedy_tokens(served: Server) -> None:
    biased = served.stub.Generate(request(PROMPT, ignore_eos=True, max_tokens=6, logit_bias={40: 100.0}))
    assert list(biased.token_ids) == [40] * 6
    allowed = served.stub.Generate(request(PROMPT, ignore_eos=True, max_tokens=8, allowed_token_ids=[4, 9]))
    assert set(allowed.token_ids) <= {4, 9}


def test_best_of_returns_the_most_likely_candidate(served: Server) -> None:
    sampling = {"temperature": 1.0, "seed": 5, "max_tokens": 8, "ignore_eos": True, "logprobs": 0}
    alone = [served.stub.Generate(request(PROMPT, **{**sampling, "seed": 5 + i})) for i in range(3)]
    best = max(alone, key=lambda r: r.cumulative_logprob)
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=PROMPT), best_of=3, sampling=pb.SamplingParameters(**sampling))
    response = served.stub.Generate(req)
    assert response.token_ids == best.token_ids and len(response.choices) == 1
    assert response.cumulative_logprob == pytest.approx(best.cumulative_logprob)
    assert response.usage.completion_tokens == 24
    req.sampling.ClearField("logprobs")
    unasked = served.stub.Generate(req)
    assert unasked.token_ids == best.token_ids and not unasked.logprobs and unasked.cumulative_logprob == 0.0


def test_a_bad_logprobs_mode_names_the_field(served: Server) -> None:
    with pytest.raises(grpc.RpcError) as info:
        served.stub.Generate(request(PROMPT, logprobs=1, logprobs_mode="logits"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "logprobs_mode" in info.value.details()
