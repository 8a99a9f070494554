"""The pod the operator generates for a CPU replica really serves: processes started from its spec."""

from __future__ import annotations

import pytest

from tests.operator.conftest import ADMIN_KEY
from tests.operator.pod_runner import complete, http


def test_generated_cpu_pod_becomes_ready_and_serves_a_completion(running_pod) -> None:
    _, pod = running_pod
    reply = complete(pod.port("batch-manager", "http"))
    assert reply["usage"]["completion_tokens"] == 12
    assert reply["choices"][0]["text"]


def test_admin_and_health_are_on_the_admin_port_only(running_pod) -> None:
    _, pod = running_pod
    admin = pod.port("batch-manager", "admin")
    status, health = http("GET", f"http://127.0.0.1:{admin}/health")
    assert status == 200
    assert health["status"] == "ok" and health["draft_connected"] is True
    # The pod starts on the default policy its env declares (the operator pushes the referenced one later).
    assert {"mode": "psd", "k": 4, "max_num_seqs": 64}.items() <= pod.initial_policy.items()
    status, _ = http("GET", f"http://127.0.0.1:{pod.port('batch-manager', 'http')}/admin/policy")
    assert status == 404


def test_admin_api_refuses_calls_without_the_key_from_the_secret(running_pod) -> None:
    """The admin key comes from the Secret (valueFrom.secretKeyRef): a push without it or with another
    key is refused by the real admin API and changes nothing; with it, the push takes effect."""
    _, pod = running_pod
    url = f"http://127.0.0.1:{pod.port('batch-manager', 'admin')}/admin/policy"
    assert {e["name"]: e.get("valueFrom") for e in pod.container("batch-manager")["env"]}[
        "MINEDRAFT_ADMIN_API_KEY"] == {"secretKeyRef": {"name": "tiny-admin", "key": "admin-api-key"}}
    status, before = http("GET", url, key=ADMIN_KEY)
    assert status == 200
    depth = 1 if before["pipeline_depth"] != 1 else 2
    for key in (None, "not-the-key"):
        status, reply = http("PUT", url, {"pipeline_depth": depth}, key=key)
        assert status == 401, reply
        assert http("GET", url, key=key)[0] == 401
    assert http("GET", url, key=ADMIN_KEY) == (200, before)
    try:
        status, after = http("PUT", url, {"pipeline_depth": depth}, key=ADMIN_KEY)
        assert status == 200 and after["pipeline_depth"] == depth
        assert http("GET", url, key=ADMIN_KEY)[1]["pipeline_depth"] == depth
    finally:
        assert http("PUT", url, {"pipeline_depth": before["pipeline_depth"]}, key=ADMIN_KEY)[0] == 200
    # /health stays open on the admin port: the kubelet's probes send no key.
    assert http("GET", f"http://127.0.0.1:{pod.port('batch-manager', 'admin')}/health")[0] == 200


@pytest.mark.parametrize("container", ["verifier", "draft", "batch-manager"])
def test_every_container_is_started_with_only_its_declared_environment(running_pod, container) -> None:
    """The processes got nothing the template does not declare (the runner passes only PATH and LANG)."""
    _, pod = running_pod
    declared = {e["name"] for e in pod.container(container)["env"]}
    assert {"MINEDRAFT_HOST", "HOME"} <= declared
    assert pod.procs[container].poll() is None
