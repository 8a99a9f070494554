"""The operator loop against kmock's Kubernetes emulator: objects appear, change, and status follows pods."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.operator.conftest import ADMIN_KEY, admin_secret
from tests.operator.emulator import eventually, running_operator

MDD = ("minedraft.io/v1alpha1", "minedraftdeployments")
POLICY = ("minedraft.io/v1alpha1", "speculationpolicies")
RCT = ("resource.k8s.io/v1", "resourceclaimtemplates")
NETPOL = ("networking.k8s.io/v1", "networkpolicies")
PDB = ("policy/v1", "poddisruptionbudgets")
NS = "default"


def with_namespace(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    obj["metadata"].update(namespace=NS, uid=uid, generation=1, resourceVersion="1")
    return obj


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in obj.get("status", {}).get("conditions", [])}


def pod(mdd: dict[str, Any], name: str, status: dict[str, Any]) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "minedraft", "app.kubernetes.io/instance": mdd["metadata"]["name"],
              "app.kubernetes.io/component": "server", "app.kubernetes.io/managed-by": "minedraft-operator"}
    meta = {"name": name, "namespace": NS, "labels": labels, "resourceVersion": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}, "status": status}


@pytest.mark.asyncio
async def test_create_change_and_prune(kmock, gpu_mdd) -> None:
    mdd = with_namespace(gpu_mdd, "uid-gpu")
    async with running_operator(kmock) as k:
        await k.create(*MDD, mdd)

        async def deployment_with(containers: list[str]) -> dict[str, Any]:
            d = await k.get("apps/v1", "deployments", NS, "llama-70b")
            assert [c["name"] for c in d["spec"]["template"]["spec"]["containers"]] == containers
            return d

        await eventually(lambda: deployment_with(["verifier", "verifier-tp1", "draft", "batch-manager"]),
                         what="the deployment")
        # The owned objects are applied one after another: the last of them may still be on its way.
        await eventually(lambda: k.get(*PDB, NS, "llama-70b"), what="the disruption budget")
        service = await eventually(lambda: k.get("v1", "services", NS, "llama-70b"), what="the service")
        assert [p["port"] for p in service["spec"]["ports"]] == [50051, 8000]
        (template,) = await k.list(*RCT, NS)
        assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 3
        assert template["metadata"]["ownerReferences"][0]["uid"] == "uid-gpu"
        # No auth.adminSecretRef: the operator generated the admin key's Secret (owned) and the pods read it.
        secret = await k.get("v1", "secrets", NS, "llama-70b-admin-key")
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-gpu" and secret["immutable"] is True
        key = base64.b64decode(secret["data"]["admin-api-key"]).decode()
        assert len(key) >= 40
        d = await k.get("apps/v1", "deployments", NS, "llama-70b")
        bm = next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "batch-manager")
        volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
        assert volumes["admin-key"]["secret"]["secretName"] == "llama-70b-admin-key"
        assert {e["name"]: e.get("value") for e in bm["env"]}["MINEDRAFT_ADMIN_API_KEY_FILE"] == (
            "/etc/minedraft/admin-key/key")
        policy = await k.get(*NETPOL, NS, "llama-70b")
        assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-gpu"
        admin_rule, open_rule = policy["spec"]["ingress"]
        assert admin_rule["ports"] == [{"protocol": "TCP", "port": 8081}]
        assert admin_rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
        assert 8081 not in [p["port"] for p in open_rule["ports"]] and "from" not in open_rule
        budget = await k.get(*PDB, NS, "llama-70b")
        assert budget["spec"]["maxUnavailable"] == 1 and budget["metadata"]["ownerReferences"][0]["uid"] == "uid-gpu"
        assert budget["spec"]["selector"] == d["spec"]["selector"]

        # Change the resource: tp 4 -> a new claim template (specs are immutable), the old one is pruned.
        await k.patch(*MDD, NS, "llama-70b", {"metadata": {"generation": 2},
                                              "spec": {"target": {"tensorParallelSize": 4}}})
        await eventually(lambda: deployment_with(["verifier", "verifier-tp1", "verifier-tp2", "verifier-tp3",
                                                  "draft", "batch-manager"]), what="tp 4")

        async def one_template_of(count: int) -> bool:
            templates = await k.list(*RCT, NS)
            assert [t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] for t in templates] == [count]
            return True

        await eventually(lambda: one_template_of(5), what="a single 5-GPU claim template")
        # Reconciling again keeps the generated key (pods that read it keep working).
        again = await k.get("v1", "secrets", NS, "llama-70b-admin-key")
        assert base64.b64decode(again["data"]["admin-api-key"]).decode() == key

        # devicePlugin: no claim template; GPUs requested per container.
        await k.patch(*MDD, NS, "llama-70b", {"metadata": {"generation": 3}, "spec": {"gpu": {"mode": "devicePlugin"}}})

        async def device_plugin() -> bool:
            d = await k.get("apps/v1", "deployments", NS, "llama-70b")
            limits = [c["resources"].get("limits", {}).get("nvidia.com/gpu") for c in
                      d["spec"]["template"]["spec"]["containers"]]
            assert limits == [1, 1, 1, 1, 1, None]
            assert await k.list(*RCT, NS) == []
            return True

        await eventually(device_plugin, what="device plugin layout")

        # A pod the scheduler cannot place -> GPUsAllocated False with the scheduler's message.
        await k.create("v1", "pods", pod(mdd, "llama-70b-0", {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]}))

        async def unschedulable() -> bool:
            obj = await k.get(*MDD, NS, "llama-70b")
            assert conditions(obj)["GPUsAllocated"] == ("False", "Unschedulable")
            assert conditions(obj)["Ready"] == ("False", "ReplicasNotReady")
            assert obj["status"]["observedGeneration"] == 3
            return True

        await eventually(unschedulable, what="GPUsAllocated False")

        # networkPolicy and disruptionBudget switched off: both pruned.
        await k.patch(*MDD, NS, "llama-70b", {"metadata": {"generation": 4}, "spec": {
            "networkPolicy": {"enabled": False}, "disruptionBudget": {"enabled": False}}})

        async def pruned() -> bool:
            assert await k.list(*NETPOL, NS) == [] and await k.list(*PDB, NS) == []
            assert await k.get("apps/v1", "deployments", NS, "llama-70b")  # the rest stays
            return True

        await eventually(pruned, what="NetworkPolicy and PodDisruptionBudget pruned")


def container_statuses(bm_ready: bool, draft: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "verifier", "ready": True, "restartCount": 0, "state": {"running": {}}},
            {"name": "draft", **draft},
            {"name": "batch-manager", "ready": bm_ready, "restartCount": 0, "state": {"running": {}}}]


DRAFT_UP = {"ready": True, "restartCount": 0, "state": {"running": {}}}
DRAFT_CRASHLOOP = {"ready": False, "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                   "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}


def pod_status(ready: bool, draft: dict[str, Any], ip: str = "127.0.0.1") -> dict[str, Any]:
    return {"podIP": ip, "conditions": [{"type": "PodScheduled", "status": "True"},
                                        {"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": container_statuses(ready, draft)}


@pytest.mark.asyncio
async def test_pod_status_drives_conditions(kmock, cpu_mdd, policy) -> None:
    from tests.operator.pod_runner import free_ports

    mdd = with_namespace(cpu_mdd, "uid-cpu")
    (closed,) = free_ports(1)  # nothing listens there: every push fails
    mdd["spec"]["ports"] = {"admin": closed}
    async with running_operator(kmock) as k:
        await k.create(*MDD, mdd)
        await k.create("v1", "pods", pod(mdd, "tiny-0", pod_status(False, {"ready": False, "restartCount": 0,
                                                                           "state": {"running": {}}})))

        async def status_is(expected: dict[str, tuple[str, str]]) -> dict[str, Any]:
            obj = await k.get(*MDD, NS, "tiny")
            got = conditions(obj)
            assert {t: got.get(t) for t in expected} == expected
            return obj

        await eventually(lambda: status_is({"Ready": ("False", "ReplicasNotReady"),
                                            "GPUsAllocated": ("True", "CPUOnly"),
                                            "PolicyApplied": ("False", "PolicyNotFound"),
                                            "Degraded": ("False", "Speculating")}), what="starting pod")

        # Ready, but the draft crash-loops: Degraded with the reason; the push to pin ar fails (nobody listens).
        await k.patch("v1", "pods", NS, "tiny-0", {"status": pod_status(True, DRAFT_CRASHLOOP)}, "status")
        obj = await eventually(lambda: status_is({"Ready": ("True", "ReplicasReady"),
                                                  "Degraded": ("True", "DraftCrashLoop")}), what="degraded")
        assert "tiny-0 (CrashLoopBackOff)" in next(c["message"] for c in obj["status"]["conditions"]
                                                   if c["type"] == "Degraded")
        assert obj["status"]["readyReplicas"] == 1 and obj["status"]["replicas"] == 1
        assert obj["status"]["selector"] == ("app.kubernetes.io/name=minedraft,app.kubernetes.io/instance=tiny,"
                                             "app.kubernetes.io/component=server")

        # The policy appears: the push is tried, fails, is reported (and retried by the timer).
        await k.create(*POLICY, with_namespace(policy, "uid-pol"))
        obj = await eventually(lambda: status_is({"PolicyApplied": ("False", "PushFailed")}), what="push failure")
        (replica,) = obj["status"]["replicaStatus"]
        assert replica["pod"] == "tiny-0" and replica["draftHealthy"] is False and replica["policyGeneration"] == 0
        assert f"127.0.0.1:{closed}" in replica["error"]

        async def policy_reports_failure() -> bool:
            status = (await k.get(*POLICY, NS, "fast")).get("status", {})
            assert status.get("totalReplicas") == 1 and status.get("appliedReplicas") == 0
            assert status["replicas"][0]["deployment"] == "tiny" and "error" in status["replicas"][0]
            return True

        await eventually(policy_reports_failure, what="policy status")

        # The draft recovers: no longer degraded.
        await k.patch("v1", "pods", NS, "tiny-0", {"status": pod_status(True, DRAFT_UP)}, "status")
        await eventually(lambda: status_is({"Degraded": ("False", "Speculating")}), what="recovered")


@pytest.mark.asyncio
async def test_a_missing_admin_secret_is_reported_not_generated(kmock, cpu_mdd) -> None:
    """A Secret the resource names is the user's: the operator never creates it, and says why pushes stop."""
    mdd = with_namespace(cpu_mdd, "uid-ref")
    mdd["spec"]["auth"] = {"adminSecretRef": {"name": "ops-admin"}}
    mdd["spec"].pop("policyRef")  # the policy defaults: only the key can stop the push
    async with running_operator(kmock) as k:
        await k.create(*MDD, mdd)
        await k.create("v1", "pods", pod(mdd, "tiny-0", pod_status(True, DRAFT_UP)))

        async def reported() -> dict[str, Any]:
            obj = await k.get(*MDD, NS, "tiny")
            assert conditions(obj).get("PolicyApplied") == ("False", "PushFailed")
            (replica,) = obj["status"]["replicaStatus"]
            assert replica["error"] == "admin key: Secret 'ops-admin' (auth.adminSecretRef) not found in default"
            return obj

        await eventually(reported, what="the missing Secret in the status")
        assert [s["metadata"]["name"] for s in await k.list("v1", "secrets", NS)] == []
        # The Deployment is made all the same (its pods wait for the Secret, as the kubelet does); the push may
        # report before the create handler ran, so wait for it rather than expect it at once.
        await eventually(lambda: k.get("apps/v1", "deployments", NS, "tiny"), what="the Deployment")


