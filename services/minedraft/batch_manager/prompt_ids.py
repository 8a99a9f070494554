"""Prompt text to token ids without stalling the event loop.

Tokenizing is about 0.7 s of CPU per MB of text. Short prompts are encoded inline (a thread
hop costs more than they do); long ones in a worker thread, through the tokenizer's
GIL-free path, so /health, running streams and other requests keep being served. The
request body limit (`--max-request-bytes`) bounds how long any one of them can take.
"""

from __future__ import annotations

import asyncio

from minedraft.batch_manager.chat import chat_prompt_ids
from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.core.tokenizer import Tokenizer

INLINE_CHARS = 16_384  # below this, encoding inline is cheaper than a thread hop


async def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    if len(text) < INLINE_CHARS:
        return tokenizer.encode(text)
    return await asyncio.get_running_loop().run_in_executor(None, tokenizer.encode_unlocked, text)


async def chat_ids(tokenizer: Tokenizer, messages: list[ChatMessage]) -> list[int]:
    """The chat template rendered and encoded; in a worker thread when the conversation is long."""
    size = sum(len(m.content) if isinstance(m.content, str) else sum(len(p.text or "") for p in m.content or [])
               for m in messages)
    if size < INLINE_CHARS:
        return chat_prompt_ids(tokenizer, messages)
    return await asyncio.get_running_loop().run_in_executor(None, chat_prompt_ids, tokenizer, messages, True)
