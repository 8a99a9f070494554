"""Thinking models: `<think>` blocks split into reasoning_content, streamed in any split and whole; where the
reasoning starts read off the rendered prompt (`enable_thinking` honoured); the grammar that lets a model think
freely and then constrains its answer; and, through the real API layers, the tiny pair (whose template opens a
think block with `enable_thinking: true`) and scripted Qwen3-style text with reasoning, answers and calls."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from minedraft.batch_manager.chat import RenderOptions, render_chat
from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.batch_manager.reasoning import ReasoningSplitter, Start, reasoning_start
from minedraft.batch_manager.structured_request import chat_grammar
from minedraft.batch_manager.tool_calls import ChatTool, tool_plan
from minedraft.core.structured import StructuredOutput
from tests.structured_support import MODEL, ScriptedText, TinyServer, matches, serve_backend, serve_tiny

ASK = [{"role": "user", "content": "Is 17 prime?"}]
SCHEMA = {"type": "object", "properties": {"prime": {"type": "boolean"}}, "required": ["prime"],
          "additionalProperties": False}
THINKING = {"chat_template_kwargs": {"enable_thinking": True}}


def split(start: Start, text: str, seed: int | None = None) -> tuple[str, str]:
    splitter, reasoning, content = ReasoningSplitter.of(start), "", ""
    rng, at = random.Random(seed), 0
    while at < len(text):
        size = len(text) if seed is None else rng.randint(1, 4)
        r, c = splitter.feed(text[at:at + size])
        reasoning, content, at = reasoning + r, content + c, at + size
    r, c = splitter.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("seed", [None, 0, 1, 2])
def test_the_split_is_the_same_in_any_split(seed: int | None) -> None:
    assert split("maybe", "<think>\nOdd, no divisor.\n</think>\n\nYes.", seed) == ("Odd, no divisor.\n", "Yes.")
    assert split("maybe", "Yes, it is <think> not here", seed) == ("", "Yes, it is <think> not here")
    assert split("inside", "no divisor up to 4</think>\n\n{\"prime\":true}", seed) == ("no divisor up to 4",
                                                                                        '{"prime":true}')
    assert split("inside", "still thinking </thi", seed) == ("still thinking </thi", "")  # cut off by max_tokens
    assert split("off", "<think>x</think>y", seed) == ("", "<think>x</think>y")


QWEN3 = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
         "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- if enable_thinking is defined and not "
         "enable_thinking %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}")


def test_the_start_is_read_off_the_rendered_prompt(tiny: TinyServer) -> None:
    tok, messages = tiny.backend.tokenizer, [ChatMessage.model_validate(m) for m in ASK]
    hybrid = render_chat(tok, messages, RenderOptions(template=QWEN3))
    assert reasoning_start(QWEN3, hybrid[-40:]) == "maybe"  # Qwen3's default: the model opens the block
    off = render_chat(tok, messages, RenderOptions(template=QWEN3, template_kwargs={"enable_thinking": False}))
    assert reasoning_start(QWEN3, off[-40:]) == "off"
    bundled = render_chat(tok, messages, RenderOptions(template_kwargs={"enable_thinking": True}))
    assert bundled.endswith("<think>\n") and reasoning_start(tok.chat_template, bundled) == "inside"
    assert reasoning_start(tok.chat_template, render_chat(tok, messages)) == "off"  # the bundled default
    assert reasoning_start("{{ messages }}", "<think>\n") is None  # a template without think blocks


def test_the_answer_is_constrained_only_after_the_reasoning() -> None:
    answer = StructuredOutput("json_schema", json.dumps(SCHEMA))
    inside, maybe, off = (chat_grammar(answer, start, None) for start in ("inside", "maybe", None))
    assert inside is not None and maybe is not None and off is answer
    thought = "17 is odd; 3 * 5 = 15 < 17 {not json} </thin"
    assert matches(inside.grammar(), thought + '</think>\n\n{"prime":true}')
    assert not matches(inside.grammar(), thought + '</think>\n\n{"prime":"yes"}')
    assert not matches(inside.grammar(), '{"prime":true}')  # the reasoning must end first
    assert matches(maybe.grammar(), '<think>\nok\n</think>\n\n{"prime":false}')
    assert matches(maybe.grammar(), '{"prime":false}') and not matches(maybe.grammar(), 'plain text')
    check = ChatTool.model_validate({"type": "function", "function": {"name": "check", "parameters": SCHEMA}})
    tools = tool_plan([check], "required", False, None)
    called = chat_grammar(None, "inside", tools)
    assert called is not None
    assert matches(called.grammar(), 'I will call.</think>\n<tool_call>\n{"name":"check","arguments":{"prime":true}}'
                                     '\n</tool_call>')


# ----- end to end -----


@pytest.fixture(scope="module")
def tiny() -> Iterator[TinyServer]:
    with serve_tiny() as server:
        yield server


def reasoning_of(message: Any) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def test_tiny_model_thinking_on_and_off(tiny: TinyServer) -> None:
    thinking = tiny.client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0,  # type: ignore[arg-type]
                                                   extra_body=THINKING)
    message = thinking.choices[0].message
    assert reasoning_of(message) and message.content == ""  # the block is open and the model never closes it
    plain = tiny.client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    assert reasoning_of(plain.choices[0].message) is None and plain.choices[0].message.content
    stream = tiny.client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0,  # type: ignore[arg-type]
                                                 extra_body=THINKING, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas) == reasoning_of(message)
    assert not any(d.content for d in deltas)


def test_tiny_model_structured_answer_with_thinking_off(tiny: TinyServer) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    off = tiny.client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt, max_tokens=20,  # type: ignore[arg-type]
                                              temperature=0.8, seed=3, n=4,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    for choice in off.choices:
        assert json.loads(choice.message.content or "")["prime"] in (True, False)
    on = tiny.client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt, max_tokens=20,  # type: ignore[arg-type]
                                             temperature=0, extra_body=THINKING)
    assert reasoning_of(on.choices[0].message)  # free reasoning first; the tiny model never reaches `</think>`


def test_qwen3_style_reasoning_answer_and_calls_through_the_api() -> None:
    """Text a Qwen3 model writes (Qwen3's hybrid template: the model opens the block), whole and streamed."""
    tools = [{"type": "function", "function": {"name": "check", "parameters": SCHEMA}}]
    text = ('<think>\nI should check.\n</think>\n\n<tool_call>\n{"name": "check", "arguments": {"prime": true}}\n'
            '</tool_call>')
    with serve_backend(ScriptedText(text, 2)) as served:
        args: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": tools, "extra_body": {"chat_template": QWEN3}}
        whole = served.client.chat.completions.create(**args)
        chunks = [c.choices[0] for c in served.client.chat.completions.create(**args, stream=True) if c.choices]
        served.backend.text = "<think>\nEasy.\n</think>\n\nYes, 17 is prime."
        answer = served.client.chat.completions.create(model=MODEL, messages=ASK, extra_body={"chat_template": QWEN3})
    message = whole.choices[0].message
    assert reasoning_of(message) == "I should check.\n" and message.content is None
    assert whole.choices[0].finish_reason == "tool_calls" and message.tool_calls is not None
    assert json.loads(message.tool_calls[0].function.arguments) == {"prime": True}
    assert "".join((c.delta.model_extra or {}).get("reasoning_content", "") for c in chunks) == "I should check.\n"
    assert not any(c.delta.content for c in chunks) and chunks[-1].finish_reason == "tool_calls"
    assert reasoning_of(answer.choices[0].message) == "Easy.\n"
    assert answer.choices[0].message.content == "Yes, 17 is prime."
