"""The containers of a serving pod: verifier ranks, draft, batch manager (commands, env, probes)."""

from __future__ import annotations

import math
from typing import Any

from minedraft_operator.policy import default_policy_env
from minedraft_operator.render.gpu import GpuSlot, layout
from minedraft_operator.render.key_files import key_mounts
from minedraft_operator.render.names import BATCH_MANAGER, DRAFT
from minedraft_operator.render.timing import drain_s, pre_stop_s, worker_drain_s
from minedraft_operator.spec import DeploymentSpec, Worker

HOME = "/home/minedraft"
LOCALHOST = "127.0.0.1"
ANY = "0.0.0.0"
PROBE_PERIOD_S = 10
# A worker's control port (and the verifier's data-plane store) listen on loopback: only the
# pod's own batch manager reaches them. The kubelet's gRPC probes go to the pod IP, so each
# worker also answers grpc.health.v1, and nothing else, on its control port + this offset.
HEALTH_PORT_OFFSET = 1000


def env_list(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def health_port(spec: DeploymentSpec, control_port: int) -> int:
    """The worker's health-only port: control port + HEALTH_PORT_OFFSET, moved on by the offset
    again while it would clash with a port of the pod."""
    taken = {*spec.ports.values(), spec.service["grpcPort"], spec.service["httpPort"]}
    port = control_port + HEALTH_PORT_OFFSET
    while port in taken:
        port += HEALTH_PORT_OFFSET
    return port


def _grpc_probes(port: int, startup_s: int) -> dict[str, Any]:
    """The health port answers grpc.health.v1 SERVING once the model is loaded, NOT_SERVING while the
    worker drains (it keeps serving its batch manager until that closes the stream, then exits 0)."""
    grpc = {"port": port, "service": ""}
    return {
        "startupProbe": {"grpc": grpc, "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 5,
                         "failureThreshold": math.ceil(startup_s / PROBE_PERIOD_S)},
        "livenessProbe": {"grpc": grpc, "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
    }


def _mounts(spec: DeploymentSpec, models: list[Worker], shm: bool) -> list[dict[str, Any]]:
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": HOME}]
    if shm:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    for worker in models:
        if worker.model.volume_name:
            mounts.append({"name": worker.model.volume_name, "mountPath": worker.model.mount_path, "readOnly": True})
    return mounts


def _resources(worker_resources: dict[str, Any], slot: GpuSlot | None) -> dict[str, Any]:
    out = {k: dict(v) for k, v in worker_resources.items() if k in ("requests", "limits")}
    if slot is not None and slot.limits:
        out["limits"] = {**out.get("limits", {}), **slot.limits}
    if slot is not None and slot.claims:
        out["claims"] = list(slot.claims)
    return out


def _base(spec: DeploymentSpec, name: str, image: str, role: str) -> dict[str, Any]:
    return {"name": name, "image": image, "imagePullPolicy": spec.images["pullPolicy"],
            "command": ["minedraft"], "args": [role], "securityContext": security_context(),
            "terminationMessagePolicy": "FallbackToLogsOnError"}


def _worker_env(spec: DeploymentSpec, worker: Worker, slot: GpuSlot, port: int) -> dict[str, str]:
    env = {"MINEDRAFT_MODEL": worker.model.folder(spec.images["bundledModelsDir"]),
           "MINEDRAFT_HOST": LOCALHOST, "MINEDRAFT_PORT": str(port),  # pod-local: control port, data-plane store
           "MINEDRAFT_HEALTH_HOST": ANY, "MINEDRAFT_HEALTH_PORT": str(health_port(spec, port)),
           # Serve the batch manager through its preStop and drain, then exit 0.
           "MINEDRAFT_DRAIN_GRACE_S": str(worker_drain_s(spec)),
           "MINEDRAFT_DEVICE": slot.device, "MINEDRAFT_DTYPE": worker.dtype, "HOME": HOME, "PYTHONUNBUFFERED": "1"}
    env.update({f"MINEDRAFT_{k}": str(v) for k, v in worker.tuning.items()})
    env.update(slot.env)
    return env


def verifier_containers(spec: DeploymentSpec) -> list[dict[str, Any]]:
    ports = spec.ports
    tp = spec.target.tp_size
    slots = layout(spec)[:tp]
    out = []
    for rank, slot in enumerate(slots):
        c = _base(spec, slot.container, spec.images["worker"], "verifier")
        env = _worker_env(spec, spec.target, slot, ports["verifier"])
        env.update({"MINEDRAFT_TP_SIZE": str(tp), "MINEDRAFT_TP_RANK": str(rank),
                    "MINEDRAFT_TP_ADDR": f"{LOCALHOST}:{ports['tensorParallel']}",
                    "MINEDRAFT_DATA_PORT": str(ports["dataPlane"])})
        stand_in = rank == 0 and spec.draft_stand_in  # drafts while the draft service is lost
        if stand_in:
            env["MINEDRAFT_COLOCATED_DRAFT"] = spec.draft.model.folder(spec.images["bundledModelsDir"])
        # Every rank runs the forwards that capture what the head reads (their all-reduces must match); rank 0
        # keeps the states and sends them
        eagle = spec.draft_kind == "eagle"
        if eagle:
            env.update({"MINEDRAFT_DRAFT_KIND": "eagle",
                        "MINEDRAFT_DRAFT_HEAD": spec.draft.model.folder(spec.images["bundledModelsDir"])})
        c["env"] = env_list(env)
        c["resources"] = _resources(spec.target.resources, slot)
        c["volumeMounts"] = _mounts(spec, [spec.target, spec.draft] if stand_in or eagle else [spec.target], shm=True)
        if rank == 0:  # only rank 0 serves the control plane; the others follow it over the TP group
            health = health_port(spec, ports["verifier"])
            c["ports"] = [{"name": "verifier-ctl", "containerPort": ports["verifier"], "protocol": "TCP"},
                          {"name": "verifier-health", "containerPort": health, "protocol": "TCP"}]
            c.update(_grpc_probes(health, spec.raw["startupSeconds"]))
        out.append(c)
    return out


def draft_container(spec: DeploymentSpec) -> dict[str, Any]:
    slot = layout(spec)[-1]
    port = spec.ports["draft"]
    c = _base(spec, DRAFT, spec.images["worker"], "draft")
    env = _worker_env(spec, spec.draft, slot, port)
    eagle = spec.draft_kind == "eagle"  # the head shares the target's embedding and lm_head by copy
    if eagle:
        env.update({"MINEDRAFT_DRAFT_KIND": "eagle",
                    "MINEDRAFT_TARGET_MODEL": spec.target.model.folder(spec.images["bundledModelsDir"])})
    if spec.ready_without_draft:  # the process restarts the draft service itself: see worker/supervisor.py
        env.update({"MINEDRAFT_SUPERVISE": "1", "MINEDRAFT_STARTUP_S": str(spec.raw["startupSeconds"])})
    c["env"] = env_list(env)
    health = health_port(spec, port)
    c["ports"] = [{"name": "draft-ctl", "containerPort": port, "protocol": "TCP"},
                  {"name": "draft-health", "containerPort": health, "protocol": "TCP"}]
    c["resources"] = _resources(spec.draft.resources, slot)
    c["volumeMounts"] = _mounts(spec, [spec.draft, spec.target] if eagle else [spec.draft], shm=True)
    c.update(_grpc_probes(health, spec.raw["startupSeconds"]))
    if spec.ready_without_draft:
        # The startup probe still waits for the first load; after it, a failed liveness probe would restart the
        # container (NotReady meanwhile), which is what the supervisor's own health checks replace.
        del c["livenessProbe"]
    return c


def _manager_env(spec: DeploymentSpec) -> list[dict[str, Any]]:
    ports, service, bm = spec.ports, spec.service, spec.raw["batchManager"]
    env = {
        "MINEDRAFT_HOST": ANY, "MINEDRAFT_GRPC_PORT": str(service["grpcPort"]),
        "MINEDRAFT_HTTP_PORT": str(service["httpPort"]), "MINEDRAFT_ADMIN_PORT": str(ports["admin"]),
        # The operator reaches the admin API on the pod IP; the Service never exposes that port.
        "MINEDRAFT_ADMIN_HOST": ANY, "MINEDRAFT_DRAIN_GRACE_S": str(drain_s(spec)),
        **default_policy_env(),
        "MINEDRAFT_MAX_QUEUE": str(bm["maxQueue"]),
        "MINEDRAFT_STREAM_INTERVAL": str(bm["streamInterval"]),
        "MINEDRAFT_DATA_PLANE_BACKEND": "gloo" if spec.gpu_mode == "none" else "nccl",
        "MINEDRAFT_TOKENIZER": spec.target.model.folder(spec.images["bundledModelsDir"]),
        "MINEDRAFT_VERIFIER_ADDRESS": f"{LOCALHOST}:{ports['verifier']}",
        "MINEDRAFT_DRAFT_ADDRESS": f"{LOCALHOST}:{ports['draft']}",
        "HOME": HOME, "PYTHONUNBUFFERED": "1",
    }
    if bm.get("servedModelName"):
        env["MINEDRAFT_SERVED_MODEL_NAME"] = bm["servedModelName"]
    # Only what differs from the batch manager's own defaults: pods made before these fields existed keep
    # their template, so an operator upgrade rolls no pod.
    if not bm["prefixCaching"]:
        env["MINEDRAFT_ENABLE_PREFIX_CACHING"] = "0"
    if bm["maxNumBatchedTokens"]:
        env["MINEDRAFT_MAX_NUM_BATCHED_TOKENS"] = str(bm["maxNumBatchedTokens"])
    if spec.draft_stand_in:
        env["MINEDRAFT_DRAFT_STAND_IN"] = "1"
    otlp = spec.raw["observability"].get("otlpEndpoint")
    if otlp:
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_SERVICE_NAME": f"minedraft-{spec.name}"})
    # Keys as files of mounted Secrets (re-read when rotated): the admin key always, the public one if set.
    return env_list(env) + [m.env_entry() for m in key_mounts(spec)]


def batch_manager_container(spec: DeploymentSpec) -> dict[str, Any]:
    ports, service = spec.ports, spec.service
    admin = ports["admin"]
    health = {"path": "/health", "port": admin, "scheme": "HTTP"}
    period = 5
    c = _base(spec, BATCH_MANAGER, spec.images["batchManager"], "batch-manager")
    c["env"] = _manager_env(spec)
    c["ports"] = [
        {"name": "grpc", "containerPort": service["grpcPort"], "protocol": "TCP"},
        {"name": "http", "containerPort": service["httpPort"], "protocol": "TCP"},
        {"name": "admin", "containerPort": admin, "protocol": "TCP"},
    ]
    c["resources"] = _resources(spec.raw["batchManager"].get("resources", {}), None)
    c["volumeMounts"] = _mounts(spec, [spec.target], shm=False)  # the tokenizer is the target's
    c["volumeMounts"] += [m.container_mount() for m in key_mounts(spec)]
    # It listens only once both workers answered and the data plane formed: /health = ready. /health
    # turns 503 while the verifier is gone or the pod drains (out of the Service, not restarted);
    # liveness asks only whether the process answers.
    c["startupProbe"] = {"httpGet": health, "periodSeconds": period, "timeoutSeconds": 3,
                         "failureThreshold": math.ceil(spec.raw["startupSeconds"] / period)}
    c["readinessProbe"] = {"httpGet": health, "periodSeconds": period, "timeoutSeconds": 3, "failureThreshold": 2}
    c["livenessProbe"] = {"httpGet": {**health, "path": "/health/live"}, "periodSeconds": 20, "timeoutSeconds": 5,
                          "failureThreshold": 3}
    if pre_stop_s(spec):  # a zero-second sleep action is refused by API servers before 1.33
        c["lifecycle"] = {"preStop": {"sleep": {"seconds": pre_stop_s(spec)}}}
    return c
