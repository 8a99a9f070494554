"""Core results -> minedraft.v1 messages (chunks, responses, logprob entries).

Logprob values are copied as the engine gave them (float32 into a proto `float`: no rounding on the way),
so a client can compare a greedy token's logprob with its top alternative's for equality.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from minedraft.batch_manager.assistant_output import AssistantPlan, AssistantState
from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.choices import Collected, FanOut, best
from minedraft.batch_manager.grpc_chat import delta_fields, message_fields
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import generation_pb2 as pb


class TokenText:
    """Each token id decoded alone, special tokens included; cached (at most one entry per vocabulary id),
    since the same alternatives come back token after token."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text


def logprob_messages(entries: Iterable[TokenLogprob | None], text: TokenText) -> list[pb.TokenLogprob]:
    """Entries that are None (the first prompt token's) are left out."""
    return [pb.TokenLogprob(token_id=e.token_id, logprob=e.logprob, rank=e.rank, token=text(e.token_id),
                            alternatives=[pb.TokenLogprob.Alternative(token_id=t, logprob=v, token=text(t))
                                          for t, v in e.top])
            for e in entries if e is not None]


def chunk_message(request_id: str, index: int, chunk: GenerationChunk, text: TokenText,
                  assistant: AssistantState | None = None) -> pb.GenerateChunk:
    """With `assistant` (a chat prompt's choice), the text is read as reasoning, content and tool calls."""
    message = pb.GenerateChunk(
        request_id=request_id, index=index, text=chunk.text, token_ids=chunk.token_ids,
        finish_reason=chunk.finish_reason or "", cumulative_logprob=chunk.cumulative_logprob,
        usage=pb.Usage(prompt_tokens=chunk.prompt_tokens, completion_tokens=chunk.completion_tokens),
    )
    if chunk.logprobs:
        message.logprobs.extend(logprob_messages(chunk.logprobs, text))
    if chunk.prompt_logprobs:
        message.prompt_logprobs.extend(logprob_messages(chunk.prompt_logprobs, text))
    if assistant is not None:
        fields = delta_fields(assistant.feed(chunk.text, final=chunk.finish_reason is not None))
        message.text, message.reasoning_content = fields["text"], fields["reasoning_content"]
        message.tool_calls.extend(fields["tool_calls"])
        message.finish_reason = assistant.finish_reason(chunk.finish_reason) or ""
    return message


def _choice(index: int, c: Collected, keep_logprobs: bool, text: TokenText, plan: AssistantPlan | None
            ) -> pb.Choice:
    fields: dict[str, object] = {"text": c.text}
    reason = c.finish_reason
    if plan is not None:
        state = AssistantState(plan)
        state.feed(c.text, final=True)
        fields, reason = message_fields(state.message()), state.finish_reason(reason, whole=True) or ""
    return pb.Choice(index=index, token_ids=c.token_ids, finish_reason=reason,
                     logprobs=logprob_messages(c.logprobs, text) if keep_logprobs else [],
                     cumulative_logprob=c.cumulative_logprob if keep_logprobs else 0.0, **fields)


def response_message(request_id: str, fan: FanOut, candidates: Sequence[Collected], keep_logprobs: bool,
                     text: TokenText, assistant: AssistantPlan | None = None) -> pb.GenerateResponse:
    """The n choices (the n best candidates with best_of); logprobs the user did not ask for (forced on to rank
    the candidates) are left out, and so is their cumulative logprob. With `assistant` (a chat prompt), each
    choice's text is read as reasoning, content and tool calls."""
    chosen = best(candidates, fan.n) if fan.ranks else list(candidates[:fan.n])
    choices = [_choice(i, c, keep_logprobs, text, assistant) for i, c in enumerate(chosen)]
    first = choices[0]
    response = pb.GenerateResponse(
        request_id=request_id, text=first.text, token_ids=first.token_ids, finish_reason=first.finish_reason,
        logprobs=first.logprobs, cumulative_logprob=first.cumulative_logprob, choices=choices,
        reasoning_content=first.reasoning_content, tool_calls=first.tool_calls,
        usage=pb.Usage(prompt_tokens=candidates[0].prompt_tokens,
                       completion_tokens=sum(c.completion_tokens for c in candidates)),
    )
    if candidates[0].prompt_logprobs:
        response.prompt_logprobs.extend(logprob_messages(candidates[0].prompt_logprobs, text))
    return response
