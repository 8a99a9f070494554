"""Prompt text to token ids without stalling the event loop or tokenizing what cannot fit.

Tokenizing costs about 0.7 s of CPU per MB of text and, for a few MB, hundreds of MB of memory.
Short prompts are encoded inline (a thread hop costs more than they do); long ones in a worker
thread, through the tokenizer's GIL-free path, so /health, running streams and other requests
keep being served. A long text is first counted piece by piece, and refused as soon as the
pieces hold clearly more tokens than the model's context, so a 4 MB prompt for a 4 K context
costs one 64 K piece, not the whole text. The request body limit (`--max-request-bytes`)
bounds everything else.
"""

from __future__ import annotations

import asyncio
import sys

from minedraft.batch_manager.backend import GenerationBackend
from minedraft.batch_manager.chat import RenderOptions, chat_prompt_ids, render_chat, uses_special_tokens
from minedraft.batch_manager.choice_output import PromptInfo
from minedraft.batch_manager.openai_models import ChatCompletionRequest, ChatMessage, CompletionRequest
from minedraft.core.errors import InvalidRequestError
from minedraft.core.tokenizer import Tokenizer

INLINE_CHARS = 16_384  # below this, encoding inline is cheaper than a thread hop
PIECE_CHARS = 65_536  # a long text is counted in pieces of this many characters first
SLACK_PER_CUT = 4  # tokens a cut through a word may add to the pieces' count


def encode_long(tokenizer: Tokenizer, text: str, max_context: int, add_special_tokens: bool = True,
                param: str = "prompt") -> list[int]:
    """The exact ids of `text` (from a worker thread), or InvalidRequestError as soon as its first
    pieces already hold more than `max_context` tokens (each cut may add a few; they are allowed for)."""
    counted = 0
    for cuts, start in enumerate(range(0, len(text) - PIECE_CHARS, PIECE_CHARS), start=1):
        counted += len(tokenizer.encode_unlocked(text[start:start + PIECE_CHARS], add_special_tokens=False))
        if counted - SLACK_PER_CUT * cuts > max_context:
            raise InvalidRequestError(f"{param} is longer than the model's context of {max_context} tokens (over "
                                      f"{counted - SLACK_PER_CUT * cuts} tokens in its first {start + PIECE_CHARS} "
                                      "characters); shorten it", param=param)
    return tokenizer.encode_unlocked(text, add_special_tokens=add_special_tokens)


async def encode_prompt(tokenizer: Tokenizer, text: str, max_context: int, add_special_tokens: bool = True,
                        param: str = "prompt") -> list[int]:
    if len(text) < INLINE_CHARS:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return await asyncio.get_running_loop().run_in_executor(None, encode_long, tokenizer, text, max_context,
                                                            add_special_tokens, param)


async def chat_ids(tokenizer: Tokenizer, messages: list[ChatMessage], max_context: int,
                   options: RenderOptions | None = None) -> list[int]:
    """The chat template rendered and encoded; off the event loop when the conversation is long."""
    options = options or RenderOptions()
    if sum(len(m.text()) for m in messages) < INLINE_CHARS:
        return chat_prompt_ids(tokenizer, messages, options)
    text = await asyncio.get_running_loop().run_in_executor(None, render_chat, tokenizer, messages, options)
    return await encode_prompt(tokenizer, text, max_context, uses_special_tokens(tokenizer, options), "messages")


def keep_last(ids: list[int], keep: int | None) -> list[int]:
    """truncate_prompt_tokens: the last `keep` tokens (None: all)."""
    return ids if keep is None or len(ids) <= keep else ids[-keep:]


async def completion_prompts(backend: GenerationBackend, body: CompletionRequest) -> list[PromptInfo]:
    """Each prompt's token ids (the last truncate_prompt_tokens of them) and its echo text."""
    keep = body.keep_prompt_tokens(backend.max_context)
    limit = backend.max_context if keep is None else sys.maxsize  # truncation makes a longer text fine
    out = []
    for prompt in body.prompts():
        ids = (await encode_prompt(backend.tokenizer, prompt, limit, body.add_special_tokens is not False)
               if isinstance(prompt, str) else list(prompt))
        kept = keep_last(ids, keep)
        echo = ""
        if body.echo:
            echo = prompt if isinstance(prompt, str) and kept is ids else backend.tokenizer.decode(
                kept, skip_special_tokens=body.skip_special_tokens is not False)
        out.append(PromptInfo(kept, echo))
    return out


def render_options(body: ChatCompletionRequest) -> RenderOptions:
    return RenderOptions(body.add_generation_prompt, body.continue_final_message, body.chat_template,
                         dict(body.chat_template_kwargs or {}), body.documents, body.add_special_tokens)
