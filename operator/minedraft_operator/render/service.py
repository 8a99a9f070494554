"""The Service in front of the batch managers (public gRPC and HTTP only; the admin port stays private)."""

from __future__ import annotations

from typing import Any

from minedraft_operator.render.names import BATCH_MANAGER, metadata, selector
from minedraft_operator.spec import DeploymentSpec


def service(spec: DeploymentSpec) -> dict[str, Any]:
    svc = spec.service
    meta = metadata(spec, spec.name, BATCH_MANAGER)
    if svc.get("annotations"):
        meta["annotations"] = dict(svc["annotations"])
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": svc["type"],
            "selector": selector(spec),
            "ports": [
                {"name": "grpc", "port": svc["grpcPort"], "targetPort": "grpc", "protocol": "TCP",
                 "appProtocol": "kubernetes.io/h2c"},
                {"name": "http", "port": svc["httpPort"], "targetPort": "http", "protocol": "TCP",
                 "appProtocol": "http"},
            ],
        },
    }
