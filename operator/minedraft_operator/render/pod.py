"""The serving pod template and the Deployment that keeps `replicas` of it."""

from __future__ import annotations

from typing import Any

from minedraft_operator.render.containers import batch_manager_container, draft_container, verifier_containers
from minedraft_operator.render.gpu import pod_claims
from minedraft_operator.render.key_files import key_mounts
from minedraft_operator.render.names import BATCH_MANAGER, SERVER, labels, metadata, selector
from minedraft_operator.render.timing import progress_deadline_s, strategy, termination_grace_s
from minedraft_operator.spec import DeploymentSpec, ModelSource

RUN_AS = 10001  # the images' non-root user and group
ENGINE_TYPE_LABEL = "llm-d.ai/engine-type"


def _model_volume(source: ModelSource) -> dict[str, Any] | None:
    if source.pvc_claim:
        return {"name": source.volume_name, "persistentVolumeClaim": {"claimName": source.pvc_claim,
                                                                       "readOnly": True}}
    if source.host_path:
        return {"name": source.volume_name, "hostPath": {"path": source.host_path, "type": "Directory"}}
    return None  # bundled: inside the image


def volumes(spec: DeploymentSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(spec.raw["sharedMemorySize"])}},
    ]
    for source in (spec.target.model, spec.draft.model):
        volume = _model_volume(source)
        if volume is not None:
            out.append(volume)
    return out + [m.pod_volume() for m in key_mounts(spec)]


def pod_template(spec: DeploymentSpec) -> dict[str, Any]:
    gpu = spec.raw["gpu"]
    annotations = {"kubectl.kubernetes.io/default-container": BATCH_MANAGER}
    if spec.raw["observability"]["metrics"]:
        annotations.update({"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                            "prometheus.io/port": str(spec.service["httpPort"])})
    pod: dict[str, Any] = {
        "containers": [*verifier_containers(spec), draft_container(spec), batch_manager_container(spec)],
        "volumes": volumes(spec),
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": False,  # the services never call the Kubernetes API
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_s(spec),
    }
    claims = pod_claims(spec)
    if claims:
        pod["resourceClaims"] = claims
    for key in ("nodeSelector", "tolerations", "affinity"):
        if gpu.get(key):
            pod[key] = gpu[key]
    if spec.images.get("pullSecrets"):
        pod["imagePullSecrets"] = [{"name": n} for n in spec.images["pullSecrets"]]
    # The engine label tells llm-d's endpoint picker which metric names to scrape (ours are vLLM's).
    pod_labels = {**labels(spec, SERVER), ENGINE_TYPE_LABEL: "vllm"}
    return {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod}


def deployment(spec: DeploymentSpec) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, spec.name, SERVER),
        "spec": {
            "replicas": spec.raw["replicas"],
            "selector": {"matchLabels": selector(spec)},
            "strategy": strategy(spec),  # spec.rollout; by default no surge (GPUs are rarely spare)
            "progressDeadlineSeconds": progress_deadline_s(spec),
            "template": pod_template(spec),
        },
    }
