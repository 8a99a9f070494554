"""Every conversion of sampling parameters and requests between the wire formats and core.

Three formats meet here: the public gRPC `SamplingParameters` (proto3 `optional` fields,
OpenAI defaults when unset), the internal control-plane `SeqSpec` (what a worker needs to
draw exactly the numbers the request would draw anywhere else: temperature, top-p, top-k and
the resolved seed) and OpenAI/vLLM JSON fields. Keeping them side by side is what keeps a
default or a sentinel (vLLM's top_k = -1) from meaning different things on different paths.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minedraft.core.errors import InvalidRequestError
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.request import Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.structured import StructuredOutput
from minedraft.proto import control_pb2, generation_pb2

# OpenAI's defaults, used wherever the client left a field unset.
DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


def _top_k(value: int | None) -> int:
    """vLLM spells "no top-k" as -1, we as 0."""
    return 0 if value in (None, -1) else int(value)


# gRPC `optional` fields whose unset value is the core's own default (the neutral one, as in vLLM).
API_OPTIONAL_FIELDS = ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
                       "logprobs", "prompt_logprobs", "logprobs_mode", "skip_special_tokens",
                       "spaces_between_special_tokens", "include_stop_str_in_output", "priority", "cache_salt")


def sampling_from_api(p: generation_pb2.SamplingParameters) -> SamplingParams:
    """Public gRPC message -> core (unset fields take the defaults documented in generation.proto)."""
    params = SamplingParams(
        max_tokens=p.max_tokens if p.HasField("max_tokens") else DEFAULT_MAX_TOKENS,
        temperature=p.temperature if p.HasField("temperature") else DEFAULT_TEMPERATURE,
        top_p=p.top_p if p.HasField("top_p") else DEFAULT_TOP_P,
        top_k=_top_k(p.top_k),
        seed=p.seed if p.HasField("seed") else None,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        logit_bias={int(t): float(v) for t, v in p.logit_bias.items()},
        allowed_token_ids=list(p.allowed_token_ids) or None,
    )
    for name in API_OPTIONAL_FIELDS:
        if p.HasField(name):
            setattr(params, name, getattr(p, name))
    return params


# OpenAI/vLLM JSON fields that map one to one onto SamplingParams (unset: the core default).
OPENAI_PASSTHROUGH = ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
                      "allowed_token_ids", "logprobs", "prompt_logprobs", "logprobs_mode", "skip_special_tokens",
                      "spaces_between_special_tokens", "include_stop_str_in_output", "priority", "cache_salt")


def _logit_bias(bias: dict[Any, float] | None) -> dict[int, float]:
    """OpenAI keys token ids as strings ("50256"); a key that is no integer is the client's error."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            out[int(key)] = float(value)
        except (TypeError, ValueError):
            raise InvalidRequestError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
    return out


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
    logit_bias: dict[Any, float] | None = None,
    **extras: Any,
) -> SamplingParams:
    """OpenAI/vLLM JSON fields -> core (the caller resolves max_tokens, whose default differs per endpoint);
    `extras` are OPENAI_PASSTHROUGH fields, None where the client left them unset."""
    unknown = set(extras) - set(OPENAI_PASSTHROUGH)
    if unknown:
        raise TypeError(f"not sampling fields: {sorted(unknown)}")
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_p=DEFAULT_TOP_P if top_p is None else top_p,
        top_k=_top_k(top_k),
        seed=seed,
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        stop_token_ids=list(stop_token_ids or []),
        ignore_eos=bool(ignore_eos),
        logit_bias=_logit_bias(logit_bias),
    )
    for name, value in extras.items():
        if value is not None:
            setattr(params, name, list(value) if name == "allowed_token_ids" else value)
    return params


def seq_spec(req: Request, stop_ids: Iterable[int] = (), fork_of: int | None = None, prefix_cache: bool = False,
             read_cache: bool = True) -> control_pb2.SeqSpec:
    """Core request -> the control-plane record a worker adds a sequence from (resolves the seed). `stop_ids`:
    the model's end tokens, masked with the stop token ids while the output is shorter than min_tokens;
    prompt logprobs are asked for until the request has them. `prefix_cache`: the worker looks the tokens up
    in its cache (unless not `read_cache`) and publishes the verified ones, under the request's cache_salt."""
    p = req.params
    sampling = control_pb2.SeqSampling(
        temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.resolved_seed(), min_p=p.min_p,
        presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty, logit_bias=p.logit_bias, min_tokens=p.min_tokens,
        allowed_token_ids=p.allowed_token_ids or [], processed_logprobs=p.logprobs_mode == "processed_logprobs",
    )
    if p.min_tokens:
        masked = set(p.stop_token_ids) | (set() if p.ignore_eos else set(stop_ids))
        sampling.min_tokens_stop_ids.extend(sorted(masked))
    if p.structured is not None:
        sampling.grammar = p.structured.grammar()
    if p.logprobs is not None:
        sampling.logprobs = p.logprobs
    if p.prompt_logprobs is not None and req.prompt_logprobs is None:
        sampling.prompt_logprobs = p.prompt_logprobs
    spec = control_pb2.SeqSpec(seq_id=req.req_id, tokens=req.all_tokens, sampling=sampling,
                               prompt_len=len(req.prompt_ids), prefix_cache=prefix_cache,
                               cache_salt=p.cache_salt or "", skip_cache_read=prefix_cache and not read_cache)
    if fork_of is not None:
        spec.fork_of = fork_of
        spec.fork_tokens = len(req.prompt_ids)
    return spec


def sampling_from_spec(spec: control_pb2.SeqSpec) -> SamplingParams:
    """Control-plane record -> what the worker's sampler and logits processing need (stop rules stay with the
    batch manager, but for the ids min_tokens masks, which ride in stop_token_ids here)."""
    s = spec.sampling
    return SamplingParams(
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed, min_p=s.min_p,
        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty or 1.0, logit_bias=dict(s.logit_bias), min_tokens=s.min_tokens,
        stop_token_ids=list(s.min_tokens_stop_ids), allowed_token_ids=list(s.allowed_token_ids) or None,
        logprobs=s.logprobs if s.HasField("logprobs") else None,
        prompt_logprobs=s.prompt_logprobs if s.HasField("prompt_logprobs") else None,
        logprobs_mode="processed_logprobs" if s.processed_logprobs else "raw_logprobs",
        structured=StructuredOutput("llguidance", s.grammar) if s.grammar else None,
    )


def logprobs_to_wire(seq_id: int, entries: list[TokenLogprob], top_n: int) -> control_pb2.SeqLogprobs:
    msg = control_pb2.SeqLogprobs(seq_id=seq_id, top_n=top_n)
    msg.logprobs.extend(e.logprob for e in entries)
    msg.ranks.extend(e.rank for e in entries)
    for e in entries:
        msg.top_ids.extend(t for t, _ in e.top)
        msg.top_logprobs.extend(v for _, v in e.top)
    return msg


def logprobs_from_wire(msg: control_pb2.SeqLogprobs, token_ids: list[int]) -> list[TokenLogprob]:
    """The entries of `token_ids` (the tokens the logprobs are of, in order)."""
    n = msg.top_n
    ids, values = list(msg.top_ids), list(msg.top_logprobs)
    return [TokenLogprob(t, lp, rank, list(zip(ids[i * n:(i + 1) * n], values[i * n:(i + 1) * n], strict=True)))
            for i, (t, lp, rank) in enumerate(zip(token_ids, msg.logprobs, msg.ranks, strict=True))]
