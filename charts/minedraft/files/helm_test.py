"""`helm test` check of a minedraft replica: the public APIs answer and speculation really runs.

Runs inside the batch-manager image (the chart mounts this file from a ConfigMap), so it uses
only the standard library and grpcio + grpcio-health-checking, which that image ships.
Steps, each one a failure of its own:
1. gRPC health (grpc.health.v1, service "") is SERVING;
2. GET /v1/models lists the served model;
3. a short greedy completion returns tokens, and the same request again returns the same text;
4. the batch manager's speculation counters (GET /health drafted_total) moved during step 3.
   With several replicas behind the Service, --health-every-address reads /health from every
   address the health URL's host resolves to (a headless Service: one per ready pod) and sums.
Exit status 0 when all pass, 1 with a message on the first failure.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class CheckFailed(Exception):
    """One step of the check did not hold."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grpc", default=env("MINEDRAFT_TEST_GRPC", "localhost:50051"), help="host:port of the gRPC API")
    p.add_argument("--http", default=env("MINEDRAFT_TEST_HTTP", "http://localhost:8000"), help="OpenAI HTTP base URL")
    p.add_argument("--health", default=env("MINEDRAFT_TEST_HEALTH", ""),
                   help="URL of GET /health (default: <http>/health; the admin port when it is separate)")
    p.add_argument("--health-every-address", action="store_true",
                   default=env("MINEDRAFT_TEST_HEALTH_EVERY_ADDRESS", "") == "1",
                   help="sum /health over every address of the health URL's host (a headless Service)")
    p.add_argument("--model", default=env("MINEDRAFT_TEST_MODEL", ""), help="expected served model name")
    p.add_argument("--prompt", default=env("MINEDRAFT_TEST_PROMPT", "The quick brown fox"))
    p.add_argument("--max-tokens", type=int, default=int(env("MINEDRAFT_TEST_MAX_TOKENS", "16")))
    p.add_argument("--timeout", type=float, default=float(env("MINEDRAFT_TEST_TIMEOUT", "120")),
                   help="seconds to wait for the first healthy answer; each call gets this too")
    return p.parse_args(argv)


def check_grpc_health(target: str, deadline: float) -> None:
    """Retry until SERVING or the deadline: a fresh pod may still be loading models."""
    last = "no answer"
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            time.sleep(1)
    raise CheckFailed(f"gRPC health at {target} is not SERVING ({last})")


def http_json(url: str, timeout: float, body: dict[str, Any] | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    api_key = os.environ.get("MINEDRAFT_API_KEY", "")
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise CheckFailed(f"{request.method} {url} -> {exc.code}: {exc.read()[:500]!r}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise CheckFailed(f"{request.method} {url} failed: {exc}") from exc


def check_models(http: str, expected: str, timeout: float) -> str:
    listing = http_json(f"{http}/v1/models", timeout)
    ids = [card.get("id") for card in listing.get("data", [])]
    if not ids:
        raise CheckFailed(f"GET /v1/models lists no model: {listing}")
    if expected and expected not in ids:
        raise CheckFailed(f"GET /v1/models lists {ids}, not {expected!r}")
    return expected or ids[0]


def greedy_completion(http: str, model: str, prompt: str, max_tokens: int, timeout: float) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    reply = http_json(f"{http}/v1/completions", timeout, body)
    choices = reply.get("choices") or []
    tokens = reply.get("usage", {}).get("completion_tokens", 0)
    if not choices or tokens < 1:
        raise CheckFailed(f"the completion produced no tokens: {reply}")
    return str(choices[0].get("text", ""))


def health_urls(health_url: str, every_address: bool, deadline: float) -> list[str]:
    """The URL itself, or one URL per address its host resolves to (retried: DNS lists ready pods only)."""
    if not every_address:
        return [health_url]
    parts = urllib.parse.urlsplit(health_url)
    last = "no address"
    while time.monotonic() < deadline:
        try:
            infos = socket.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM)
            hosts = sorted({f"[{i[4][0]}]" if i[0] == socket.AF_INET6 else str(i[4][0]) for i in infos})
            return [urllib.parse.urlunsplit(parts._replace(netloc=f"{h}:{parts.port}")) for h in hosts]
        except OSError as exc:
            last = str(exc)
        time.sleep(1)
    raise CheckFailed(f"{parts.hostname} did not resolve ({last})")


def speculation_totals(urls: list[str], timeout: float) -> tuple[int, int, dict[str, Any]]:
    """(drafted, accepted) summed over `urls`, and the first /health body (for messages)."""
    drafted = accepted = 0
    first: dict[str, Any] = {}
    for url in urls:
        status = http_json(url, timeout)
        if "drafted_total" not in status:
            raise CheckFailed(f"GET {url} has no drafted_total: {status}")
        drafted += int(status["drafted_total"])
        accepted += int(status.get("accepted_total", 0))
        first = first or status
    return drafted, accepted, first


def run(args: argparse.Namespace) -> str:
    """All four steps; returns a one-line summary."""
    http = args.http.rstrip("/")
    health_url = args.health or f"{http}/health"
    deadline = time.monotonic() + args.timeout
    check_grpc_health(args.grpc, deadline)
    model = check_models(http, args.model, args.timeout)
    urls = health_urls(health_url, args.health_every_address, deadline)
    drafted_before, accepted_before, _ = speculation_totals(urls, args.timeout)
    first = greedy_completion(http, model, args.prompt, args.max_tokens, args.timeout)
    second = greedy_completion(http, model, args.prompt, args.max_tokens, args.timeout)
    if first != second:
        raise CheckFailed(f"greedy completions differ: {first!r} vs {second!r}")
    drafted_after, accepted_after, status = speculation_totals(urls, args.timeout)
    if drafted_after <= drafted_before:
        raise CheckFailed(
            f"speculation counters did not move (drafted_total {drafted_before} -> {drafted_after}; mode "
            f"{status.get('mode')!r}, configured {status.get('configured_mode')!r}, draft_connected "
            f"{status.get('draft_connected')}, fallbacks {status.get('fallbacks')})")
    return (f"ok: model {model!r}, greedy text {first!r}, drafted +{drafted_after - drafted_before}, "
            f"accepted +{accepted_after - accepted_before}, transport {status.get('draft_link_transport', '')!r}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(run(args), flush=True)
    except CheckFailed as exc:
        print(f"minedraft helm test FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
