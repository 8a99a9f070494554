"""Rollout controls and shutdown timing: the relations between preStop, drain, grace, startup and progress."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from minedraft_operator.render import render
from minedraft_operator.render.timing import EXIT_MARGIN_S
from minedraft_operator.rollout_status import rollout_status
from tests.operator.admission import admit


def deployment_of(mdd: dict[str, Any], **spec: Any) -> dict[str, Any]:
    mdd = copy.deepcopy(mdd)
    mdd["spec"].update(spec)
    return next(o for o in render(mdd) if o["kind"] == "Deployment")


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def probe_budget(probe: dict[str, Any]) -> int:
    return int(probe["periodSeconds"] * probe["failureThreshold"])


@pytest.mark.parametrize(("pre_stop", "drain", "startup"),
                         [(0, 0, 30), (15, 30, 1800), (60, 300, 3600), (5, 120, 600), (30, 0, 3600)])
def test_timing_relations_hold(pre_stop: int, drain: int, startup: int, gpu_mdd, mdd_crd) -> None:
    spec = {"preStopSeconds": pre_stop, "drainSeconds": drain, "startupSeconds": startup}
    mdd = copy.deepcopy(gpu_mdd)
    mdd["spec"].update(spec)
    assert admit(mdd_crd, mdd)[1] == []
    d = deployment_of(gpu_mdd, **spec)
    grace = d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    cs = containers(d)
    bm = cs["batch-manager"]
    # The kubelet kills only after preStop + drain + a margin for the exit.
    assert grace >= pre_stop + drain + EXIT_MARGIN_S > pre_stop + drain
    assert bm.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0) == pre_stop
    assert int(env(bm)["MINEDRAFT_DRAIN_GRACE_S"]) == drain
    for name in ("verifier", "verifier-tp1", "draft"):
        worker = env(cs[name])
        if "MINEDRAFT_DRAIN_GRACE_S" in worker:  # the workers serve the manager through its preStop and drain
            assert int(worker["MINEDRAFT_DRAIN_GRACE_S"]) == pre_stop + drain < grace
    # Startup probes give the model its load budget; the rollout's deadline covers a stop, a load and a pull.
    for c in cs.values():
        if "startupProbe" in c:
            assert probe_budget(c["startupProbe"]) >= startup
    deadline = d["spec"]["progressDeadlineSeconds"]
    assert deadline > grace + startup
    assert deadline > max(probe_budget(c["startupProbe"]) for c in cs.values() if "startupProbe" in c)
    assert kubernetes_validate.validate(d, "1.34.0", strict=True)


def test_defaults_no_surge_one_down_and_the_anchors_prestop(gpu_mdd, mdd_crd) -> None:
    admitted, errors = admit(mdd_crd, gpu_mdd)
    assert errors == []
    spec = admitted["spec"]
    assert (spec["rollout"], spec["preStopSeconds"]) == ({"maxSurge": 0, "maxUnavailable": 1}, 15)
    d = deployment_of(gpu_mdd)
    assert d["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_surge_keeps_a_single_replica_serving(gpu_mdd, mdd_crd) -> None:
    rollout = {"maxSurge": 1, "maxUnavailable": 0}
    mdd = copy.deepcopy(gpu_mdd)
    mdd["spec"]["rollout"] = rollout
    assert admit(mdd_crd, mdd)[1] == []
    assert deployment_of(gpu_mdd, rollout=rollout)["spec"]["strategy"]["rollingUpdate"] == rollout


def test_prestop_zero_renders_no_hook(gpu_mdd) -> None:
    assert "lifecycle" not in containers(deployment_of(gpu_mdd, preStopSeconds=0))["batch-manager"]


def test_rollout_status_copies_the_deployment() -> None:
    assert rollout_status(None)[1]["reason"] == "DeploymentNotFound"
    d = {"metadata": {"generation": 3},
         "status": {"observedGeneration": 3, "updatedReplicas": 1, "availableReplicas": 2, "conditions": [
             {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
             {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
              "message": 'ReplicaSet "x-1" is progressing.'}]}}
    fields, cond = rollout_status(d)
    assert fields == {"updatedReplicas": 1, "availableReplicas": 2}
    assert cond == {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                    "message": 'ReplicaSet "x-1" is progressing.'}
    stalled = copy.deepcopy(d)
    stalled["status"]["conditions"][1].update(status="False", reason="ProgressDeadlineExceeded")
    assert rollout_status(stalled)[1]["status"] == "False"
    behind = copy.deepcopy(d)
    behind["metadata"]["generation"] = 4  # the controller has not seen the new template yet
    assert rollout_status(behind)[1]["reason"] == "DeploymentPending"
    assert rollout_status({"metadata": {}, "status": {}})[1]["status"] == "True"  # observedGeneration 0 < 1


def test_printer_columns_show_the_rollout(mdd_crd) -> None:
    columns = {c["name"]: c["jsonPath"] for c in mdd_crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Updated"] == ".status.updatedReplicas"
    assert columns["Available"] == ".status.availableReplicas"
    assert "Progressing" in columns["Progressing"]
