"""Chat messages -> prompt token ids, the way Hugging Face's apply_chat_template does it.

A model folder's tokenizer_config.json `chat_template` (or the request's own) is a Jinja2 template rendered
in a sandbox with `messages`, `tools` (when the request has any), `add_generation_prompt`, the special tokens
and the request's chat_template_kwargs; the text is then encoded without adding special tokens, since the
template writes them itself. continue_final_message cuts the text after the last message's content. Models
without a template (base models) get a plain "role: content" transcript.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.batch_manager.tool_calls import template_tool_calls
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
    """Plain dicts with string content (only text content parts can be served by a text model) and the
    assistant's earlier tool calls with their arguments as objects, as templates expect them."""
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
        if "tool_calls" in data:
            data["tool_calls"] = template_tool_calls(data["tool_calls"])
        result.append(data)
    return result


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """How a conversation becomes a prompt (transformers' apply_chat_template arguments)."""

    add_generation_prompt: bool = True  # open the assistant's turn
    continue_final_message: bool = False  # end the prompt inside the last message, for the model to go on
    template: str | None = None  # the request's own template (vLLM's chat_template); None: the model's
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # more variables (e.g. enable_thinking)
    documents: list[dict[str, str]] | None = None
    add_special_tokens: bool | None = None  # None: only without a template (a template writes its own)
    tools: list[dict[str, Any]] | None = None  # OpenAI's tool objects, rendered by the template


def plain_prompt(messages: list[dict[str, Any]], options: RenderOptions | None = None) -> str:
    """A "role: content" transcript for models without a template."""
    options = options or RenderOptions()
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    if options.continue_final_message:
        return text.removesuffix("\n")
    return text + "assistant:" if options.add_generation_prompt else text


def cut_after_final_message(rendered: str, messages: list[dict[str, Any]]) -> str:
    """continue_final_message: the rendered text up to the end of the last message's content (whatever the
    template writes after it, such as an end-of-turn token, is dropped), as transformers does."""
    final = messages[-1]["content"] if messages else ""
    for needle in (final, final.strip()):
        at = rendered.rfind(needle) if needle else -1
        if at >= 0:
            return rendered[: at + len(needle)]
    raise InvalidRequestError("continue_final_message: the chat template does not write the last message's "
                              "content as it is, so the prompt cannot end inside it", param="continue_final_message")


def _compiled(tokenizer: Tokenizer, options: RenderOptions) -> jinja2.Template | None:
    """The request's template (a broken one is the client's error) or the model's (a broken one is a server
    fault: 500); None: no template."""
    if options.template is None:
        source = chat_template(tokenizer)
        return None if source is None else compile_template(source)
    try:
        return compile_template(options.template)
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"chat_template does not compile: {exc}", param="chat_template") from exc


def render_chat(tokenizer: Tokenizer, messages: list[ChatMessage], options: RenderOptions | None = None) -> str:
    """The prompt text for `messages`: the assistant's turn opened, or the last message left open."""
    options = options or RenderOptions()
    dicts = message_dicts(messages)
    template = _compiled(tokenizer, options)
    if template is None:
        return plain_prompt(dicts, options)
    context = {**special_tokens(tokenizer), **options.template_kwargs, "messages": dicts,
               "add_generation_prompt": options.add_generation_prompt}
    if options.documents is not None:
        context["documents"] = options.documents
    if options.tools is not None:
        context["tools"] = options.tools
    try:
        rendered = template.render(**context)
    except jinja2.TemplateError as exc:  # raise_exception() in templates reports bad conversations
        raise InvalidRequestError(f"messages: the model's chat template rejected them: {exc}",
                                  param="messages") from exc
    return cut_after_final_message(rendered, dicts) if options.continue_final_message else rendered


def uses_special_tokens(tokenizer: Tokenizer, options: RenderOptions) -> bool:
    """Whether the rendered text is encoded with the tokenizer's special tokens added."""
    if options.add_special_tokens is not None:
        return options.add_special_tokens
    return (options.template or chat_template(tokenizer)) is None


def chat_prompt_ids(tokenizer: Tokenizer, messages: list[ChatMessage], options: RenderOptions | None = None
                    ) -> list[int]:
    options = options or RenderOptions()
    text = render_chat(tokenizer, messages, options)
    return tokenizer.encode(text, add_special_tokens=uses_special_tokens(tokenizer, options))
