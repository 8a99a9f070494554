"""The pod the operator generates for a CPU replica really serves: processes started from its spec."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest


def http(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def complete(pod, max_tokens: int = 12) -> dict[str, Any]:
    base = f"http://127.0.0.1:{pod.port('batch-manager', 'http')}"
    status, models = http("GET", f"{base}/v1/models")
    assert status == 200
    status, reply = http("POST", f"{base}/v1/completions", {
        "model": models["data"][0]["id"], "prompt": "Once upon a time", "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True})
    assert status == 200, reply
    return reply


def test_generated_cpu_pod_becomes_ready_and_serves_a_completion(running_pod) -> None:
    _, pod = running_pod
    reply = complete(pod)
    assert reply["usage"]["completion_tokens"] == 12
    assert reply["choices"][0]["text"]


def test_admin_and_health_are_on_the_admin_port_only(running_pod) -> None:
    _, pod = running_pod
    admin = pod.port("batch-manager", "admin")
    status, health = http("GET", f"http://127.0.0.1:{admin}/health")
    assert status == 200
    assert health["status"] == "ok" and health["mode"] == "psd" and health["draft_connected"] is True
    status, policy = http("GET", f"http://127.0.0.1:{admin}/admin/policy")
    assert status == 200 and policy["mode"] == "psd" and policy["k"] == 4 and policy["max_num_seqs"] == 64
    status, _ = http("GET", f"http://127.0.0.1:{pod.port('batch-manager', 'http')}/admin/policy")
    assert status == 404


@pytest.mark.parametrize("container", ["verifier", "draft", "batch-manager"])
def test_every_container_is_started_with_only_its_declared_environment(running_pod, container) -> None:
    """The processes got nothing the template does not declare (the runner passes only PATH and LANG)."""
    _, pod = running_pod
    declared = {e["name"] for e in pod.container(container)["env"]}
    assert {"MINEDRAFT_HOST", "HOME"} <= declared
    assert pod.procs[container].poll() is None
