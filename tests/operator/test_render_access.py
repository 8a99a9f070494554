"""Who may reach a deployment's pods and take them down: the admin key (a Secret, always), the
NetworkPolicy around the admin port, the PodDisruptionBudget; every object valid for Kubernetes 1.34."""

from __future__ import annotations

import base64
from typing import Any

import kubernetes_validate
import pytest

from minedraft_operator.render import OperatorPods, render
from minedraft_operator.render.admin_key import admin_key_ref, generated_secret, new_key, secret_value
from minedraft_operator.render.network import parse_labels
from minedraft_operator.spec import DeploymentSpec


def rendered(mdd: dict[str, Any], operator: OperatorPods | None = None) -> dict[str, dict[str, Any]]:
    mdd["metadata"].update(namespace="ml", uid="1234-uid")
    return {o["kind"]: o for o in render(mdd, operator)}


def manager_env(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (bm,) = [c for c in objs["Deployment"]["spec"]["template"]["spec"]["containers"] if c["name"] == "batch-manager"]
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in bm["env"]}


def test_admin_key_comes_from_the_named_secret(gpu_mdd) -> None:
    gpu_mdd["spec"]["auth"]["adminSecretRef"] = {"name": "ops-keys", "key": "minedraft-admin"}
    env = manager_env(rendered(gpu_mdd))
    assert env["MINEDRAFT_ADMIN_API_KEY"] == {"secretKeyRef": {"name": "ops-keys", "key": "minedraft-admin"}}
    assert env["MINEDRAFT_API_KEY"] == {"secretKeyRef": {"name": "minedraft-api-key", "key": "api-key"}}
    gpu_mdd["spec"]["auth"]["adminSecretRef"] = {"name": "ops-keys"}  # the key defaults
    assert manager_env(rendered(gpu_mdd))["MINEDRAFT_ADMIN_API_KEY"]["secretKeyRef"]["key"] == "admin-api-key"


def test_without_a_ref_the_admin_key_is_the_generated_secret(cpu_mdd) -> None:
    objs = rendered(cpu_mdd)
    assert manager_env(objs)["MINEDRAFT_ADMIN_API_KEY"] == {
        "secretKeyRef": {"name": "tiny-admin-key", "key": "admin-api-key"}}
    assert "MINEDRAFT_API_KEY" not in manager_env(objs)  # the public key stays optional
    spec = DeploymentSpec.from_resource(cpu_mdd)
    value = new_key()
    secret = generated_secret(spec, value)
    assert kubernetes_validate.validate(secret, "1.34.0", strict=True)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "1234-uid" and secret["immutable"] is True
    assert secret_value(secret, admin_key_ref(spec).key) == value and len(value) >= 40 and value != new_key()
    assert secret_value({"data": {"admin-api-key": base64.b64encode(b" \n").decode()}}, "admin-api-key") is None


def test_network_policy_lets_only_the_operator_reach_the_admin_port(gpu_mdd) -> None:
    gpu_mdd["spec"]["ports"] = {"admin": 9091}
    operator = OperatorPods("platform", parse_labels("app.kubernetes.io/name=minedraft,team=ml-infra"))
    objs = rendered(gpu_mdd, operator)
    policy = objs["NetworkPolicy"]
    assert kubernetes_validate.validate(policy, "1.34.0", strict=True)
    assert policy["spec"]["podSelector"] == objs["Deployment"]["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admin_rule, open_rule = policy["spec"]["ingress"]
    assert admin_rule == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "platform"}},
                                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "minedraft",
                                                                    "team": "ml-infra"}}}],
                          "ports": [{"protocol": "TCP", "port": 9091}]}
    # Every other port a pod serves on its IP stays open to all: public gRPC/HTTP, the workers' health ports.
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    declared = {p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
    loopback = {50061, 50062}  # the workers' control ports listen on 127.0.0.1 only
    assert "from" not in open_rule
    assert {p["port"] for p in open_rule["ports"]} == declared - loopback - {9091} == {50051, 8000, 51061, 51062}


def test_operator_pods_default_to_the_charts_labels_and_read_env() -> None:
    assert OperatorPods.from_env({}) == OperatorPods("minedraft-system", {
        "app.kubernetes.io/name": "minedraft", "app.kubernetes.io/component": "operator"})
    got = OperatorPods.from_env({"MINEDRAFT_OPERATOR_NAMESPACE": "ops",
                                 "MINEDRAFT_OPERATOR_POD_LABELS": "a=b, c=d"})
    assert got == OperatorPods("ops", {"a": "b", "c": "d"})
    with pytest.raises(ValueError, match="not a label"):
        parse_labels("a=b,broken")


def test_disruption_budget_and_the_switches(gpu_mdd) -> None:
    objs = rendered(gpu_mdd)
    budget = objs["PodDisruptionBudget"]
    assert kubernetes_validate.validate(budget, "1.34.0", strict=True)
    assert budget["spec"] == {"selector": objs["Deployment"]["spec"]["selector"], "maxUnavailable": 1,
                              "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    gpu_mdd["spec"]["disruptionBudget"] = {"maxUnavailable": 3}
    assert rendered(gpu_mdd)["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 3
    gpu_mdd["spec"].update(disruptionBudget={"enabled": False}, networkPolicy={"enabled": False})
    assert set(rendered(gpu_mdd)) == {"ResourceClaimTemplate", "Deployment", "Service"}
