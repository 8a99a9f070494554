"""OpenAI-compatible request bodies, with vLLM's extras, and how each maps onto SamplingParams.

Requests forbid unknown fields, as OpenAI does, so a typo ("max_token") is a 400 that names the field
instead of a silently ignored setting. Every field OpenAI or vLLM documents for these endpoints is known:
most are honoured; bookkeeping fields (user, metadata, store, ...) are accepted and change nothing; the few
features not served (suffix, the deprecated functions, beam search) are refused with a 400 naming the field
unless they hold their neutral value, which common clients send explicitly. Structured outputs and tools are
typed here and turned into grammars elsewhere (structured_request.py, tool_calls.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from minedraft.batch_manager.structured_request import StructuredFields
from minedraft.batch_manager.tool_calls import ChatTool
from minedraft.core.codec import sampling_from_openai
from minedraft.core.errors import InvalidRequestError
from minedraft.core.sampling_params import MAX_LOGPROBS, SamplingParams

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy completions default
MAX_CHOICES = 128  # n and best_of: candidates per prompt
MAX_GENERATIONS = 1024  # prompts x candidates of one request

Prompt = str | list[int]


class StrictModel(BaseModel):
    """A request body: unknown fields are an error."""

    # Flags must be JSON booleans ("yes" is an error, not true).
    # NaN and infinities (JSON's bare NaN/Infinity or strings like "NaN") are refused in every float field.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(StrictModel):
    include_usage: StrictBool | None = False
    continuous_usage_stats: StrictBool | None = False  # vLLM: usage on every chunk


def _refuse(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {what} not supported yet", param=param)


class _SamplingRequest(StrictModel, StructuredFields):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # OpenAI: an end-user id for abuse monitoring; accepted, unused
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: StrictBool | None = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: StrictBool | None = None
    spaces_between_special_tokens: StrictBool | None = None
    include_stop_str_in_output: StrictBool | None = None
    truncate_prompt_tokens: int | None = None
    return_tokens_as_token_ids: StrictBool | None = False
    priority: int | None = None
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    logprobs_mode: str | None = None  # minedraft: vLLM's server-wide --logprobs-mode, per request
    bad_words: list[str] | None = None
    use_beam_search: StrictBool | None = False
    length_penalty: float | None = None
    add_special_tokens: StrictBool | None = None
    request_id: str | None = None  # vLLM: the response's id (after its prefix) instead of a random one
    # vLLM: joins the prefix cache's key, so only requests with the same salt share cached blocks
    cache_salt: str | None = None
    # minedraft extra: seconds the whole request may take; past it, 408 (nothing sent yet) or, once a
    # stream has started, a last chunk with finish_reason "abort".
    timeout: float | None = Field(default=None, gt=0)

    def check_supported(self) -> None:
        """Reject what we do not implement or what contradicts itself, naming the field."""
        if self.n is not None and not 1 <= self.n <= MAX_CHOICES:
            raise InvalidRequestError(f"n must be in [1, {MAX_CHOICES}], got {self.n}", param="n")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true", param="stream_options")
        if self.bad_words:
            raise _refuse("bad_words", "bad_words is")
        if self.use_beam_search:
            raise _refuse("use_beam_search", "beam search is")
        if self.length_penalty not in (None, 1.0):
            raise _refuse("length_penalty", "length_penalty (a beam search setting) other than 1 is")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1 \
                and self.truncate_prompt_tokens != -1:
            raise InvalidRequestError("truncate_prompt_tokens must be >= 1 (keep the last N prompt tokens) or -1 "
                                      f"(the model's context), got {self.truncate_prompt_tokens}",
                                      param="truncate_prompt_tokens")

    @property
    def choices_per_prompt(self) -> int:
        return self.n or 1

    @property
    def wants_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def wants_continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def keep_prompt_tokens(self, max_context: int) -> int | None:
        """How many prompt tokens truncation keeps (the last ones); None: all."""
        if self.truncate_prompt_tokens is None:
            return None
        return max_context if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens

    def _logprob_fields(self) -> dict[str, Any]:
        return {"prompt_logprobs": self.prompt_logprobs}

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The core settings, with the structured output the request asks for (a chat endpoint may replace it
        with the grammar of the whole reply: reasoning, tool calls)."""
        params = sampling_from_openai(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
            logit_bias=self.logit_bias, min_p=self.min_p, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            min_tokens=self.min_tokens, allowed_token_ids=self.allowed_token_ids, logprobs_mode=self.logprobs_mode,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, priority=self.priority,
            cache_salt=self.cache_salt, **self._logprob_fields(),
        )
        params.structured = self.structured_output()
        return params


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: StrictBool | None = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.suffix:
            raise _refuse("suffix", "suffix (insertion) is")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}",
                                      param="logprobs")
        if self.best_of is not None:
            if not self.choices_per_prompt <= self.best_of <= MAX_CHOICES:
                raise InvalidRequestError(f"best_of must be in [n={self.choices_per_prompt}, {MAX_CHOICES}], got "
                                          f"{self.best_of}", param="best_of")
            if self.stream and self.best_of > self.choices_per_prompt:
                raise InvalidRequestError("best_of > n cannot be streamed (the best are known only at the end); "
                                          "send stream=false", param="best_of")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError("max_tokens must be >= 1 (0 is allowed only with echo=true)",
                                      param="max_tokens")
        if len(self.prompts()) * self.candidates > MAX_GENERATIONS:
            raise InvalidRequestError(f"prompts x best_of (or n) is over {MAX_GENERATIONS} generations; split the "
                                      "request", param="prompt")

    @property
    def candidates(self) -> int:
        """Generations per prompt: best_of when given, else n."""
        return self.best_of or self.choices_per_prompt

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens=0: one token is generated and dropped (what evaluation harnesses expect)."""
        return bool(self.echo) and self.max_tokens == 0

    def prompts(self) -> list[Prompt]:
        """The request's prompts: one string or token-id list, or a batch of them."""
        prompt = self.prompt
        if isinstance(prompt, str) or (_is_ids(prompt) and prompt):
            return [prompt]
        if prompt and (all(isinstance(p, str) for p in prompt) or all(_is_ids(p) for p in prompt)):
            return list(prompt)  # type: ignore[arg-type]
        raise InvalidRequestError("prompt must be a string, a list of token ids, or a non-empty list of either",
                                  param="prompt")

    def _logprob_fields(self) -> dict[str, Any]:
        echoed = self.logprobs if self.echo and self.prompt_logprobs is None else self.prompt_logprobs
        return {"logprobs": self.logprobs, "prompt_logprobs": echoed}

    def resolved_max_tokens(self) -> int:
        if self.max_tokens is None:
            return DEFAULT_COMPLETION_MAX_TOKENS
        return 1 if self.echo_only else self.max_tokens


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """Extra keys (name, tool_call_id, ...) are passed to the chat template untouched."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: StrictBool | None = False
    top_logprobs: int | None = None
    # OpenAI bookkeeping and tool fields
    metadata: dict[str, str] | None = None
    store: StrictBool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    parallel_tool_calls: StrictBool | None = None
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    # vLLM extras
    echo: StrictBool | None = False
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
                raise InvalidRequestError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}",
                                          param="top_logprobs")
            if not self.logprobs:
                raise InvalidRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        if self.functions:
            raise _refuse("functions", "the deprecated functions field (send tools) is")
        if self.function_call not in (None, "none", "auto"):
            raise _refuse("function_call", "the deprecated function_call field (send tool_choice) is")
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidRequestError("continue_final_message and add_generation_prompt cannot both be true; set "
                                      "add_generation_prompt=false to continue the last message",
                                      param="continue_final_message")
        if self.modalities not in (None, ["text"]):
            raise _refuse("modalities", "output modalities other than text are")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def echo_text(self) -> str:
        """vLLM's chat echo: the last message's content, when it is the assistant's, starts every choice."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == "assistant" else ""

    def _logprob_fields(self) -> dict[str, Any]:
        return {"logprobs": (self.top_logprobs or 0) if self.logprobs else None,
                "prompt_logprobs": self.prompt_logprobs}
