"""Tool calling. The parsers on the text models write (Qwen's `<tool_call>` blocks, Llama 3's JSON), streamed in
any split and whole; the grammars of `required` and named functions on the tiny pair's tokenizer; and through
the official openai SDK over the real engine (bundled tiny pair, whose template renders tools Qwen-style):
`required` and a named function force calls whose arguments validate against the function's schema, streamed
and not, a multi-turn conversation with tool results, `auto` reading what the model wrote, and gRPC's Chat.
The tiny model never chooses to call on its own, so `auto` calls are covered by the parser tests alone."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from minedraft.batch_manager.chat import RenderOptions, render_chat
from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.batch_manager.structured_request import chat_grammar
from minedraft.batch_manager.tool_calls import HERMES, LLAMA3_JSON, ChatTool, ToolFormat, tool_format, tool_plan
from minedraft.batch_manager.tool_parser import ToolCallParser
from minedraft.proto import generation_pb2 as pb
from tests.structured_support import MODEL, ScriptedText, TinyServer, matches, serve_backend, serve_tiny
from tests.test_grpc_api import LoopThread, Server
from tests.test_grpc_api import serve as serve_grpc

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "b": {"type": "integer", "minimum": -99, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def parse(fmt: ToolFormat, text: str, seed: int | None = None, single: bool = False
          ) -> tuple[str, list[dict[str, Any]], ToolCallParser]:
    """Feed `text` whole (seed None) or in random pieces; the content and the calls joined from their deltas."""
    parser, content, calls = ToolCallParser(fmt, single), "", {}
    rng, at = random.Random(seed), 0
    while at < len(text):
        size = len(text) if seed is None else rng.randint(1, 6)
        piece, deltas = parser.feed(text[at:at + size])
        content, at = content + piece, at + size
        for d in deltas:
            call = calls.setdefault(d.index, {"id": d.id, "name": d.name, "arguments": ""})
            assert (d.id is None) == (d.name is None) and (d.id is None or d.index == len(calls) - 1)
            call["arguments"] += d.arguments
    rest, deltas = parser.finish()
    for d in deltas:
        calls[d.index]["arguments"] += d.arguments
    return content + rest, [calls[i] for i in sorted(calls)], parser


QWEN_OUTPUT = ('I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
               '"c"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "}{<"}]}}\n'
               '</tool_call>')


@pytest.mark.parametrize("seed", [None, 0, 1, 2, 3])
def test_qwen_blocks_parse_the_same_in_any_split(seed: int | None) -> None:
    content, calls, parser = parse(HERMES, QWEN_OUTPUT, seed)
    assert content == "I will look it up.\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"}), ("add", {"a": 1, "b": [2, {"c": "}{<"}]})]
    assert calls[0]["arguments"] == '{"city": "Paris", "unit": "c"}'  # the model's own text, not re-encoded
    assert parser.whole_calls() == [0, 1] and all(c["id"].startswith("call_") for c in calls)


def test_llama3_json_calls_and_plain_text() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "f"}}; {"name": "add", "parameters": {}}'
    for seed in (None, 4, 5):
        content, calls, parser = parse(LLAMA3_JSON, text, seed)
        assert content == "" and [c["name"] for c in calls] == ["get_weather", "add"]
        assert json.loads(calls[0]["arguments"]) == {"city": "Oslo", "unit": "f"} and parser.whole_calls() == [0, 1]
    content, calls, _ = parse(LLAMA3_JSON, 'It is {"name": "x"} sunny.', 6)
    assert content == 'It is {"name": "x"} sunny.' and calls == []


def test_arguments_as_a_json_string_and_name_after_arguments() -> None:
    _, calls, _ = parse(HERMES, '<tool_call>\n{"arguments": "{\\"a\\": 1}", "name": "add"}\n</tool_call>', 7)
    assert calls == [{"id": calls[0]["id"], "name": "add", "arguments": '{"a": 1}'}]


def test_malformed_truncated_and_single_calls() -> None:
    content, _, parser = parse(HERMES, "a < b, and <tool_call> is just text here")
    assert parser.whole_calls() is None and content == "a < b, and "
    _, calls, parser = parse(HERMES, '<tool_call>\n{"name": "add", "arguments": {"a": 1}\n</tool_call>', 8)
    assert parser.whole_calls() is None  # the object never closed: the whole reply gives the text back
    cut = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>\n{"name": "add", "argu'
    _, calls, parser = parse(HERMES, cut, 9)
    assert parser.whole_calls() == [0] and len(calls) == 2  # the call cut off by max_tokens is dropped
    _, calls, parser = parse(HERMES, QWEN_OUTPUT, 10, single=True)
    assert [c["name"] for c in calls] == ["get_weather"] and parser.whole_calls() == [0]


def test_the_format_follows_the_template() -> None:
    assert tool_format("{{ '<tool_call>' }}") is HERMES and tool_format(None) is HERMES
    llama = "{%- if message.role == 'ipython' %}<|start_header_id|>ipython{% endif %}<|python_tag|>"
    assert tool_format(llama) is LLAMA3_JSON


def tools() -> list[ChatTool]:
    return [ChatTool.model_validate(t) for t in TOOLS]


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON])
def test_forced_call_grammars_accept_calls_and_reject_bad_arguments(fmt: ToolFormat) -> None:
    template = "{{ '<tool_call>' }}" if fmt is HERMES else "<|python_tag|>"
    key = fmt.arguments_key

    def call(name: str, args: str) -> str:
        return f'{fmt.open}{{"name":"{name}","{key}":{args}}}{fmt.close}'

    required = chat_grammar(None, None, tool_plan(tools(), "required", None, template))
    single = chat_grammar(None, None, tool_plan(tools(), "required", False, template))
    named = chat_grammar(None, None, tool_plan(tools(), {"type": "function", "function": {"name": "add"}}, None,
                                               template))
    assert required is not None and single is not None and named is not None
    good, other = call("get_weather", '{"city":"Rome","unit":"c"}'), call("add", '{"a":1,"b":-2}')
    assert matches(required.grammar(), good) and matches(required.grammar(), good + fmt.separator + other)
    assert matches(single.grammar(), good) and not matches(single.grammar(), good + fmt.separator + other)
    assert matches(named.grammar(), other) and not matches(named.grammar(), good)
    for bad in (call("get_weather", '{"city":"Rome","unit":"k"}'), call("add", '{"a":1}'), call("sub", "{}"),
                call("get_weather", '{"city": "Rome", "unit": "c"}'), "plain text"):
        assert not matches(required.grammar(), bad), bad


@pytest.mark.parametrize(("body", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [TOOLS[1], TOOLS[1]]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}],
      "tool_choice": "required"}, "tools"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_bad_tool_fields_are_400_naming_them(tiny: TinyServer, body: dict[str, Any], param: str) -> None:
    reply = tiny.http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 4, **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.text


# ----- end to end -----


@pytest.fixture(scope="module")
def tiny() -> Iterator[TinyServer]:
    with serve_tiny() as server:
        yield server


def check_calls(calls: Any, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_required_forces_one_valid_call(tiny: TinyServer, temperature: float) -> None:
    reply = tiny.client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                                parallel_tool_calls=False, max_tokens=80, temperature=temperature,
                                                seed=1, n=1 if temperature == 0 else 6)
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
        check_calls(choice.message.tool_calls, set(SCHEMAS))


def test_required_with_parallel_calls_returns_every_finished_call(tiny: TinyServer) -> None:
    reply = tiny.client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                                max_tokens=120, temperature=0.8, seed=4, n=4)
    for choice in reply.choices:
        check_calls(choice.message.tool_calls, set(SCHEMAS))


def test_named_function_streamed_and_not(tiny: TinyServer) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    args: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": named,
                            "max_tokens": 60, "temperature": 0}
    whole = tiny.client.chat.completions.create(**args)
    choice = whole.choices[0]
    assert choice.finish_reason in ("stop", "tool_calls")
    check_calls(choice.message.tool_calls, {"add"})
    with tiny.client.chat.completions.stream(**args) as stream:  # the SDK's own accumulation of the deltas
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    assert streamed is not None and [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]


def test_streamed_deltas_are_header_then_argument_pieces(tiny: TinyServer) -> None:
    stream = tiny.client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                                 parallel_tool_calls=False, max_tokens=80, temperature=0.8, seed=2,
                                                 stream=True)
    deltas, finish = [], None
    for chunk in stream:
        if chunk.choices:
            deltas += chunk.choices[0].delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    header, *pieces = deltas
    assert header.index == 0 and header.id and header.type == "function" and header.function
    assert header.function.name in SCHEMAS and header.function.arguments == ""
    assert pieces and all(p.index == 0 and p.id is None and p.function and p.function.name is None for p in pieces)
    arguments = "".join(p.function.arguments or "" for p in pieces if p.function)
    jsonschema.validate(json.loads(arguments), SCHEMAS[header.function.name])
    assert finish == "tool_calls"


def test_auto_reads_what_the_model_wrote(tiny: TinyServer) -> None:
    reply = tiny.client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=24,  # type: ignore[arg-type]
                                                temperature=0)
    choice = reply.choices[0]
    if choice.message.tool_calls:  # the tiny model may, in principle, write a block itself
        check_calls(choice.message.tool_calls, set(SCHEMAS))
    else:
        assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)


def test_a_multi_turn_tool_conversation(tiny: TinyServer) -> None:
    first = tiny.client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                                parallel_tool_calls=False, max_tokens=80, temperature=0)
    call = (first.choices[0].message.tool_calls or [])[0]
    turns: list[Any] = [*ASK, first.choices[0].message,  # the SDK's own message object, sent back as it is
                        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    sent = [m if isinstance(m, dict) else m.model_dump() for m in turns]
    rendered = render_chat(tiny.backend.tokenizer, [ChatMessage.model_validate(m) for m in sent],
                           RenderOptions(tools=TOOLS))
    arguments = json.dumps(json.loads(call.function.arguments), ensure_ascii=False)
    assert f'{{"name": "{call.function.name}", "arguments": {arguments}}}' in rendered  # an object, not a string
    assert '<tool_response>\n{"temperature": 21}\n</tool_response>' in rendered and '"name": "add"' in rendered
    second = tiny.client.chat.completions.create(model=MODEL, messages=turns, tools=TOOLS, max_tokens=16,
                                                 temperature=0)
    assert second.choices[0].message.role == "assistant" and second.usage is not None
    assert second.usage.prompt_tokens > (first.usage.prompt_tokens if first.usage else 0)


@pytest.mark.parametrize("piece", [1, 4, 1000])
def test_auto_calls_a_model_writes_reach_the_sdk(piece: int) -> None:
    """What a Qwen model writes under `auto`, through the real HTTP layers (the tiny model never writes it)."""
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
    with serve_backend(ScriptedText(text, piece)) as served:
        args: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 99}
        whole = served.client.chat.completions.create(**args)
        with served.client.chat.completions.stream(**args) as stream:
            final = stream.get_final_completion()
        one = served.client.chat.completions.create(**args, parallel_tool_calls=False)
        plain = ScriptedText("It is sunny in Paris.", piece)
        served.backend.text = plain.text
        words = served.client.chat.completions.create(**args)
    assert served.backend.params[0].structured is None  # auto: the model writes freely
    for reply in (whole, final):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []] == [
            ("get_weather", {"city": "Paris", "unit": "c"}), ("add", {"a": 2, "b": 3})]
    assert [c.function.name for c in one.choices[0].message.tool_calls or []] == ["get_weather"]
    assert words.choices[0].message.content == "It is sunny in Paris." and words.choices[0].finish_reason == "stop"
    assert words.choices[0].message.tool_calls is None


@pytest.fixture(scope="module")
def grpc_served(tiny: TinyServer) -> Iterator[Server]:
    loop = LoopThread()
    yield from serve_grpc(loop, tiny.backend)
    loop.stop()


def test_grpc_chat_with_forced_tools(grpc_served: Server) -> None:
    chat = pb.Chat(messages=[json.dumps(m) for m in ASK], tools=[json.dumps(t) for t in TOOLS],
                   tool_choice="required", parallel_tool_calls=False)
    request = pb.GenerateRequest(chat=chat, sampling=pb.SamplingParameters(max_tokens=80, temperature=0))
    reply = grpc_served.stub.Generate(request)
    assert reply.finish_reason == "tool_calls" and reply.text == "" and len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    chunks = list(grpc_served.stub.GenerateStream(request))
    pieces = [c for chunk in chunks for c in chunk.tool_calls]
    assert pieces[0].name == call.name and pieces[0].id and pieces[0].arguments == ""
    assert "".join(p.arguments for p in pieces) == call.arguments and chunks[-1].finish_reason == "tool_calls"


def test_grpc_chat_bad_messages_are_invalid_argument(grpc_served: Server) -> None:
    import grpc

    for chat, where in ((pb.Chat(messages=['{"role": "robot"}']), "chat.messages[0]"),
                        (pb.Chat(messages=[json.dumps(ASK[0])], tools=["{}"]), "chat.tools[0]"),
                        (pb.Chat(messages=[json.dumps(ASK[0])], tool_choice="required"), "tool_choice")):
        with pytest.raises(grpc.RpcError) as error:
            grpc_served.stub.Generate(pb.GenerateRequest(chat=chat))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and where in (error.value.details() or "")