@pytest.mark.asyncio
async def test_policy_reaches_a_real_batch_manager(kmock, running_pod, policy) -> None:
    """The SpeculationPolicy is pushed live to the batch manager of the pod the operator generated
    (run locally), the status records it, a crash-looping draft pins the replica to ar and its
    recovery restores the policy; greedy output stays the same throughout."""
    import asyncio
    import copy

    from tests.operator.pod_runner import complete, http

    started, local = running_pod
    mdd = with_namespace(copy.deepcopy(started), "uid-live")
    mdd["spec"]["policyRef"] = {"name": "fast"}
    admin = f"http://127.0.0.1:{local.port('batch-manager', 'admin')}"
    http_port = local.port("batch-manager", "http")
    baseline = (await asyncio.to_thread(complete, http_port))["choices"][0]["text"]
    policy["spec"].update(mode="sd", k={"initial": 3, "min": 1, "max": 8},
                          batching={"maxSequencesPerBatch": 8, "pipelineDepth": 1})

    async def batch_manager_runs(expected: dict[str, Any]) -> dict[str, Any]:
        status, effective = await asyncio.to_thread(http, "GET", f"{admin}/admin/policy", None, ADMIN_KEY)
        assert status == 200 and {k: effective.get(k) for k in expected} == expected
        return effective

    async with running_operator(kmock) as k:
        # The Secret the resource names (auth.adminSecretRef): the pod got its key, the operator reads it.
        await k.create("v1", "secrets", admin_secret(NS))
        await k.create(*MDD, mdd)
        await k.create("v1", "pods", pod(mdd, "tiny-0", pod_status(True, DRAFT_UP)))
        await k.create(*POLICY, with_namespace(policy, "uid-fast"))
        await eventually(lambda: batch_manager_runs({"mode": "sd", "k": 3, "max_num_seqs": 16, "pipeline_depth": 1}),
                         what="policy generation 1 on the batch manager")

        async def recorded(generation: int, mode: str, k_: int) -> dict[str, Any]:
            obj = await k.get(*MDD, NS, "tiny")
            status = obj.get("status", {})
            assert conditions(obj).get("PolicyApplied") == ("True", "Applied")
            (replica,) = status["replicaStatus"]
            # replica["mode"] is the effective one: an idle psd replica runs sd (one batch is empty)
            assert (replica["policyGeneration"], replica["k"], replica["draftHealthy"]) == (generation, k_, True)
            assert (status["mode"], status["k"], status["policy"]) == (mode, k_, {"name": "fast",
                                                                                  "generation": generation})
            assert 0.0 <= status["acceptanceRate"] <= 1.0
            return obj

        await eventually(lambda: recorded(1, "sd", 3), what="status of generation 1")
        pol = await eventually(lambda: k.get(*POLICY, NS, "fast"), what="policy")
        assert (await asyncio.to_thread(complete, http_port))["choices"][0]["text"] == baseline

        async def policy_status(applied: int) -> bool:
            status = (await k.get(*POLICY, NS, "fast")).get("status", {})
            assert (status.get("appliedReplicas"), status.get("totalReplicas")) == (applied, 1)
            return True

        await eventually(lambda: policy_status(1), what="policy status")
        assert pol["metadata"]["name"] == "fast"

        # kubectl apply of a new generation: reaches the running batch manager without a restart.
        pid = local.procs["batch-manager"].pid
        change = {"metadata": {"generation": 2}, "spec": {"mode": "psd", "k": {"initial": 2}}}
        await k.patch(*POLICY, NS, "fast", change)
        await eventually(lambda: batch_manager_runs({"mode": "psd", "k": 2}), what="generation 2")
        await eventually(lambda: recorded(2, "psd", 2), what="status of generation 2")
        assert local.procs["batch-manager"].pid == pid and local.procs["batch-manager"].poll() is None

        # The draft container crash-loops: the replica is pinned to ar, the status says why.
        await k.patch("v1", "pods", NS, "tiny-0", {"status": pod_status(True, DRAFT_CRASHLOOP)}, "status")
        await eventually(lambda: batch_manager_runs({"mode": "ar", "k": 2}), what="pinned to ar")

        async def degraded() -> bool:  # the operator pins the replica first, then writes the status
            assert conditions(await k.get(*MDD, NS, "tiny"))["Degraded"] == ("True", "DraftCrashLoop")
            return True

        await eventually(degraded, what="Degraded: DraftCrashLoop")
        assert (await asyncio.to_thread(complete, http_port))["choices"][0]["text"] == baseline

        # Healthy again: the policy's mode comes back.
        await k.patch("v1", "pods", NS, "tiny-0", {"status": pod_status(True, DRAFT_UP)}, "status")
        await eventually(lambda: batch_manager_runs({"mode": "psd", "k": 2}), what="mode restored")
        await eventually(lambda: recorded(2, "psd", 2), what="status after recovery")
