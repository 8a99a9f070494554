"""A hostile but fair client against the three real processes: every bad input is a clear 4xx
(or INVALID_ARGUMENT) naming what to change, and the server keeps answering the same greedy
text afterwards. Also: the event loop keeps answering /health while huge bodies are refused
or a long text is tokenized."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from minedraft.cli.local_stack import LocalStack
from minedraft.proto import generation_pb2, generation_pb2_grpc
from tests.reliability_support import bearer, grpc_channel, grpc_metadata, http_greedy_text, keyed_stack

MB = 1024 * 1024
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "w5 w6"}]


@pytest.fixture(scope="module")
def stack(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = keyed_stack(random_pair, tmp_path_factory.mktemp("bad-inputs"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(stack: LocalStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.cfg.http_port}", timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def greedy_before(client: httpx.Client) -> str:
    return http_greedy_text(client, "w7 w8 w9")


def raw(text: str) -> bytes:
    return text.encode()


# (id, path, body: dict (sent as JSON) or bytes (sent as is), content type, status, param or None)
HTTP_CASES: list[tuple[str, str, Any, str, int, str | None]] = [
    ("temperature-string-nan", "/v1/completions", {"prompt": "w1", "temperature": "NaN"}, "json", 400, "temperature"),
    ("temperature-bare-nan", "/v1/completions", raw('{"prompt": "w1", "temperature": NaN}'), "json", 400,
     "temperature"),
    ("temperature-bare-inf", "/v1/completions", raw('{"prompt": "w1", "temperature": Infinity}'), "json", 400,
     "temperature"),
    ("temperature-bare-neg-inf", "/v1/completions", raw('{"prompt": "w1", "temperature": -Infinity}'), "json", 400,
     "temperature"),
    ("temperature-string-inf", "/v1/completions", {"prompt": "w1", "temperature": "inf"}, "json", 400, "temperature"),
    ("top-p-bare-nan", "/v1/completions", raw('{"prompt": "w1", "top_p": NaN}'), "json", 400, "top_p"),
    ("top-p-string-infinity", "/v1/completions", {"prompt": "w1", "top_p": "Infinity"}, "json", 400, "top_p"),
    ("presence-penalty-nan", "/v1/completions", raw('{"prompt": "w1", "presence_penalty": NaN}'), "json", 400,
     "presence_penalty"),
    ("frequency-penalty-inf", "/v1/completions", raw('{"prompt": "w1", "frequency_penalty": Infinity}'), "json",
     400, "frequency_penalty"),
    ("logit-bias-nan", "/v1/completions", raw('{"prompt": "w1", "logit_bias": {"5": NaN}}'), "json", 400,
     "logit_bias"),
    ("timeout-nan", "/v1/completions", raw('{"prompt": "w1", "timeout": NaN}'), "json", 400, "timeout"),
    ("timeout-negative", "/v1/completions", {"prompt": "w1", "timeout": -1}, "json", 400, "timeout"),
    ("chat-temperature-nan", CHAT, raw('{"messages": [{"role": "user", "content": "w5"}], "temperature": NaN}'),
     "json", 400, "temperature"),
    ("chat-top-p-inf", CHAT, {"messages": USER, "top_p": "Infinity"}, "json", 400, "top_p"),
    ("max-tokens-word", "/v1/completions", {"prompt": "w1", "max_tokens": "many"}, "json", 400, "max_tokens"),
    ("max-tokens-fraction", "/v1/completions", {"prompt": "w1", "max_tokens": 1.5}, "json", 400, "max_tokens"),
    ("max-tokens-negative", "/v1/completions", {"prompt": "w1", "max_tokens": -3}, "json", 400, "max_tokens"),
    ("max-tokens-over-context", "/v1/completions", {"prompt": [5] * 5, "max_tokens": 10**6}, "json", 400,
     "max_tokens"),
    ("prompt-over-context", "/v1/completions", {"prompt": [5] * 300, "max_tokens": 4}, "json", 400, "prompt"),
    ("prompt-number", "/v1/completions", {"prompt": 123}, "json", 400, "prompt"),
    ("prompt-object", "/v1/completions", {"prompt": {"a": 1}}, "json", 400, "prompt"),
    ("prompt-empty-batch", "/v1/completions", {"prompt": []}, "json", 400, "prompt"),
    ("prompt-mixed-list", "/v1/completions", {"prompt": [1, "a"]}, "json", 400, "prompt"),
    ("prompt-negative-id", "/v1/completions", {"prompt": [-1]}, "json", 400, "prompt"),
    ("prompt-id-outside-vocab", "/v1/completions", {"prompt": [10**9]}, "json", 400, "prompt"),
    ("prompt-empty", "/v1/completions", {"prompt": ""}, "json", 400, "prompt"),
    ("unknown-field", "/v1/completions", {"prompt": "w1", "max_token": 3}, "json", 400, "max_token"),
    ("stream-word", "/v1/completions", {"prompt": "w1", "stream": "yes"}, "json", 400, "stream"),
    ("stream-options-without-stream", "/v1/completions",
     {"prompt": "w1", "stream": False, "stream_options": {"include_usage": True}}, "json", 400, "stream_options"),
    ("n-zero", "/v1/completions", {"prompt": "w1", "n": 0}, "json", 400, "n"),
    ("seed-negative", "/v1/completions", {"prompt": "w1", "seed": -1}, "json", 400, "seed"),
    ("seed-word", "/v1/completions", {"prompt": "w1", "seed": "abc"}, "json", 400, "seed"),
    ("stop-empty-string", "/v1/completions", {"prompt": "w1", "stop": [""]}, "json", 400, "stop"),
    ("stop-token-id-negative", "/v1/completions", {"prompt": "w1", "stop_token_ids": [-5]}, "json", 400,
     "stop_token_ids"),
    ("top-k-negative", "/v1/completions", {"prompt": "w1", "top_k": -2}, "json", 400, "top_k"),
    ("empty-body", "/v1/completions", b"", "json", 400, "prompt"),
    ("chat-empty-body", CHAT, b"", "json", 400, "messages"),
    ("text-plain-body", "/v1/completions", b"hello", "text/plain", 400, None),
    ("truncated-json", "/v1/completions", b'{"prompt": "w1"', "json", 400, None),
    ("invalid-utf8", "/v1/completions", b'{"prompt": "\xff\xfe w1"}', "json", 400, None),
    ("json-list-body", "/v1/completions", b"[1, 2]", "json", 400, None),
    ("deeply-nested-json", "/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "json",
     400, None),
    ("chat-no-messages", CHAT, {"messages": []}, "json", 400, "messages"),
    ("chat-bad-role", CHAT, {"messages": [{"role": "robot", "content": "w5"}]}, "json", 400, "messages[0].role"),
    ("chat-content-number", CHAT, {"messages": [{"role": "user", "content": 5}]}, "json", 400,
     "messages[0].content"),
    ("chat-missing-messages", CHAT, {"model": "target"}, "json", 400, "messages"),
    ("body-over-limit", "/v1/completions", {"prompt": "w1 " * (5 * MB // 3)}, "json", 413, None),
    ("unknown-model", "/v1/completions", {"model": "gpt-9", "prompt": "w1"}, "json", 404, "model"),
]


def send(client: httpx.Client, path: str, body: Any, content_type: str, stream: bool = False) -> httpx.Response:
    headers = {**bearer(), "Content-Type": "application/json" if content_type == "json" else content_type}
    if isinstance(body, dict):
        body = json.dumps({**body, "stream": stream} if stream and "stream" not in body else body).encode()
    return client.post(path, content=body, headers=headers)


@pytest.mark.parametrize(("path", "body", "content_type", "status", "param"),
                         [case[1:] for case in HTTP_CASES], ids=[case[0] for case in HTTP_CASES])
def test_bad_http_input_is_a_clear_4xx_and_the_server_keeps_its_answers(
        client: httpx.Client, greedy_before: str, path: str, body: Any, content_type: str, status: int,
        param: str | None) -> None:
    for stream in (False, True) if isinstance(body, dict) and status == 400 else (False,):
        reply = send(client, path, body, content_type, stream)
        assert reply.status_code == status, reply.text[:500]
        error = reply.json()["error"]
        assert error["message"] and error["param"] == param, error
        if param is not None:
            assert param.split("[")[0].split(".")[0] in error["message"], error
    assert http_greedy_text(client, "w7 w8 w9") == greedy_before


def test_messages_for_bodies_that_are_not_json_objects_say_what_to_send(client: httpx.Client) -> None:
    empty = send(client, "/v1/completions", b"", "json").json()["error"]["message"]
    assert "empty" in empty and "`prompt`" in empty
    plain = send(client, "/v1/completions", b"hello", "text/plain").json()["error"]["message"]
    assert "JSON object" in plain and "application/json" in plain and "dictionary" not in plain


GRPC_SAMPLING_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("temperature-nan", {"temperature": float("nan")}, "temperature"),
    ("temperature-inf", {"temperature": float("inf")}, "temperature"),
    ("temperature-neg-inf", {"temperature": float("-inf")}, "temperature"),
    ("top-p-nan", {"top_p": float("nan")}, "top_p"),
    ("top-p-inf", {"top_p": float("inf")}, "top_p"),
    ("max-tokens-zero", {"max_tokens": 0}, "max_tokens"),
    ("max-tokens-over-context", {"max_tokens": 10**6}, "max_tokens"),
    ("top-k-negative", {"top_k": -2}, "top_k"),
    ("stop-empty", {"stop": [""]}, "stop"),
    ("stop-token-outside-vocab", {"stop_token_ids": [10**6]}, "stop_token_ids"),
]


@pytest.mark.parametrize(("sampling", "needle"), [c[1:] for c in GRPC_SAMPLING_CASES],
                         ids=[c[0] for c in GRPC_SAMPLING_CASES])
def test_bad_grpc_sampling_is_invalid_argument(stack: LocalStack, sampling: dict[str, Any], needle: str) -> None:
    with grpc_channel(stack) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[5, 6]),
                                                 sampling=generation_pb2.SamplingParameters(**sampling))
        for call in (stub.Generate, lambda r, **kw: list(stub.GenerateStream(r, **kw))):
            with pytest.raises(grpc.RpcError) as err:
                call(request, timeout=30, metadata=grpc_metadata())
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in err.value.details()


@pytest.mark.parametrize(("prompt", "code"), [
    ({"text": ""}, grpc.StatusCode.INVALID_ARGUMENT),
    ({"token_ids": generation_pb2.TokenIds(ids=[])}, grpc.StatusCode.INVALID_ARGUMENT),
    ({"token_ids": generation_pb2.TokenIds(ids=[10**6])}, grpc.StatusCode.INVALID_ARGUMENT),
    ({"text": "w1 " * (5 * MB // 3)}, grpc.StatusCode.RESOURCE_EXHAUSTED),  # over the message size limit
], ids=["empty-text", "empty-ids", "id-outside-vocab", "message-over-limit"])
def test_bad_grpc_prompts_are_refused(stack: LocalStack, prompt: dict[str, Any], code: grpc.StatusCode) -> None:
    with grpc_channel(stack) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(generation_pb2.GenerateRequest(**prompt), timeout=30, metadata=grpc_metadata())
        assert err.value.code() == code, err.value.details()


def test_invalid_utf8_over_grpc_is_invalid_argument(stack: LocalStack) -> None:
    """Raw bytes no protobuf client would send: field 2 (text) holding invalid UTF-8."""
    payload = b"\x12\x04\xff\xfe\x77\x31"
    with grpc_channel(stack) as channel:
        call = channel.unary_unary("/minedraft.v1.Generation/Generate", request_serializer=lambda b: b,
                                   response_deserializer=generation_pb2.GenerateResponse.FromString)
        with pytest.raises(grpc.RpcError) as err:
            call(payload, timeout=30, metadata=grpc_metadata())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()


class HealthProbe:
    """GET /health every 50 ms in a thread; records the slowest answer."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/health"
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as c:
            while not self._stop.is_set():
                start = time.perf_counter()
                assert c.get(self.url).status_code == 200
                self.latencies.append(time.perf_counter() - start)
                time.sleep(0.05)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


