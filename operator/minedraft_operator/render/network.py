"""The NetworkPolicy of a MineDraftDeployment's serving pods: the batch manager's admin port (live
policy, /health) accepts connections only from the operator's pods; every other port the pod
exposes (public gRPC and HTTP with /metrics, the workers' health ports) stays open to everyone, as
without the policy. The kubelet's probes come from the node, which NetworkPolicies always allow."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from minedraft_operator.render.containers import health_port
from minedraft_operator.render.names import NAME_LABEL, metadata, selector
from minedraft_operator.spec import DeploymentSpec

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server
OPERATOR_NAMESPACE_ENV = "MINEDRAFT_OPERATOR_NAMESPACE"
OPERATOR_LABELS_ENV = "MINEDRAFT_OPERATOR_POD_LABELS"
DEFAULT_OPERATOR_NAMESPACE = "minedraft-system"
# The chart's operator pods carry these (and instance=<release>, left out so any release matches).
DEFAULT_OPERATOR_LABELS = {NAME_LABEL: "minedraft", "app.kubernetes.io/component": "operator"}


def parse_labels(text: str) -> dict[str, str]:
    """'k=v,k2=v2' -> {k: v, k2: v2} (a label selector of equalities)."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"not a label k=v: {item!r}")
        out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True, slots=True)
class OperatorPods:
    """Where the operator runs and how its pods are labelled: the admin port's only allowed peers."""

    namespace: str = DEFAULT_OPERATOR_NAMESPACE
    labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_OPERATOR_LABELS))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorPods:
        labels = parse_labels(env.get(OPERATOR_LABELS_ENV, "")) or dict(DEFAULT_OPERATOR_LABELS)
        return cls(env.get(OPERATOR_NAMESPACE_ENV) or DEFAULT_OPERATOR_NAMESPACE, labels)


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in sorted(set(ports))]


def network_policy(spec: DeploymentSpec, operator: OperatorPods) -> dict[str, Any]:
    ports, service = spec.ports, spec.service
    open_ports = _tcp(service["grpcPort"], service["httpPort"], health_port(spec, ports["verifier"]),
                      health_port(spec, ports["draft"]))
    from_operator = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator.namespace}},
                     "podSelector": {"matchLabels": dict(operator.labels)}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": metadata(spec, spec.name, "network-policy"),
        "spec": {
            "podSelector": {"matchLabels": selector(spec)},
            "policyTypes": ["Ingress"],  # egress is left alone (models, OTLP, DNS)
            "ingress": [{"from": [from_operator], "ports": _tcp(ports["admin"])}, {"ports": open_ports}],
        },
    }
