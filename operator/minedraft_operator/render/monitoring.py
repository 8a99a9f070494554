"""The PodMonitor (spec.podMonitor) a Prometheus Operator scrapes this deployment's serving pods through.

It selects exactly the Deployment's pods (its selector, with the `server` component, never the operator's)
and scrapes `/metrics` on the container port named `http`, where the batch manager serves vllm:* and
minedraft:* metrics.
"""

from __future__ import annotations

from typing import Any

from minedraft_operator.render.names import metadata, selector
from minedraft_operator.render.routing import HTTP_PORT_NAME
from minedraft_operator.spec import DeploymentSpec

MONITOR_API_VERSION = "monitoring.coreos.com/v1"
MONITOR_PLURAL = "podmonitors"


def monitor_enabled(spec: DeploymentSpec) -> bool:
    return bool(spec.raw["podMonitor"]["enabled"])


def pod_monitor(spec: DeploymentSpec) -> dict[str, Any]:
    return {
        "apiVersion": MONITOR_API_VERSION,
        "kind": "PodMonitor",
        "metadata": metadata(spec, spec.name, "pod-monitor"),
        "spec": {
            "selector": {"matchLabels": selector(spec)},
            "podMetricsEndpoints": [{"port": HTTP_PORT_NAME, "path": "/metrics"}],
        },
    }
