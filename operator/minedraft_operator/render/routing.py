"""The InferencePool a gateway balances the serving pods through (spec.routing.inferencePool).

The pool selects exactly the Deployment's pods (its selector, which carries the `server` component, so the
operator's own pods never join) on the port the batch manager's container names `http`: the OpenAI API and
/metrics, which the endpoint picker scrapes for queue depth and KV usage.
"""

from __future__ import annotations

from typing import Any

from minedraft_operator.render.names import metadata, selector
from minedraft_operator.spec import DeploymentSpec

POOL_API_VERSION = "inference.networking.k8s.io/v1"
POOL_PLURAL = "inferencepools"
HTTP_PORT_NAME = "http"


def pool_enabled(spec: DeploymentSpec) -> bool:
    return bool(spec.raw["routing"]["inferencePool"]["enabled"])


def picker_name(spec: DeploymentSpec) -> str:
    return str(spec.raw["routing"]["inferencePool"]["endpointPicker"].get("name") or f"{spec.name}-epp")


def http_container_port(pod_spec: dict[str, Any]) -> int:
    """The containerPort named `http` (the batch manager's OpenAI port), read from the rendered pod."""
    ports = [p["containerPort"] for c in pod_spec["containers"] for p in c.get("ports", [])
             if p.get("name") == HTTP_PORT_NAME]
    if len(ports) != 1:
        raise ValueError(f"expected one container port named {HTTP_PORT_NAME!r}, found {ports}")
    return int(ports[0])


def inference_pool(spec: DeploymentSpec, pod_spec: dict[str, Any]) -> dict[str, Any]:
    picker = spec.raw["routing"]["inferencePool"]["endpointPicker"]
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": metadata(spec, spec.name, "inference-pool"),
        "spec": {
            "selector": {"matchLabels": selector(spec)},
            "targetPorts": [{"number": http_container_port(pod_spec)}],
            "endpointPickerRef": {"group": "", "kind": "Service", "name": picker_name(spec),
                                  "port": {"number": picker["port"]}, "failureMode": picker["failureMode"]},
        },
    }
