"""Chat messages -> prompt token ids, the way Hugging Face's apply_chat_template does it.

A model folder's tokenizer_config.json `chat_template` is a Jinja2 template rendered in a
sandbox with `messages`, `add_generation_prompt=True` and the special tokens; the text is
then encoded without adding special tokens, since the template writes them itself.
Models without a template (base models) get a plain "role: content" transcript.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.core.errors import InvalidRequestError
from minedraft.core.tokenizer import Tokenizer


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker): rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2 API

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    """Same environment settings as transformers, so templates written for HF render identically."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def chat_template(tokenizer: Tokenizer) -> str | None:
    """The folder's template; a list of named templates (newer HF format) yields the "default" one."""
    template: Any = tokenizer.chat_template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """bos_token, eos_token, ... as strings, which is what templates expect."""
    out: dict[str, str] = {}
    for key, value in tokenizer.config.items():
        if key.endswith("_token"):
            content = value.get("content") if isinstance(value, dict) else value
            if isinstance(content, str):
                out[key] = content
    return out


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Plain dicts with string content; only text content parts can be served by a text model."""
    result = []
    for i, message in enumerate(messages):
        data = message.model_dump(exclude_none=True)
        content = message.content
        if isinstance(content, list):
            if any(part.type != "text" or part.text is None for part in content):
                raise InvalidRequestError(f"messages[{i}].content: only text content parts are supported",
                                          param=f"messages[{i}].content")
            content = "".join(part.text or "" for part in content)
        data["content"] = content or ""
        result.append(data)
    return result


def plain_prompt(messages: list[dict[str, Any]]) -> str:
    lines = [f"{m['role']}: {m['content']}\n" for m in messages]
    return "".join(lines) + "assistant:"


def render_chat(tokenizer: Tokenizer, messages: list[ChatMessage]) -> str:
    """The prompt text for `messages` with the assistant's turn opened."""
    dicts = message_dicts(messages)
    source = chat_template(tokenizer)
    if source is None:
        return plain_prompt(dicts)
    template = compile_template(source)  # a broken template is a server fault (500), not a bad request
    try:
        return template.render(messages=dicts, add_generation_prompt=True, **special_tokens(tokenizer))
    except jinja2.TemplateError as exc:  # raise_exception() in templates reports bad conversations
        raise InvalidRequestError(f"messages: the model's chat template rejected them: {exc}",
                                  param="messages") from exc


def chat_prompt_ids(tokenizer: Tokenizer, messages: list[ChatMessage]) -> list[int]:
    text = render_chat(tokenizer, messages)
    return tokenizer.encode(text, add_special_tokens=chat_template(tokenizer) is None)
