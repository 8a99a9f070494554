"""The pod the operator generates for a CPU replica really serves: processes started from its spec."""

from __future__ import annotations

import asyncio

import pytest

from minedraft_operator.policy import differs, policy_body
from tests.operator.conftest import ADMIN_KEY, ADMIN_SECRET, ADMIN_SECRET_KEY
from tests.operator.emulator import eventually
from tests.operator.pod_runner import LocalPod, complete, http


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
    """The admin key comes from the Secret (a mounted file): a push without it or with another key is
    refused by the real admin API and changes nothing; with it, the push takes effect."""
    _, pod = running_pod
    url = f"http://127.0.0.1:{pod.port('batch-manager', 'admin')}/admin/policy"
    env = {e["name"]: e for e in pod.container("batch-manager")["env"]}
    assert env["MINEDRAFT_ADMIN_API_KEY_FILE"] == {"name": "MINEDRAFT_ADMIN_API_KEY_FILE",
                                                   "value": "/etc/minedraft/admin-key/key"}
    assert "MINEDRAFT_ADMIN_API_KEY" not in env
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


def test_the_batch_manager_takes_every_field_the_operator_sends(running_pod) -> None:
    """The whole admin body of a SpeculationPolicy (TETRIS selection included) is accepted by the real batch
    manager and read back as sent, so no field of the CRD is silently lost on the way."""
    _, pod = running_pod
    url = f"http://127.0.0.1:{pod.port('batch-manager', 'admin')}/admin/policy"
    _, before = http("GET", url, key=ADMIN_KEY)
    body = policy_body({"mode": "sd", "k": {"initial": 3},
                        "draftSelection": {"strategy": "tetris", "extraDrafts": 2, "minBatch": 8}})
    try:
        status, after = http("PUT", url, body, key=ADMIN_KEY)
        assert status == 200, after
        assert differs(after, body) == [] and differs(http("GET", url, key=ADMIN_KEY)[1], body) == []
        assert complete(pod.port("batch-manager", "http"))["usage"]["completion_tokens"] == 12
    finally:
        assert http("PUT", url, {k: before[k] for k in body}, key=ADMIN_KEY)[0] == 200


def _rotate(pod: LocalPod, *keys: str) -> None:
    """What the kubelet does after `kubectl edit secret`: the mounted file is swapped atomically."""
    pod.update_secret(ADMIN_SECRET, {ADMIN_SECRET_KEY: "\n".join(keys) + "\n"})


async def _refused_then_accepted(url: str, refused: list[str], accepted: list[str]) -> bool:
    for key in refused:
        assert (await asyncio.to_thread(http, "GET", url, None, key))[0] == 401, key
    for key in accepted:
        assert (await asyncio.to_thread(http, "GET", url, None, key))[0] == 200, key
    return True


@pytest.mark.asyncio
async def test_rotating_the_admin_key_secret_needs_no_restart(running_pod) -> None:
    """Old + new during the kubelet's lag, then new only: the running batch manager follows the file within
    seconds (same process); the operator's client, given the Secret's keys new first, pushes throughout."""
    from minedraft_operator.admin import AdminClient, AdminError

    _, pod = running_pod
    base = f"http://127.0.0.1:{pod.port('batch-manager', 'admin')}"
    url = f"{base}/admin/policy"
    pid = pod.procs["batch-manager"].pid
    new = "pod-test-admin-key-rotated-9e4a"
    client = AdminClient(timeout_s=30)
    try:
        # The Secret already says (new, old) but this replica's file does not yet: the client falls back.
        assert (await client.get_policy(base, (new, ADMIN_KEY)))["mode"] == pod.initial_policy["mode"]
        _rotate(pod, new, ADMIN_KEY)
        await eventually(lambda: _refused_then_accepted(url, ["not-the-key"], [new, ADMIN_KEY]), timeout_s=5,
                         what="both keys accepted")
        _rotate(pod, new)
        await eventually(lambda: _refused_then_accepted(url, [ADMIN_KEY], [new]), timeout_s=5,
                         what="the old key refused")
        depth = await client.put_policy(base, {"pipeline_depth": 1}, (new,))
        assert depth["pipeline_depth"] == 1
        with pytest.raises(AdminError, match="HTTP 401"):
            await client.get_policy(base, (ADMIN_KEY,))
        # A Secret emptied or gone mid-rotation never opens the admin API: the last keys stay in force.
        pod.update_secret(ADMIN_SECRET, {ADMIN_SECRET_KEY: "\n"})
        key_file = pod.mounts["admin-key"] / "key"
        await asyncio.sleep(1.5)
        assert await _refused_then_accepted(url, ["", ADMIN_KEY], [new])
        key_file.unlink()
        await asyncio.sleep(1.5)
        assert await _refused_then_accepted(url, ["", ADMIN_KEY], [new])
        assert "holds no key" in pod.log("batch-manager")
    finally:
        await client.close()
        _rotate(pod, ADMIN_KEY)  # the other tests of the shared pod use the original key
        await eventually(lambda: _refused_then_accepted(url, [new], [ADMIN_KEY]), timeout_s=5,
                         what="the original key back")
    assert pod.procs["batch-manager"].pid == pid and pod.procs["batch-manager"].poll() is None


@pytest.mark.parametrize("container", ["verifier", "draft", "batch-manager"])
def test_every_container_is_started_with_only_its_declared_environment(running_pod, container) -> None:
    """The processes got nothing the template does not declare (the runner passes only PATH and LANG)."""
    _, pod = running_pod
    declared = {e["name"] for e in pod.container(container)["env"]}
    assert {"MINEDRAFT_HOST", "HOME"} <= declared
    assert pod.procs[container].poll() is None
