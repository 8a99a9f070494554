"""The pure reconcile: GPU layouts, env, probes, security, ownership; every object valid for Kubernetes 1.34."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from minedraft_operator.render import render

GPU_CONTAINERS_TP = {1: ["verifier", "draft"], 2: ["verifier", "verifier-tp1", "draft"],
                     4: ["verifier", "verifier-tp1", "verifier-tp2", "verifier-tp3", "draft"]}


def rendered(mdd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    mdd["metadata"].update(namespace="ml", uid="1234-uid")
    objs: dict[str, dict[str, Any]] = {}
    for o in render(mdd):
        objs.setdefault(o["kind"], o)  # the first of a kind: the main Service before the headless one
    return objs


def containers(objs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in objs["Deployment"]["spec"]["template"]["spec"]["containers"]}


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from>") for e in container["env"]}


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("mode", ["dra", "devicePlugin"])
def test_gpu_layout(tp: int, mode: str, gpu_mdd) -> None:
    gpu_mdd["spec"]["target"]["tensorParallelSize"] = tp
    gpu_mdd["spec"]["gpu"]["mode"] = mode
    objs = rendered(gpu_mdd)
    for obj in objs.values():
        assert kubernetes_validate.validate(obj, "1.34.0", strict=True)
    cs = containers(objs)
    assert list(cs) == [*GPU_CONTAINERS_TP[tp], "batch-manager"]
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    for index, name in enumerate(GPU_CONTAINERS_TP[tp]):
        e = env(cs[name])
        assert e["MINEDRAFT_DEVICE"] == "cuda:0"
        assert e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert e["NCCL_P2P_LEVEL"] == "NVL" and e["NCCL_NVLS_ENABLE"] == "0"
        if mode == "dra":
            assert e["CUDA_VISIBLE_DEVICES"] == str(index)  # verifier ranks 0..tp-1, the draft tp
            assert cs[name]["resources"]["claims"] == [{"name": "gpus"}]
            assert "nvidia.com/gpu" not in cs[name]["resources"].get("limits", {})
        else:
            assert "CUDA_VISIBLE_DEVICES" not in e
            assert cs[name]["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert "claims" not in cs[name]["resources"]
    bm = cs["batch-manager"]
    assert "claims" not in bm["resources"] and not any(k.startswith(("CUDA", "NCCL")) for k in env(bm))
    assert env(bm)["MINEDRAFT_DATA_PLANE_BACKEND"] == "nccl"
    if mode == "dra":
        template = objs["ResourceClaimTemplate"]
        request = template["spec"]["spec"]["devices"]["requests"][0]
        assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                                      "count": tp + 1}
        assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}]
    else:
        assert "ResourceClaimTemplate" not in objs and "resourceClaims" not in pod


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tensor_parallel_ranks_rendezvous_on_localhost(tp: int, gpu_mdd) -> None:
    gpu_mdd["spec"]["target"]["tensorParallelSize"] = tp
    cs = containers(rendered(gpu_mdd))
    ranks = [env(cs[name]) for name in GPU_CONTAINERS_TP[tp][:-1]]
    assert [int(e["MINEDRAFT_TP_RANK"]) for e in ranks] == list(range(tp))
    assert {e["MINEDRAFT_TP_SIZE"] for e in ranks} == {str(tp)}
    assert {e["MINEDRAFT_TP_ADDR"] for e in ranks} == {"127.0.0.1:29650"}
    assert {e["MINEDRAFT_MODEL"] for e in ranks} == {"/models/target/Llama-3.3-70B-Instruct"}
    # Captured graphs hold the all-reduces: every rank must capture the same shapes at start-up.
    assert {(e["MINEDRAFT_CAPTURE_BATCH"], e["MINEDRAFT_CAPTURE_K"]) for e in ranks} == {("64", "8")}
    assert env(cs["draft"])["MINEDRAFT_CAPTURE_BATCH"] == "64"


def test_blas_reaches_each_worker_that_sets_it(gpu_mdd) -> None:
    gpu_mdd["spec"]["target"]["tensorParallelSize"] = 2
    gpu_mdd["spec"]["target"]["blas"] = "cublaslt"
    cs = containers(rendered(gpu_mdd))
    assert {env(cs[name])["MINEDRAFT_BLAS"] for name in GPU_CONTAINERS_TP[2][:-1]} == {"cublaslt"}
    assert "MINEDRAFT_BLAS" not in env(cs["draft"])  # unset: the worker's default, auto


def test_a_stand_in_draft_loads_on_verifier_rank_0_only(gpu_mdd) -> None:
    cs = containers(rendered(gpu_mdd))
    assert "MINEDRAFT_COLOCATED_DRAFT" not in env(cs["verifier"])  # off by default
    assert "MINEDRAFT_DRAFT_STAND_IN" not in env(cs["batch-manager"])
    gpu_mdd["spec"]["draft"]["standIn"] = True
    cs = containers(rendered(gpu_mdd))
    draft_folder = env(cs["draft"])["MINEDRAFT_MODEL"]
    assert env(cs["verifier"])["MINEDRAFT_COLOCATED_DRAFT"] == draft_folder == "/models/draft/Llama-3.2-1B-Instruct"
    assert env(cs["batch-manager"])["MINEDRAFT_DRAFT_STAND_IN"] == "1"
    mounted = {m["mountPath"] for m in cs["verifier"]["volumeMounts"]}
    assert {m["mountPath"] for m in cs["draft"]["volumeMounts"] if m.get("readOnly")} <= mounted  # its model too
    assert "MINEDRAFT_COLOCATED_DRAFT" not in env(cs["verifier-tp1"])  # the draft sits beside rank 0 only
    assert {m["mountPath"] for m in cs["verifier-tp1"]["volumeMounts"]} < mounted


def test_cpu_profile_requests_no_gpus(cpu_mdd) -> None:
    objs = rendered(cpu_mdd)
    assert set(objs) == {"NetworkPolicy", "Deployment", "Service", "PodDisruptionBudget"}  # no claim template
    cs = containers(objs)
    for name in ("verifier", "draft"):
        e = env(cs[name])
        assert e["MINEDRAFT_DEVICE"] == "cpu" and e["MINEDRAFT_DTYPE"] == "float32"
        assert not any(k.startswith(("CUDA", "NCCL", "MINEDRAFT_CAPTURE")) for k in e)
        assert "claims" not in cs[name]["resources"] and "limits" not in cs[name]["resources"]
    assert env(cs["verifier"])["MINEDRAFT_MODEL"] == "/opt/minedraft/models/tiny-target"
    assert env(cs["draft"])["MINEDRAFT_MODEL"] == "/opt/minedraft/models/tiny-draft"
    assert env(cs["batch-manager"])["MINEDRAFT_DATA_PLANE_BACKEND"] == "gloo"
    assert env(cs["batch-manager"])["MINEDRAFT_TOKENIZER"] == "/opt/minedraft/models/tiny-target"


def test_probes(gpu_mdd) -> None:
    gpu_mdd["spec"]["target"]["tensorParallelSize"] = 2
    cs = containers(rendered(gpu_mdd))
    for name, port in (("verifier", 50061), ("draft", 50062)):
        # The control port stays pod-local; the kubelet probes a health-only port on the pod IP.
        e = env(cs[name])
        assert (e["MINEDRAFT_HOST"], e["MINEDRAFT_PORT"]) == ("127.0.0.1", str(port))
        assert (e["MINEDRAFT_HEALTH_HOST"], e["MINEDRAFT_HEALTH_PORT"]) == ("0.0.0.0", str(port + 1000))
        startup = cs[name]["startupProbe"]
        assert startup["grpc"] == {"port": port + 1000, "service": ""}
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # model load may take long
        assert cs[name]["livenessProbe"]["grpc"]["port"] == port + 1000
        assert "readinessProbe" not in cs[name]  # a crash-looping draft must not hide the pod by itself
        assert "lifecycle" not in cs[name]  # workers drain themselves: they serve the manager until it leaves
        assert e["MINEDRAFT_DRAIN_GRACE_S"] == "45"  # the manager's preStop (15 s) and drain (30 s)
    assert not any(k.endswith("Probe") for k in cs["verifier-tp1"])  # it serves no port
    bm = cs["batch-manager"]
    for kind in ("startupProbe", "readinessProbe"):
        assert bm[kind]["httpGet"] == {"path": "/health", "port": 8081, "scheme": "HTTP"}
    assert bm["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": 8081, "scheme": "HTTP"}
    assert bm["lifecycle"]["preStop"] == {"sleep": {"seconds": 15}}
    e = env(bm)
    assert (e["MINEDRAFT_ADMIN_HOST"], e["MINEDRAFT_DRAIN_GRACE_S"]) == ("0.0.0.0", "30")
    assert e["MINEDRAFT_STREAM_INTERVAL"] == "1"  # the CRD's default: a chunk per verdict


def test_security_and_volumes(gpu_mdd) -> None:
    objs = rendered(gpu_mdd)
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes["target-model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    for name, c in containers(objs).items():
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"] == {"drop": ["ALL"]}
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert {"/tmp", "/home/minedraft"} <= set(mounts) and env(c)["HOME"] == "/home/minedraft"
        assert ("/dev/shm" in mounts) == (name != "batch-manager")
        assert all(m.get("readOnly") for p, m in mounts.items() if p.startswith("/models"))


def test_ownership_labels_and_service_wiring(gpu_mdd) -> None:
    objs = rendered(gpu_mdd)
    for obj in objs.values():
        meta = obj["metadata"]
        assert meta["namespace"] == "ml"
        assert meta["ownerReferences"] == [{"apiVersion": "minedraft.io/v1alpha1", "kind": "MineDraftDeployment",
                                            "name": "llama-70b", "uid": "1234-uid", "controller": True,
                                            "blockOwnerDeletion": True}]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/instance"] == "llama-70b"
        assert labels["app.kubernetes.io/managed-by"] == "minedraft-operator"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
    assert objs["Service"]["metadata"]["labels"]["app.kubernetes.io/component"] == "batch-manager"
    template = objs["Deployment"]["spec"]["template"]
    selector = objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert objs["Service"]["spec"]["selector"] == selector
    bm = containers(objs)["batch-manager"]
    named = {p["name"]: p["containerPort"] for p in bm["ports"]}
    assert [(p["port"], named[p["targetPort"]]) for p in objs["Service"]["spec"]["ports"]] == [(50051, 50051),
                                                                                              (8000, 8000)]
    e = env(bm)
    assert e["MINEDRAFT_VERIFIER_ADDRESS"] == "127.0.0.1:50061" and e["MINEDRAFT_DRAFT_ADDRESS"] == "127.0.0.1:50062"
    assert e["MINEDRAFT_API_KEY_FILE"] == "/etc/minedraft/api-key/key" and e["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://otel")
    assert {"MINEDRAFT_MODE": "psd", "MINEDRAFT_K": "4", "MINEDRAFT_MAX_NUM_SEQS": "64"}.items() <= e.items()


def test_claim_template_name_follows_its_immutable_spec(gpu_mdd) -> None:
    first = rendered(gpu_mdd)["ResourceClaimTemplate"]["metadata"]["name"]
    gpu_mdd["spec"]["replicas"] = 5
    assert rendered(gpu_mdd)["ResourceClaimTemplate"]["metadata"]["name"] == first
    gpu_mdd["spec"]["gpu"]["deviceSelectors"] = ["device.attributes['gpu.nvidia.com'].productName == 'H200'"]
    objs = rendered(gpu_mdd)
    assert objs["ResourceClaimTemplate"]["metadata"]["name"] != first
    exactly = objs["ResourceClaimTemplate"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["selectors"] == [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == "
                                                           "'H200'"}}]
