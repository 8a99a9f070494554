"""OpenAI-compatible response bodies and stream chunks (with vLLM's prompt_logprobs where asked for)."""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_serializer


def now() -> int:
    return int(time.time())


class _DropsNone(BaseModel):
    """Serialises without the keys listed in `_optional` while they are None (OpenAI omits absent keys)."""

    _optional: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None or k not in self._optional}


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


# vLLM's prompt_logprobs: per prompt token (the first None), {token id as a string: its entry}
PromptLogprobs = list[dict[str, dict[str, Any]] | None]


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_DropsNone):
    _optional: ClassVar[tuple[str, ...]] = ("prompt_logprobs",)

    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(BaseModel):
    """Both the whole response and, with stream=true, each chunk (OpenAI uses one shape)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ChatMessageOut(_DropsNone):
    """content is null when the reply is tool calls alone, as OpenAI sends it."""

    _optional: ClassVar[tuple[str, ...]] = ("reasoning_content", "tool_calls")

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None  # a thinking model's reasoning (vLLM's field)
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(_DropsNone):
    _optional: ClassVar[tuple[str, ...]] = ("prompt_logprobs",)

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None


class FunctionDelta(_DropsNone):
    _optional: ClassVar[tuple[str, ...]] = ("name", "arguments")

    name: str | None = None
    arguments: str | None = None


class ToolCallDeltaOut(_DropsNone):
    """A call's first delta has its id, type and name; the next ones pieces of its arguments."""

    _optional: ClassVar[tuple[str, ...]] = ("id", "type")

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChatDelta(_DropsNone):
    """OpenAI omits absent delta keys; the final chunk's delta is {}."""

    _optional: ClassVar[tuple[str, ...]] = ("role", "content", "reasoning_content", "tool_calls")

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDeltaOut] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "minedraft"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
