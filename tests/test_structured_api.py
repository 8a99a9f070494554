"""Structured outputs through the public APIs, over the real engine (the bundled tiny pair, speculative):
OpenAI's response_format (json_schema, json_object), vLLM's structured_outputs and the older guided_* names
on chat and completions, the openai SDK's `chat.completions.parse` with a pydantic model, and gRPC's
SamplingParameters.structured. Every JSON output parses, validates against its schema and is compact, at
temperature 0 and 0.8 over many seeds; bad fields are 400 / INVALID_ARGUMENT naming them. Last, the three
services as `minedraft serve` starts them (PSD over the real workers)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal

import grpc
import jsonschema
import openai
import pydantic
import pytest

from minedraft.batch_manager.structured_request import StructuredFields
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.proto import generation_pb2 as pb
from minedraft.proto import generation_pb2_grpc as pb_grpc
from tests.structured_support import MODEL, TinyServer, compact, serve_tiny
from tests.test_grpc_api import LoopThread, Server
from tests.test_grpc_api import serve as serve_grpc
from tests.test_structured_outputs import SCHEMA

# The engine tests' schema (required, enum, bounded arrays of patterned strings, a nested object, anyOf with
# null), with a const
PERSON = {**SCHEMA, "properties": {**SCHEMA["properties"], "active": {"const": True}},
          "required": [*SCHEMA["required"], "active"]}
USER = [{"role": "user", "content": "Give me a person record as JSON."}]
SEEDS = 12


@pytest.fixture(scope="module")
def tiny() -> Iterator[TinyServer]:
    with serve_tiny() as server:
        yield server


def valid_json(text: str, schema: dict[str, Any]) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert compact(text), text
    return value


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_chat_json_schema_outputs_all_validate(tiny: TinyServer, temperature: float) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    n = 1 if temperature == 0 else SEEDS
    reply = tiny.client.chat.completions.create(model=MODEL, messages=USER, response_format=fmt,  # type: ignore[arg-type]
                                                max_tokens=220, temperature=temperature, seed=11, n=n)
    assert len(reply.choices) == n
    for choice in reply.choices:
        assert choice.finish_reason == "stop", choice.message.content
        valid_json(choice.message.content or "", PERSON)


@pytest.mark.parametrize("field", ["structured_outputs", "guided_json", "response_format"])
def test_completions_take_every_json_field_name(tiny: TinyServer, field: str) -> None:
    value: Any = {"structured_outputs": {"json": PERSON}, "guided_json": PERSON,
                  "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}[field]
    reply = tiny.http.post("/v1/completions", json={"model": MODEL, "prompt": "record = ", "max_tokens": 220,
                                                     "temperature": 0.8, "seed": 5, "n": 6, field: value})
    assert reply.status_code == 200, reply.text
    for choice in reply.json()["choices"]:
        assert choice["finish_reason"] == "stop"
        valid_json(choice["text"], PERSON)


def test_streamed_json_joins_into_a_valid_document(tiny: TinyServer) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    stream = tiny.client.chat.completions.create(model=MODEL, messages=USER, response_format=fmt,  # type: ignore[arg-type]
                                                 max_tokens=220, temperature=0.8, seed=3, stream=True)
    pieces, finish = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    valid_json("".join(pieces), PERSON)


def test_json_object_gives_an_object(tiny: TinyServer) -> None:
    reply = tiny.client.chat.completions.create(model=MODEL, messages=USER, response_format={"type": "json_object"},
                                                max_tokens=120, temperature=0, seed=1)
    choice = reply.choices[0]
    if choice.finish_reason == "stop":  # an object of free keys may run past max_tokens on a weak model
        assert isinstance(json.loads(choice.message.content or ""), dict)
    else:
        assert (choice.message.content or "").startswith("{")


@pytest.mark.parametrize(("field", "value", "check"), [
    ("structured_outputs", {"regex": "[a-z]{2,6}-[0-9]{3}"}, lambda t: re.fullmatch(r"[a-z]{2,6}-[0-9]{3}", t)),
    ("guided_regex", "(yes|no), [0-9]{1,2}", lambda t: re.fullmatch(r"(yes|no), [0-9]{1,2}", t)),
    ("structured_outputs", {"choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
    ("guided_choice", ["alpha", "beta"], lambda t: t in ("alpha", "beta")),
    ("structured_outputs", {"grammar": 'start: "x=" NUM ";"\nNUM: /[0-9]{1,4}/'},
     lambda t: re.fullmatch(r"x=[0-9]{1,4};", t)),
    ("guided_grammar", 'root ::= "sum(" [0-9] "," [0-9] ")"', lambda t: re.fullmatch(r"sum\([0-9],[0-9]\)", t)),
])
def test_regex_choice_and_grammars_match_in_full(tiny: TinyServer, field: str, value: Any, check: Any) -> None:
    for path, body in (("/v1/completions", {"prompt": "value: "}), ("/v1/chat/completions", {"messages": USER})):
        reply = tiny.http.post(path, json={"model": MODEL, "max_tokens": 40, "temperature": 0.8, "seed": 9, "n": 4,
                                           field: value, **body})
        assert reply.status_code == 200, reply.text
        for choice in reply.json()["choices"]:
            text = choice["text"] if "text" in choice else choice["message"]["content"]
            assert choice["finish_reason"] == "stop" and check(text), text


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    zip: str = pydantic.Field(pattern=r"^[0-9]{5}$")


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(min_length=1, max_length=10)
    role: Literal["admin", "user"]
    tags: list[str] = pydantic.Field(min_length=1, max_length=2)
    address: Address
    manager: str | None = pydantic.Field(max_length=5)
    age: int = pydantic.Field(ge=0, le=99)


@pytest.mark.parametrize("seed", range(4))
def test_sdk_parse_with_a_pydantic_model(tiny: TinyServer, seed: int) -> None:
    """The SDK sends the model's strict schema ($defs for Address, anyOf with null) and parses the reply."""
    completion = tiny.client.chat.completions.parse(model=MODEL, messages=USER, response_format=Person,  # type: ignore[arg-type]
                                                    max_tokens=200, temperature=0.8, seed=seed)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Person) and isinstance(parsed.address, Address)
    assert 1 <= len(parsed.tags) <= 2 and re.fullmatch(r"[0-9]{5}", parsed.address.zip)


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
    ({"structured_outputs": {"jsn": {}}}, "structured_outputs.jsn"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "start: ("}, "guided_grammar"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
])
def test_bad_structured_fields_are_400_naming_them(tiny: TinyServer, body: dict[str, Any], param: str) -> None:
    for path, prompt in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": USER})):
        reply = tiny.http.post(path, json={"model": MODEL, "max_tokens": 4, **prompt, **body})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == param, reply.text


