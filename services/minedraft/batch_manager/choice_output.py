"""A generation's chunks as one choice of an OpenAI response: echo, logprobs, usage.

The same per-choice state serves a stream (one piece per chunk) and a whole body (the pieces joined), so
both carry the same text and logprobs. Choice i of a request belongs to prompt i // n (vLLM's order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minedraft.batch_manager.assistant_output import AssistantPlan, AssistantState
from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.openai_logprobs import (
    CompletionLogprobsBuilder,
    TokenNames,
    chat_logprobs,
    entries_of,
    join_completion_logprobs,
    vllm_prompt_logprobs,
)
from minedraft.batch_manager.openai_responses import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    PromptLogprobs,
    UsageInfo,
)
from minedraft.core.logprobs import TokenLogprob

FINISH_LENGTH = "length"


@dataclass(frozen=True, slots=True)
class PromptInfo:
    ids: list[int]
    echo: str  # text that starts each of its choices (completions' echo: the prompt; chat: the last message)


@dataclass(slots=True)
class OutputOptions:
    """What the client asked to see, beyond the text (not what the generations were run with: best_of makes
    them carry logprobs that are not shown unless asked for)."""

    names: TokenNames
    prompts: list[PromptInfo]
    per_prompt: int  # choices per prompt (n)
    logprobs: int | None = None  # top N per token; None: no logprobs
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs field
    echo_logprobs: bool = False  # completions' echo: the prompt's tokens lead the logprobs
    drop_output: bool = False  # echo with max_tokens=0: the one token generated is not shown or counted
    assistant: AssistantPlan | None = None  # chat: reasoning and tool calls to read out of the text

    def prompt_of(self, choice: int) -> PromptInfo:
        return self.prompts[choice // self.per_prompt]

    def usage(self, prompt_tokens: dict[int, int], completion_tokens: dict[int, int]) -> UsageInfo:
        """Summed over choices; each prompt counted once however many choices it has."""
        return UsageInfo.of(sum(prompt_tokens.values()), sum(completion_tokens.values()))


@dataclass(slots=True)
class ChoiceState:
    """One choice being built, chunk by chunk."""

    options: OutputOptions
    prompt: PromptInfo
    builder: CompletionLogprobsBuilder
    started: bool = False
    missing_logprobs: bool = False  # the backend sent none for some tokens: the choice shows logprobs null
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_logprobs: PromptLogprobs | None = None
    finish_reason: str | None = None
    assistant: AssistantState | None = None  # chat: the text read as reasoning, content and tool calls

    @classmethod
    def of(cls, options: OutputOptions, choice: int) -> ChoiceState:
        assistant = None if options.assistant is None else AssistantState(options.assistant)
        return cls(options, options.prompt_of(choice), CompletionLogprobsBuilder(options.names, options.logprobs or 0),
                   assistant=assistant)

    def take(self, chunk: GenerationChunk) -> str:
        """The choice's new text for `chunk` (echo first); updates usage and the finish reason."""
        o = self.options
        text = "" if o.drop_output else chunk.text
        if not self.started:
            self.started = True
            text = self.prompt.echo + text
        if chunk.prompt_logprobs is not None and o.prompt_logprobs is not None:
            self.prompt_logprobs = vllm_prompt_logprobs(o.names, self.prompt.ids, chunk.prompt_logprobs,
                                                        o.prompt_logprobs)
        self.prompt_tokens = chunk.prompt_tokens
        self.completion_tokens = 0 if o.drop_output else chunk.completion_tokens
        if chunk.finish_reason is not None:
            self.finish_reason = FINISH_LENGTH if o.drop_output else chunk.finish_reason
        return text

    def output_entries(self, chunk: GenerationChunk) -> list[TokenLogprob] | None:
        """The chunk's shown tokens' entries; None (and the choice marked) when the backend sent none."""
        if self.options.drop_output:
            return []
        entries = entries_of(chunk.token_ids, chunk.logprobs)
        if entries is None:
            self.missing_logprobs = True
        return entries

    def completion_logprobs(self, chunk: GenerationChunk, first: bool) -> CompletionLogprobs | None:
        o = self.options
        if o.logprobs is None:
            return None
        parts = []
        if first and o.echo_logprobs:
            if chunk.prompt_logprobs is None:
                self.missing_logprobs = True
            else:
                parts.append(self.builder.prompt_part(self.prompt.ids, chunk.prompt_logprobs))
        if first:
            self.builder.offset = len(self.prompt.echo)
        entries = self.output_entries(chunk)
        if entries:
            parts.append(self.builder.part(entries))
        return None if self.missing_logprobs else join_completion_logprobs(parts)

    def completion_piece(self, chunk: GenerationChunk, index: int) -> CompletionChoice:
        first = not self.started
        text = self.take(chunk)
        logprobs = self.completion_logprobs(chunk, first)
        finish_reason = None if chunk.finish_reason is None else self.finish_reason
        prompt_logprobs = None if chunk.prompt_logprobs is None else self.prompt_logprobs
        return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish_reason,
                                prompt_logprobs=prompt_logprobs)

    def chat_logprobs(self, chunk: GenerationChunk) -> ChatLogprobs | None:
        if self.options.logprobs is None:
            return None
        entries = self.output_entries(chunk)
        return None if entries is None else chat_logprobs(self.options.names, entries, self.options.logprobs)


def join_completion(pieces: Sequence[CompletionChoice], index: int) -> CompletionChoice:
    """A whole choice from its stream pieces."""
    logprobs = [p.logprobs for p in pieces]
    joined = None if any(lp is None for lp in logprobs) else join_completion_logprobs(logprobs)  # type: ignore[arg-type]
    prompt_logprobs = next((p.prompt_logprobs for p in pieces if p.prompt_logprobs is not None), None)
    return CompletionChoice(index=index, text="".join(p.text for p in pieces), logprobs=joined,
                            finish_reason=pieces[-1].finish_reason, prompt_logprobs=prompt_logprobs)


def join_chat_logprobs(parts: Sequence[ChatLogprobs | None]) -> ChatLogprobs | None:
    if not parts or any(p is None for p in parts):
        return None
    content: list[ChatTokenLogprob] = []
    for part in parts:
        content += part.content or []  # type: ignore[union-attr]
    return ChatLogprobs(content=content)