def post_big(port: int, body: bytes | Iterator[bytes]) -> int | str:
    """The status, or the transport error a client sees when the server stops reading."""
    try:
        with httpx.Client(timeout=60) as c:
            return c.post(f"http://127.0.0.1:{port}/v1/completions", content=body,
                          headers={**bearer(), "Content-Type": "application/json"}).status_code
    except httpx.TransportError as exc:
        return type(exc).__name__


def test_health_answers_within_half_a_second_while_huge_bodies_are_refused(stack: LocalStack,
                                                                          client: httpx.Client) -> None:
    port = stack.cfg.http_port
    body = json.dumps({"prompt": "w5 " * (20 * MB // 3), "max_tokens": 4}).encode()
    assert len(body) > 20 * MB

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives, cut at the limit
        for start in range(0, len(body), 256 * 1024):
            yield body[start:start + 256 * 1024]

    with HealthProbe(port) as probe:
        time.sleep(0.2)
        start = time.perf_counter()
        declared = post_big(port, body)
        streamed = post_big(port, chunked())
        took = time.perf_counter() - start
        time.sleep(0.2)
    assert declared in (413, "WriteError", "RemoteProtocolError", "ReadError")
    assert streamed == 413
    assert probe.latencies and max(probe.latencies) < 0.5, max(probe.latencies)
    print(f"20 MB bodies refused in {took:.2f} s; /health max latency {max(probe.latencies) * 1000:.0f} ms")


def test_long_prompts_under_the_limit_are_tokenized_off_the_event_loop(stack: LocalStack) -> None:
    """3.9 MB of text: one that is clearly over the context is refused after its first 64 K characters,
    one that fits (whitespace around one word) is tokenized whole and served; /health keeps answering
    throughout: the tokenizer runs in a thread, without the GIL."""
    port = stack.cfg.http_port
    too_long = json.dumps({"prompt": "w5 " * (39 * MB // 30), "max_tokens": 4}).encode()
    fits = json.dumps({"prompt": " " * (39 * MB // 10) + "w5", "max_tokens": 4, "ignore_eos": True}).encode()
    assert 3.5 * MB < len(too_long) < 4 * MB and 3.5 * MB < len(fits) < 4 * MB
    replies, took = [], []
    with HealthProbe(port) as probe, httpx.Client(timeout=120) as c:
        time.sleep(0.2)
        for body in (too_long, fits):
            start = time.perf_counter()
            replies.append(c.post(f"http://127.0.0.1:{port}/v1/completions", content=body,
                                  headers={**bearer(), "Content-Type": "application/json"}))
            took.append(time.perf_counter() - start)
        time.sleep(0.2)
    assert replies[0].status_code == 400 and replies[0].json()["error"]["param"] == "prompt"
    assert "longer than the model's context" in replies[0].json()["error"]["message"]
    assert replies[1].status_code == 200, replies[1].text
    assert replies[1].json()["usage"] == {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
    assert max(probe.latencies) < 0.5, max(probe.latencies)
    print(f"3.9 MB prompts: over the context refused in {took[0]:.2f} s, one that fits served in {took[1]:.2f} s; "
          f"/health max latency {max(probe.latencies) * 1000:.0f} ms")
