"""The pod the operator generates for a CPU replica really serves: processes started from its spec."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("container", ["verifier", "draft", "batch-manager"])
def test_every_container_is_started_with_only_its_declared_environment(running_pod, container) -> None:
    """The processes got nothing the template does not declare (the runner passes only PATH and LANG)."""
    _, pod = running_pod
    declared = {e["name"] for e in pod.container(container)["env"]}
    assert {"MINEDRAFT_HOST", "HOME"} <= declared
    assert pod.procs[container].poll() is None
