"""The chart passes deployment.spec.batchManager.prefixCaching and maxNumBatchedTokens through to its
MineDraftDeployment (checked by values.schema.json), and the operator turns them into the batch manager's env."""

from __future__ import annotations

from pathlib import Path

import pytest

from minedraft_operator.render import render
from tests.chart.k8s_tools import CHART, Manifest, helm_template, one, run
from tests.chart.test_example_resources import admitted

CPU_VALUES = CHART / "ci" / "cpu-values.yaml"
BM = "deployment.spec.batchManager"


def manager_env(crds: dict[str, Manifest], mdd: Manifest) -> dict[str, str]:
    pod = one(render(admitted(crds, mdd)), "Deployment")["spec"]["template"]["spec"]
    (bm,) = [c for c in pod["containers"] if c["name"] == "batch-manager"]
    return {e["name"]: e.get("value", "<from>") for e in bm["env"]}


def test_values_reach_the_resource_and_the_batch_manager(helm: Path, crds: dict[str, Manifest]) -> None:
    manifests = helm_template(helm, CHART, [CPU_VALUES],
                              sets=[f"{BM}.prefixCaching=false", f"{BM}.maxNumBatchedTokens=512"])
    mdd = one(manifests, "MineDraftDeployment")
    assert {k: mdd["spec"]["batchManager"][k] for k in ("prefixCaching", "maxNumBatchedTokens")} == {
        "prefixCaching": False, "maxNumBatchedTokens": 512}
    e = manager_env(crds, mdd)
    assert (e["MINEDRAFT_ENABLE_PREFIX_CACHING"], e["MINEDRAFT_MAX_NUM_BATCHED_TOKENS"]) == ("0", "512")


def test_unset_values_leave_the_crd_defaults(rendered: dict[str, list[Manifest]], crds: dict[str, Manifest]) -> None:
    mdd = one(rendered["cpu-values.yaml"], "MineDraftDeployment")
    assert not {"prefixCaching", "maxNumBatchedTokens"} & set(mdd["spec"]["batchManager"])
    bm = admitted(crds, mdd)["spec"]["batchManager"]
    assert (bm["prefixCaching"], bm["maxNumBatchedTokens"]) == (True, 0)
    assert not {"MINEDRAFT_ENABLE_PREFIX_CACHING", "MINEDRAFT_MAX_NUM_BATCHED_TOKENS"} & set(manager_env(crds, mdd))


@pytest.mark.parametrize("bad", [f"{BM}.maxNumBatchedTokens=-1", f"{BM}.prefixCaching=yes"])
def test_lint_rejects_what_the_crd_rejects(bad: str, helm: Path) -> None:
    result = run([helm, "lint", CHART, "--values", CPU_VALUES, "--set", bad], check=False)
    assert result.returncode != 0, f"helm lint accepted {bad}"
    assert "schema" in result.stdout + result.stderr
