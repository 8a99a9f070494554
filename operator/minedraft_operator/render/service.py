"""The Services in front of the batch managers (public gRPC and HTTP only; the admin port stays private).

The ClusterIP Service balances per connection (a gRPC channel or an HTTP keep-alive stays on one pod); the
headless `<name>-pods` lists every ready pod in DNS, so gRPC clients can balance per call (round_robin).
"""

from __future__ import annotations

from typing import Any

from minedraft_operator.render.names import BATCH_MANAGER, metadata, selector
from minedraft_operator.spec import DeploymentSpec

PODS = "pods"  # component label of the headless Service


def _ports(spec: DeploymentSpec) -> list[dict[str, Any]]:
    svc = spec.service
    return [
        {"name": "grpc", "port": svc["grpcPort"], "targetPort": "grpc", "protocol": "TCP",
         "appProtocol": "kubernetes.io/h2c"},
        {"name": "http", "port": svc["httpPort"], "targetPort": "http", "protocol": "TCP", "appProtocol": "http"},
    ]


def service(spec: DeploymentSpec) -> dict[str, Any]:
    svc = spec.service
    meta = metadata(spec, spec.name, BATCH_MANAGER)
    if svc.get("annotations"):
        meta["annotations"] = dict(svc["annotations"])
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"type": svc["type"], "selector": selector(spec), "ports": _ports(spec)}}


def headless_service(spec: DeploymentSpec) -> dict[str, Any]:
    """`<name>-pods`: no virtual IP, one DNS record per ready pod (client-side per-call balancing). Its own
    component label, so a ServiceMonitor that selects the main Service does not scrape every pod twice."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(spec, f"{spec.name}-pods", PODS),
            "spec": {"clusterIP": "None", "selector": selector(spec), "ports": _ports(spec)}}
