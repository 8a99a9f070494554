"""Who may reach a deployment's pods and take them down: the admin key (a Secret, always), the
NetworkPolicy around the admin port, the PodDisruptionBudget; every object valid for Kubernetes 1.34."""

from __future__ import annotations

import base64
from typing import Any

import kubernetes_validate
import pytest

from minedraft_operator.render import OperatorPods, render
from minedraft_operator.render.admin_key import admin_key_ref, generated_secret, new_key, secret_keys
from minedraft_operator.render.network import parse_labels
from minedraft_operator.spec import DeploymentSpec


def rendered(mdd: dict[str, Any], operator: OperatorPods | None = None) -> dict[str, dict[str, Any]]:
    mdd["metadata"].update(namespace="ml", uid="1234-uid")
    return {o["kind"]: o for o in render(mdd, operator)}


def manager_env(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in batch_manager(objs)["env"]}


def batch_manager(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (bm,) = [c for c in objs["Deployment"]["spec"]["template"]["spec"]["containers"] if c["name"] == "batch-manager"]
    return bm


def key_volumes(objs: dict[str, dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Volume name -> (its Secret source, the batch manager's mount of it), for Secret volumes."""
    mounts = {m["name"]: m for m in batch_manager(objs)["volumeMounts"]}
    return {v["name"]: (v["secret"], mounts[v["name"]])
            for v in objs["Deployment"]["spec"]["template"]["spec"]["volumes"] if "secret" in v}


def test_keys_are_files_of_mounted_secrets_not_env(gpu_mdd) -> None:
    """A mounted Secret is updated in place by the kubelet (an env var is not): the batch manager gets
    each key as a read-only directory with one file, named by MINEDRAFT_*_API_KEY_FILE."""
    gpu_mdd["spec"]["auth"]["adminSecretRef"] = {"name": "ops-keys", "key": "minedraft-admin"}
    objs = rendered(gpu_mdd)
    assert kubernetes_validate.validate(objs["Deployment"], "1.34.0", strict=True)
    env = manager_env(objs)
    assert env["MINEDRAFT_ADMIN_API_KEY_FILE"] == "/etc/minedraft/admin-key/key"
    assert env["MINEDRAFT_API_KEY_FILE"] == "/etc/minedraft/api-key/key"
    assert not {"MINEDRAFT_ADMIN_API_KEY", "MINEDRAFT_API_KEY"} & env.keys()
    assert not any("valueFrom" in e for e in batch_manager(objs)["env"])
    assert key_volumes(objs) == {
        "admin-key": ({"secretName": "ops-keys", "defaultMode": 0o440,
                       "items": [{"key": "minedraft-admin", "path": "key"}]},
                      {"name": "admin-key", "mountPath": "/etc/minedraft/admin-key", "readOnly": True}),
        "api-key": ({"secretName": "minedraft-api-key", "defaultMode": 0o440,
                     "items": [{"key": "api-key", "path": "key"}]},
                    {"name": "api-key", "mountPath": "/etc/minedraft/api-key", "readOnly": True}),
    }
    for mount in batch_manager(objs)["volumeMounts"]:
        assert "subPath" not in mount  # a subPath mount never sees the kubelet's update
    others = [c for c in objs["Deployment"]["spec"]["template"]["spec"]["containers"] if c["name"] != "batch-manager"]
    assert all(m["name"] not in ("admin-key", "api-key") for c in others for m in c["volumeMounts"])
    gpu_mdd["spec"]["auth"]["adminSecretRef"] = {"name": "ops-keys"}  # the key defaults
    assert key_volumes(rendered(gpu_mdd))["admin-key"][0]["items"] == [{"key": "admin-api-key", "path": "key"}]


def test_without_a_ref_the_admin_key_is_the_generated_secret(cpu_mdd) -> None:
    objs = rendered(cpu_mdd)
    assert key_volumes(objs)["admin-key"][0]["secretName"] == "tiny-admin-key"
    assert "api-key" not in key_volumes(objs)  # the public key stays optional
    assert "MINEDRAFT_API_KEY_FILE" not in manager_env(objs) and "MINEDRAFT_ADMIN_API_KEY_FILE" in manager_env(objs)
    spec = DeploymentSpec.from_resource(cpu_mdd)
    value = new_key()
    secret = generated_secret(spec, value)
    assert kubernetes_validate.validate(secret, "1.34.0", strict=True)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "1234-uid" and secret["immutable"] is True
    assert secret_keys(secret, admin_key_ref(spec).key) == (value,) and len(value) >= 40 and value != new_key()
    assert secret_keys({"data": {"admin-api-key": base64.b64encode(b" \n").decode()}}, "admin-api-key") == ()


def test_a_secret_in_rotation_yields_every_key_new_first() -> None:
    """Read as the batch manager reads its key file: lines or commas, # comments."""
    text = b"# rotating: new first\nnew-key-1\n  old-key-0 \n\n"
    assert secret_keys({"data": {"k": base64.b64encode(text).decode()}}, "k") == ("new-key-1", "old-key-0")
    assert secret_keys({"data": {"k": base64.b64encode(b"a,b").decode()}}, "k") == ("a", "b")
    assert secret_keys({"data": {}}, "k") == ()


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
