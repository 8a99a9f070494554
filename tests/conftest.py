"""Shared fixtures: random Hugging Face model folders built in the test (no downloads)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer as EngineTokenizer
from minedraft.engine.drafter import Drafter
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2, control_pb2_grpc, generation_pb2, generation_pb2_grpc

ARCH_CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3_rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_theta": 500000.0,
            "max_position_embeddings": 512,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "mistral_window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 6}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
}


def write_word_tokenizer(folder: Path, vocab_size: int, eos_id: int) -> None:
    """A word-level tokenizer "w0 w1 ..." so random models have a real tokenizer.json."""
    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": f"w{eos_id}"}))


def make_hf_model(folder: Path, arch: str = "llama", seed: int = 0, weight_scale: float = 2.5, **overrides: object):
    """Save a randomly initialised transformers model (fp32) with a tokenizer; returns it."""
    import transformers

    config_cls, model_cls, extra = ARCH_CONFIGS[arch]
    kwargs: dict[str, object] = {
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 112,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "eos_token_id": 1,
        "bos_token_id": 0,
        **extra,
        **overrides,
    }
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    # Larger-than-default weights make logits spread out, so comparisons are meaningful.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(weight_scale)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_word_tokenizer(folder, int(kwargs["vocab_size"]), 1)
    return model


def engine_from_folders(target: Path, draft: Path | None, mode: str, k: int = 3, **cfg: object) -> LLMEngine:
    return LLMEngine.from_folders(target, draft, EngineConfig(mode=mode, k=k, **cfg))


def workers_for(target: Path, draft: Path, num_blocks: int = 256, block_size: int = 4):
    t = Verifier(ModelRunner(load_model(target), num_blocks, block_size))
    d = Drafter(ModelRunner(load_model(draft), num_blocks, block_size))
    return t, d, EngineTokenizer(target)


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A random target and a smaller random draft over the same 97-token vocabulary."""
    root = tmp_path_factory.mktemp("pair")
    make_hf_model(root / "target", "llama", seed=1)
    make_hf_model(root / "draft", "llama", seed=2, num_hidden_layers=1, hidden_size=32, intermediate_size=48)
    return root / "target", root / "draft"


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll a condition that another thread makes true; fail with a clear message on timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def worker_info(port: int) -> control_pb2.WorkerInfo:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return control_pb2_grpc.WorkerStub(channel).Info(control_pb2.InfoRequest(), timeout=5)


def start_workers(stack: LocalStack, timeout: float = 120.0) -> LocalStack:
    """The stack's verifier and draft service, once both answer Info (the batch manager is the test's own)."""
    stack.start_verifier()
    stack.start_draft()
    for port in (stack.target_port, stack.draft_port):
        wait_until(lambda port=port: _answers(port), timeout=timeout)
    return stack


def pair_stack(target: Path, draft: Path, log_dir: Path, colocated: bool, launch_ahead: bool = False) -> LocalStack:
    """The verifier over `target` and the draft service over `draft`, or (`colocated`) a verifier that loads
    `draft` and drafts itself, without a draft service; the batch manager is the test's own (`serve_requests`).
    `launch_ahead`: both workers queue their next step before reading the current one back, as on a GPU."""
    ahead = {"MINEDRAFT_LAUNCH_AHEAD": "on"} if launch_ahead else {}
    env = {"verifier": {**ahead, **({"MINEDRAFT_COLOCATED_DRAFT": str(draft)} if colocated else {})},
           "draft": ahead}
    stack = LocalStack(StackConfig(target=str(target), draft=str(draft), grpc_port=free_port(),
                                   http_port=free_port(), num_blocks=512, log_dir=log_dir, process_env=env))
    stack.start_verifier()
    if not colocated:
        stack.start_draft()
    return stack


async def serve_requests(stack: LocalStack, tokenizer_dir: Path, config: ManagerConfig, colocated: bool,
                         requests: list[tuple[list[int], SamplingParams, str | None]],
                         watch: Callable[[Coordinator], None] | None = None) -> tuple[list[list], dict]:
    """Each (prompt, params, share_prompt) through a Coordinator in this process over `pair_stack`'s workers, once
    drafting; their chunks and the final status. `watch` sees the coordinator before it starts."""
    draft = None if colocated else f"127.0.0.1:{stack.draft_port}"
    coordinator = Coordinator.over_grpc(EngineTokenizer(tokenizer_dir), "t", f"127.0.0.1:{stack.target_port}", draft,
                                        config)
    if watch is not None:
        watch(coordinator)
    await coordinator.start(connect_timeout=120)
    while coordinator.status()["draft_state"] != "drafting":  # the data plane forms after start
        await asyncio.sleep(0.05)

    async def one(prompt: list[int], params: SamplingParams, share: str | None) -> list:
        return [chunk async for chunk in coordinator.generate(prompt, params, "r", share_prompt=share)]

    try:
        return await asyncio.gather(*(one(*r) for r in requests)), coordinator.status()
    finally:
        await coordinator.stop()


def _answers(port: int) -> bool:
    try:
        return worker_info(port).num_blocks > 0
    except grpc.RpcError:  # not up yet
        return False


async def grpc_stream(stack: LocalStack, prompt: list[int], max_tokens: int, delay: float) -> list[int]:
    await asyncio.sleep(delay)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.cfg.grpc_port}") as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=prompt),
            sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        )
        tokens: list[int] = []
        async for chunk in stub.GenerateStream(request, timeout=240):
            tokens.extend(chunk.token_ids)
        return tokens


async def http_stream(stack: LocalStack, prompt: list[int], max_tokens: int, delay: float) -> list[int]:
    """Streamed completion; token ids come back as `w<id>` words from the word-level tokenizer."""
    await asyncio.sleep(delay)
    body = {"model": "target", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    text = ""
    async with httpx.AsyncClient(timeout=240) as client, client.stream(
        "POST", f"http://127.0.0.1:{stack.cfg.http_port}/v1/completions", json=body
    ) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    return [int(w[1:]) for w in text.split()]
