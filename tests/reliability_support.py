"""Helpers shared by the reliability and security tests: keyed stacks, clients, references."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import grpc
import httpx
import psutil

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.sampling_params import SamplingParams
from minedraft.proto import generation_pb2, generation_pb2_grpc
from tests.conftest import engine_from_folders

API_KEYS = ("key-alpha-0123456789", "key-beta-9876543210")
ADMIN_KEY = "admin-key-55555"


def keyed_stack(pair: tuple[Path, Path], log_dir: Path, **cfg: object) -> LocalStack:
    """Three real processes with two API keys (one inline, one from a file) and an admin key."""
    key_file = log_dir / "api-keys"
    key_file.write_text(f"# one key per line\n{API_KEYS[1]}\n")
    env = {"MINEDRAFT_API_KEY": API_KEYS[0], "MINEDRAFT_API_KEY_FILE": str(key_file),
           "MINEDRAFT_ADMIN_API_KEY": ADMIN_KEY}
    options = {"k": 3, "num_blocks": 256, **cfg}
    config = StackConfig(target=str(pair[0]), draft=str(pair[1]), grpc_port=free_port(), http_port=free_port(),
                         log_dir=log_dir, process_env={"batch-manager": env}, **options)  # type: ignore[arg-type]
    stack = LocalStack(config)
    stack.start(timeout=120)
    return stack


def bearer(key: str = API_KEYS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def grpc_metadata(key: str = API_KEYS[0]) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def greedy_request(stub: generation_pb2_grpc.GenerationStub, prompt: list[int], max_tokens: int,
                   key: str = API_KEYS[0]) -> list[int]:
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt),
        sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return list(stub.Generate(request, timeout=60, metadata=grpc_metadata(key)).token_ids)


def http_greedy_text(client: httpx.Client, prompt: str, max_tokens: int = 6) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    reply = client.post("/v1/completions", json=body, headers=bearer())
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["text"])


def reference(pair: tuple[Path, Path], prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """Greedy output of the in-process engine (AR): what every served request must equal."""
    engine = engine_from_folders(pair[0], None, "ar", block_size=16, num_blocks=1024)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens]
    return [r.output_ids for r in engine.generate(prompts, params)]


def listening_addresses(pid: int) -> set[str]:
    """IP addresses the process listens on (TCP)."""
    return {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def grpc_channel(stack: LocalStack) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{stack.cfg.grpc_port}")