def test_text_format_and_neutral_flags_leave_the_output_free() -> None:
    assert StructuredFields(response_format={"type": "text"}).structured_output() is None  # type: ignore[arg-type]
    flags = StructuredFields.model_validate({"structured_outputs": {"regex": "a+", "disable_fallback": True,
                                                                    "disable_any_whitespace": True},
                                             "guided_decoding_backend": "xgrammar"})
    so = flags.structured_output()
    assert so is not None and (so.kind, so.spec, so.param) == ("regex", "a+", "structured_outputs")


# ----- gRPC -----


@pytest.fixture(scope="module")
def grpc_served(tiny: TinyServer) -> Iterator[Server]:
    loop = LoopThread()
    yield from serve_grpc(loop, tiny.backend)
    loop.stop()


def sampled(**structured: Any) -> pb.SamplingParameters:
    return pb.SamplingParameters(max_tokens=220, temperature=0.8, seed=21,
                                 structured=pb.StructuredOutput(**structured))


def test_grpc_json_schema_regex_and_choice(grpc_served: Server) -> None:
    reply = grpc_served.stub.Generate(pb.GenerateRequest(text="record = ", n=6,
                                                         sampling=sampled(json_schema=json.dumps(PERSON))))
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        valid_json(choice.text, PERSON)
    regex = grpc_served.stub.Generate(pb.GenerateRequest(text="id: ", sampling=sampled(regex="[A-Z]{3}[0-9]{2}")))
    assert re.fullmatch(r"[A-Z]{3}[0-9]{2}", regex.text)
    choice = pb.StructuredOutput.Choices(choices=["up", "down"])
    chunks = list(grpc_served.stub.GenerateStream(pb.GenerateRequest(text="go ", sampling=sampled(choice=choice))))
    assert "".join(c.text for c in chunks) in ("up", "down") and chunks[-1].finish_reason == "stop"


@pytest.mark.parametrize("structured", [{"json_schema": '{"type": "bogus"}'}, {"regex": "(x"}, {"json_object": False},
                                        {"grammar": "start: ("}])
def test_grpc_bad_structured_output_is_invalid_argument(grpc_served: Server, structured: dict[str, Any]) -> None:
    with pytest.raises(grpc.RpcError) as error:
        grpc_served.stub.Generate(pb.GenerateRequest(text="x", sampling=sampled(**structured)))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling.structured" in (error.value.details() or "")


# ----- the three services, as `minedraft serve` runs them -----


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = LocalStack(StackConfig(target=str(TINY_TARGET), draft=str(TINY_DRAFT), grpc_port=free_port(),
                               http_port=free_port(), num_blocks=512, log_dir=tmp_path_factory.mktemp("logs")))
    s.start(timeout=180)
    yield s
    s.stop()


def test_the_served_stack_parses_models_and_forces_calls(stack: LocalStack) -> None:
    """PSD through the verifier and draft processes: the SDK's parse(), a forced call, gRPC's chat prompt."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stack.cfg.http_port}/v1", api_key="x", max_retries=0)
    for seed in range(3):
        parsed = client.chat.completions.parse(model=MODEL, messages=USER, response_format=Person,  # type: ignore[arg-type]
                                               max_tokens=200, temperature=0.8, seed=seed).choices[0].message.parsed
        assert isinstance(parsed, Person)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": PERSON}}]
    reply = client.chat.completions.create(model=MODEL, messages=USER, tools=tools, tool_choice="required",  # type: ignore[arg-type]
                                           parallel_tool_calls=False, max_tokens=240, temperature=0)
    call = (reply.choices[0].message.tool_calls or [])[0]
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "lookup"
    valid_json(call.function.arguments, PERSON)
    with grpc.insecure_channel(f"127.0.0.1:{stack.cfg.grpc_port}") as channel:
        chat = pb.Chat(messages=[json.dumps(m) for m in USER], tools=[json.dumps(t) for t in tools],
                       tool_choice=json.dumps({"type": "function", "function": {"name": "lookup"}}))
        served = pb_grpc.GenerationStub(channel).Generate(pb.GenerateRequest(
            chat=chat, sampling=pb.SamplingParameters(max_tokens=240, temperature=0)), timeout=120)
    assert [(c.name, c.arguments) for c in served.tool_calls] == [("lookup", call.function.arguments)]
