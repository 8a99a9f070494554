"""Every conversion of sampling parameters and requests between the wire formats and core.

Three formats meet here: the public gRPC `SamplingParameters` (proto3 `optional` fields,
OpenAI defaults when unset), the internal control-plane `SeqSpec` (what a worker needs to
draw exactly the numbers the request would draw anywhere else: temperature, top-p, top-k and
the resolved seed) and OpenAI/vLLM JSON fields. Keeping them side by side is what keeps a
default or a sentinel (vLLM's top_k = -1) from meaning different things on different paths.
"""

from __future__ import annotations

from minedraft.core.request import Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.proto import control_pb2, generation_pb2

# OpenAI's defaults, used wherever the client left a field unset.
DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


def _top_k(value: int | None) -> int:
    """vLLM spells "no top-k" as -1, we as 0."""
    return 0 if value in (None, -1) else int(value)


def sampling_from_api(p: generation_pb2.SamplingParameters) -> SamplingParams:
    """Public gRPC message -> core (unset fields take the defaults documented in generation.proto)."""
    return SamplingParams(
        max_tokens=p.max_tokens if p.HasField("max_tokens") else DEFAULT_MAX_TOKENS,
        temperature=p.temperature if p.HasField("temperature") else DEFAULT_TEMPERATURE,
        top_p=p.top_p if p.HasField("top_p") else DEFAULT_TOP_P,
        top_k=_top_k(p.top_k),
        seed=p.seed if p.HasField("seed") else None,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
    )


def sampling_from_openai(
    *,
    max_tokens: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    seed: int | None,
    stop: str | list[str] | None,
    stop_token_ids: list[int] | None,
    ignore_eos: bool | None,
) -> SamplingParams:
    """OpenAI/vLLM JSON fields -> core (the caller resolves max_tokens, whose default differs per endpoint)."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_p=DEFAULT_TOP_P if top_p is None else top_p,
        top_k=_top_k(top_k),
        seed=seed,
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        stop_token_ids=list(stop_token_ids or []),
        ignore_eos=bool(ignore_eos),
    )


def seq_spec(req: Request) -> control_pb2.SeqSpec:
    """Core request -> the control-plane record a worker adds a sequence from (resolves the seed)."""
    p = req.params
    return control_pb2.SeqSpec(
        seq_id=req.req_id,
        tokens=req.all_tokens,
        sampling=control_pb2.SeqSampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                                         seed=p.resolved_seed()),
    )


def sampling_from_spec(spec: control_pb2.SeqSpec) -> SamplingParams:
    """Control-plane record -> what the worker's sampler needs (stop rules stay with the batch manager)."""
    s = spec.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed)
