"""Per-request decoding settings, with the checks a request must pass (no torch here)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

from minedraft.core.errors import InvalidRequestError
from minedraft.core.structured import StructuredOutput

MIN_TEMPERATURE = 1e-5  # below this, logits / temperature can overflow float32; use 0 for greedy
MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI and vLLM's --max-logprobs default
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound


@dataclass(slots=True)
class SamplingParams:
    """Per-request decoding settings (OpenAI/vLLM names).

    The processing of the target's logits at every position, in this order (vLLM's): `allowed_token_ids`
    masks every other token; `min_tokens` masks `min_tokens_stop_ids` while the output is shorter; `logit_bias`
    is added; `repetition_penalty` divides positive (multiplies negative) logits of tokens seen in prompt or
    output; `frequency_penalty` x count and `presence_penalty` x seen are subtracted for output tokens; then
    temperature, `min_p`, top-k and top-p. Logprobs are read before all of it (raw) or after (processed).
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    allowed_token_ids: list[int] | None = None
    logprobs: int | None = None  # alternatives per output token (0: the chosen token's alone); None: none
    prompt_logprobs: int | None = None  # the same for every prompt token but the first
    logprobs_mode: str = "raw_logprobs"
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = 0  # scheduling: lower first (vLLM's priority policy), ties in arrival order
    # Prefix caching: joins the hash of the first KV block, so only requests with the same salt share cached
    # blocks (a tenant cannot time another's prompts). Not a sampling setting; it travels with them.
    cache_salt: str | None = None
    # The output must match this (JSON schema, regex, choice, grammar); every position is masked with it.
    structured: StructuredOutput | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether the target's logits are changed before sampling (beyond temperature, top-k and top-p)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.allowed_token_ids or self.min_p
                    or self.structured is not None)

    @property
    def penalised(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequestError naming the first field that cannot be served."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}",
                                      param="max_tokens")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidRequestError(f"{name} must be a finite number, got {value!r}", param=name)
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}", param="temperature")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise InvalidRequestError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE}, got "
                                      f"{self.temperature}: smaller values overflow the scaled logits",
                                      param="temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0 (0 disables it), got {self.top_k}", param="top_k")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", param="min_p")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {getattr(self, name)}", param=name)
        if self.repetition_penalty <= 0:
            raise InvalidRequestError(f"repetition_penalty must be > 0 (1 disables it), got "
                                      f"{self.repetition_penalty}", param="repetition_penalty")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got "
                                      f"{self.min_tokens!r}", param="min_tokens")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= MAX_LOGPROBS):
                raise InvalidRequestError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}",
                                          param=name)
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise InvalidRequestError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got "
                                      f"{self.logprobs_mode!r}", param="logprobs_mode")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequestError(f"seed must be in [0, 2**63), got {self.seed}", param="seed")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty", param="stop")
        if any(not math.isfinite(b) or abs(b) > MAX_LOGIT_BIAS for b in self.logit_bias.values()):
            raise InvalidRequestError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
                                      param="logit_bias")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise InvalidRequestError("cache_salt must be a non-empty string", param="cache_salt")
        if self.structured is not None:
            self.structured.check()
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise InvalidRequestError("allowed_token_ids must not be empty", param="allowed_token_ids")
        if vocab_size is not None:
            self._check_ids(vocab_size)

    def _check_ids(self, vocab_size: int) -> None:
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias", list(self.logit_bias)),
                          ("allowed_token_ids", self.allowed_token_ids or [])):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise InvalidRequestError(f"{name} holds token ids {bad[:5]} outside the vocabulary "
                                          f"[0, {vocab_size})", param=name)

    def resolved_seed(self) -> int:
        """The request's seed, drawn from the OS when the user gave none."""
        if self.seed is None:
            self.seed = secrets.randbits(63)
        return self.seed
