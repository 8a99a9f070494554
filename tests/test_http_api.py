"""OpenAI-compatible HTTP API end to end: uvicorn over EngineBackend (AR mode) on the random pair."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from minedraft.batch_manager.chat import chat_prompt_ids, render_chat
from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.llm_engine import LLMEngine
from tests.conftest import engine_from_folders, wait_until
from tests.engine_backend import all_kv_free
from tests.http_surface_support import Served, serve

MODEL = "random"
PROMPTS: list[str | list[int]] = ["w5 w9 w13", [7, 7, 7, 7, 7, 7], "w2 w3 w4 w5 w6 w7 w8 w9 w10"]
MAX_TOKENS = 20
GREEDY = {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS}


@pytest.fixture(scope="module")
def served(random_pair: tuple[Path, Path]) -> Iterator[Served]:
    with serve(random_pair[0], max_num_seqs=2, num_blocks=256, max_queue=1, timeout_s=30) as running:
        yield running


@pytest.fixture(scope="module")
def reference_engine(random_pair: tuple[Path, Path]) -> LLMEngine:
    return engine_from_folders(random_pair[0], None, "ar", block_size=4, num_blocks=256)


def greedy_text(engine: LLMEngine, prompt: str | list[int], max_tokens: int = MAX_TOKENS) -> tuple[str, int]:
    (req,) = engine.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return req.text, len(req.output_ids)


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    """Parsed `data:` events of a stream, checking it ends with [DONE]."""
    lines = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_completions_greedy_equal_engine_generate(served: Served, reference_engine: LLMEngine) -> None:
    for prompt in PROMPTS:
        body = served.client.post("/v1/completions", json={**GREEDY, "prompt": prompt}).json()
        text, n_tokens = greedy_text(reference_engine, prompt)
        assert body["choices"][0]["text"] == text
        assert body["usage"]["completion_tokens"] == n_tokens
        assert body["object"] == "text_completion" and body["model"] == MODEL


def test_completion_stream_concatenates_to_unary(served: Served) -> None:
    payload = {**GREEDY, "prompt": "w5 w9 w13"}
    unary = served.client.post("/v1/completions", json=payload).json()
    stream = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    with served.client.stream("POST", "/v1/completions", json=stream) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    *chunks, usage = events
    assert "".join(c["choices"][0]["text"] for c in chunks) == unary["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == unary["choices"][0]["finish_reason"]
    assert usage["choices"] == [] and usage["usage"] == unary["usage"]


def test_chat_without_template_uses_plain_transcript(served: Served, reference_engine: LLMEngine) -> None:
    messages = [{"role": "system", "content": "w3"}, {"role": "user", "content": [{"type": "text", "text": "w5 w9"}]}]
    body = served.client.post("/v1/chat/completions", json={**GREEDY, "messages": messages}).json()
    rendered = render_chat(served.backend.tokenizer, [ChatMessage.model_validate(m) for m in messages])
    assert rendered == "system: w3\nuser: w5 w9\nassistant:"
    text, _ = greedy_text(reference_engine, rendered)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text}


def test_chat_template_renders_like_hugging_face(random_pair: tuple[Path, Path], tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(random_pair[0] / "tokenizer.json", folder)
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
        "{% endif %}{{ m['role'] }} {{ m['content'] }} {{ eos_token }} {% endfor %}"
        "{% if add_generation_prompt %}w60{% endif %}"
    )
    config = {"bos_token": "w0", "eos_token": {"content": "w1"}, "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer(folder)
    messages = [ChatMessage(role="user", content="w5 w9")]
    assert render_chat(tok, messages) == "w0user w5 w9 w1 w60"
    assert chat_prompt_ids(tok, messages) == tok.encode("w0user w5 w9 w1 w60", add_special_tokens=False)
    with pytest.raises(ValueError, match="no system"):
        render_chat(tok, [ChatMessage(role="system", content="w5")])


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("/v1/completions", {"prompt": "w5", "temperature": -1}, "temperature"),
        ("/v1/completions", {"prompt": "w5", "top_p": 0}, "top_p"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": [5] * 40, "max_tokens": 250}, "max_tokens"),  # the one to lower
        ("/v1/completions", {"prompt": "w5", "max_tokenz": 3}, "max_tokenz"),
        ("/v1/completions", {"prompt": "w5", "n": 0}, "n"),
        ("/v1/completions", {"prompt": []}, "prompt"),
        ("/v1/completions", {"prompt": "w5", "temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "w5"}]}, "messages[0].role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "top_k": -2}, "top_k"),
    ],
    ids=lambda v: v if isinstance(v, str) and not v.startswith("/") else None,
)
def test_bad_requests_are_400_and_server_keeps_serving(
    served: Served, path: str, payload: dict[str, Any], param: str
) -> None:
    for stream in (False, True):
        response = served.client.post(path, json={**payload, "stream": stream})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
        assert param.split("[")[0] in error["message"]
    ok = served.client.post("/v1/completions", json={"prompt": "w5", "max_tokens": 2, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_unknown_model_is_404(served: Served) -> None:
    response = served.client.post("/v1/completions", json={"model": "gpt-9", "prompt": "w5"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_full_queue_is_429(served: Served) -> None:
    """max_num_seqs=2 + max_queue=1: with the engine paused, the fourth request is refused."""
    backend = served.backend
    payload = {"prompt": "w5 w9", "max_tokens": 3}
    backend.pause()
    with ThreadPoolExecutor(3) as pool:
        try:
            pending = [pool.submit(served.client.post, "/v1/completions", json=payload) for _ in range(3)]
            wait_until(lambda: backend.status()["waiting"] == 3)
            refused = served.client.post("/v1/completions", json=payload)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        finally:
            backend.resume()
        assert [f.result(30).status_code for f in pending] == [200, 200, 200]


def test_disconnect_mid_stream_aborts_and_frees_kv(served: Served) -> None:
    backend = served.backend
    aborted = backend.status()["aborted"]
    payload = {"prompt": "w5 w9", "max_tokens": 250, "ignore_eos": True, "stream": True}
    with served.client.stream("POST", "/v1/completions", json=payload) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(first[len("data: ") :])["choices"][0]["text"]
        backend.pause()  # from here only the abort can free the request's blocks
    try:
        wait_until(lambda: backend.status()["aborted"] == aborted + 1 and all_kv_free(backend.status()))
        assert backend.status()["waiting"] == 0
    finally:
        backend.resume()


def test_disconnect_while_queued_aborts(served: Served) -> None:
    """A non-streaming client that leaves before its first token also cancels its request."""
    backend = served.backend
    aborted = backend.status()["aborted"]
    backend.pause()
    try:
        host, port = served.url.removeprefix("http://").split(":")
        body = json.dumps({"prompt": "w5 w9", "max_tokens": 5}).encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            wait_until(lambda: backend.status()["waiting"] == 1)
        wait_until(lambda: backend.status()["aborted"] == aborted + 1 and backend.status()["waiting"] == 0)
    finally:
        backend.resume()


def test_health_and_models(served: Served) -> None:
    health = served.client.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["mode"] == "ar"
    assert "kv_free_blocks" in health.json() and "running" in health.json()
    models = served.client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_official_openai_client(served: Served) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
    greedy = {"model": MODEL, "temperature": 0, "max_tokens": 12}
    completion = client.completions.create(prompt="w5 w9 w13", **greedy)
    streamed = client.completions.create(prompt="w5 w9 w13", stream=True, **greedy)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == completion.choices[0].text
    assert completion.usage is not None and completion.usage.completion_tokens == 12

    messages: Any = [{"role": "user", "content": "w5 w9"}]
    chat = client.chat.completions.create(messages=messages, **greedy)
    chunks = list(
        client.chat.completions.create(messages=messages, stream=True, stream_options={"include_usage": True}, **greedy)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    extra = client.completions.create(prompt="w5", extra_body={"top_k": 1, "seed": 7, "stop_token_ids": [3]}, **greedy)
    assert extra.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="w5", temperature=-1)
