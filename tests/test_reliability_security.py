"""Security of the three real processes: API keys on every public method (HTTP and gRPC), open
health and metrics, the admin API only on its own loopback listener with its own key, internal
listeners (control ports, data-plane store) on loopback only, and TLS on the public listeners."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.proto import generation_pb2, generation_pb2_grpc
from tests.conftest import wait_until, worker_info
from tests.reliability_support import (
    ADMIN_KEY,
    API_KEYS,
    bearer,
    grpc_metadata,
    is_loopback,
    listening_addresses,
)

OPENSSL = shutil.which("openssl")


@dataclass
class Secured:
    stack: LocalStack
    cert: Path | None  # None: no openssl here, so no TLS

    @property
    def url(self) -> str:
        return f"{'https' if self.cert else 'http'}://127.0.0.1:{self.stack.cfg.http_port}"

    def client(self) -> httpx.Client:
        verify = ssl.create_default_context(cafile=str(self.cert)) if self.cert else True
        return httpx.Client(base_url=self.url, timeout=30, verify=verify)

    def channel(self) -> grpc.Channel:
        target = f"127.0.0.1:{self.stack.cfg.grpc_port}"
        if self.cert is None:
            return grpc.insecure_channel(target)
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(self.cert.read_bytes()))


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run([OPENSSL or "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def secured(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("secured")
    (folder / "api-keys").write_text(f"# one key per line\n{API_KEYS[1]}\n")
    env = {"MINEDRAFT_API_KEY": API_KEYS[0], "MINEDRAFT_API_KEY_FILE": str(folder / "api-keys"),
           "MINEDRAFT_ADMIN_API_KEY": ADMIN_KEY}
    cert = None
    if OPENSSL:
        cert, key = self_signed(folder)
        env.update({"MINEDRAFT_TLS_CERT_FILE": str(cert), "MINEDRAFT_TLS_KEY_FILE": str(key)})
    cfg = StackConfig(target=str(random_pair[0]), draft=str(random_pair[1]), grpc_port=free_port(),
                      http_port=free_port(), k=3, num_blocks=256, log_dir=folder,
                      process_env={"batch-manager": env})
    stack = LocalStack(cfg)
    s = Secured(stack, cert)
    try:
        stack.start_verifier()
        stack.start_draft()
        stack.start_manager()

        def ready() -> bool:
            assert stack.first_exit() is None, stack.first_exit()
            try:
                with s.client() as c:
                    return c.get("/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout=120)
        yield s
    finally:
        stack.stop()


COMPLETION = {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True}
CHAT = {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 3, "temperature": 0}
ROUTES = [("POST", "/v1/completions", COMPLETION), ("POST", "/v1/chat/completions", CHAT),
          ("GET", "/v1/models", None), ("GET", "/openapi.json", None), ("GET", "/docs", None)]


def test_every_public_http_route_needs_a_key_but_health_and_metrics(secured: Secured) -> None:
    with secured.client() as c:
        for method, path, body in ROUTES:
            for headers in ({}, bearer("wrong-key"), {"Authorization": API_KEYS[0]}, bearer(ADMIN_KEY)):
                reply = c.request(method, path, json=body, headers=headers)
                assert reply.status_code == 401, (path, headers, reply.text)
                assert reply.headers["www-authenticate"] == "Bearer"
                assert reply.json()["error"]["code"] == "invalid_api_key"
            for key in API_KEYS:  # the inline key and the one from the key file
                assert c.request(method, path, json=body, headers=bearer(key)).status_code == 200, path
        lower = c.post("/v1/completions", json=COMPLETION, headers={"Authorization": f"bearer {API_KEYS[1]}"})
        assert lower.status_code == 200 and lower.json()["usage"]["completion_tokens"] == 3
        for path in ("/health", "/health/live", "/metrics"):
            assert c.get(path).status_code == 200, path


def test_every_grpc_method_needs_a_key_but_health(secured: Secured) -> None:
    request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[5, 6]),
                                             sampling=generation_pb2.SamplingParameters(max_tokens=2))
    with secured.channel() as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        calls = [
            lambda md: stub.Generate(request, timeout=30, metadata=md),
            lambda md: list(stub.GenerateStream(request, timeout=30, metadata=md)),
            lambda md: list(reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30, metadata=md)),
        ]
        for call in calls:
            for metadata in ((), grpc_metadata("wrong-key"), grpc_metadata(ADMIN_KEY)):
                with pytest.raises(grpc.RpcError) as err:
                    call(metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()
            for key in API_KEYS:
                assert call(grpc_metadata(key))
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_the_admin_api_is_not_on_the_public_port_and_needs_its_own_key(secured: Secured) -> None:
    admin = f"http://127.0.0.1:{secured.stack.admin_port}"
    with secured.client() as c:
        for key in (*API_KEYS, ADMIN_KEY):
            assert c.get("/admin/policy", headers=bearer(key)).status_code in (401, 404)
        assert c.get("/admin/policy", headers=bearer()).status_code == 404
        assert c.put("/admin/policy", json={"k": 2}, headers=bearer()).status_code == 404
    for headers in ({}, bearer(), bearer(API_KEYS[1]), bearer("wrong")):
        assert httpx.get(f"{admin}/admin/policy", headers=headers, timeout=10).status_code == 401
        assert httpx.put(f"{admin}/admin/policy", json={"k": 2}, headers=headers, timeout=10).status_code == 401
    assert httpx.get(f"{admin}/health", timeout=10).status_code == 200  # the operator reads it without a key
    changed = httpx.put(f"{admin}/admin/policy", json={"k": 2}, headers=bearer(ADMIN_KEY), timeout=30)
    assert changed.status_code == 200 and changed.json()["k"] == 2
    assert httpx.put(f"{admin}/admin/policy", json={"k": 3}, headers=bearer(ADMIN_KEY), timeout=30).json()["k"] == 3


def test_internal_listeners_are_on_loopback_and_the_store_log_is_honest(secured: Secured) -> None:
    stack = secured.stack
    store_port = worker_info(stack.target_port).data_plane_port
    for name, proc in stack.procs.items():
        addresses = listening_addresses(proc.pid)
        assert addresses and all(is_loopback(a) for a in addresses), (name, addresses)
    log = (stack.cfg.log_dir / "verifier.log").read_text()  # type: ignore[operator]
    assert f"data plane rendezvous store listening on 127.0.0.1:{store_port} only" in log


def test_public_listeners_speak_tls_with_the_configured_certificate(secured: Secured) -> None:
    if secured.cert is None:
        pytest.skip("openssl is not installed: no certificate to test TLS with")
    with secured.client() as c:
        assert c.post("/v1/completions", json=COMPLETION, headers=bearer()).json()["usage"]["completion_tokens"] == 3
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{secured.stack.cfg.http_port}/health", timeout=5)
    with pytest.raises(httpx.ConnectError):  # a client that does not trust the certificate
        httpx.get(f"https://127.0.0.1:{secured.stack.cfg.http_port}/health", timeout=5)
    with grpc.insecure_channel(f"127.0.0.1:{secured.stack.cfg.grpc_port}") as plain:
        with pytest.raises(grpc.RpcError) as err:
            generation_pb2_grpc.GenerationStub(plain).Generate(generation_pb2.GenerateRequest(), timeout=5,
                                                                metadata=grpc_metadata())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
