"""The charts ship the operator's CRDs and RBAC rules unchanged (and upgradable, kept on uninstall)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import yaml

from tests.chart.k8s_tools import CHART, CRDS_CHART, ROOT, Manifest, helm_template, one

OPERATOR_CRDS = sorted((ROOT / "operator" / "crds").glob("*.yaml"))
OPERATOR_RULES = ROOT / "operator" / "rbac" / "rules.yaml"
CHART_ADDS = {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
              "app.kubernetes.io/component", "app.kubernetes.io/managed-by", "helm.sh/chart"}


def test_crd_copies_are_byte_identical_to_the_operators() -> None:
    assert [p.name for p in OPERATOR_CRDS] == ["minedraft.io_minedraftdeployments.yaml",
                                               "minedraft.io_speculationpolicies.yaml"]
    copies = sorted((CRDS_CHART / "files").glob("*.yaml"))
    assert [p.name for p in copies] == [p.name for p in OPERATOR_CRDS]
    for source, copied in zip(OPERATOR_CRDS, copies, strict=True):
        assert copied.read_bytes() == source.read_bytes(), f"{copied} is stale: run scripts/ci/sync_chart_files.py"


def test_rbac_rules_copy_is_byte_identical_to_the_operators() -> None:
    assert (CHART / "files" / "rbac-rules.yaml").read_bytes() == OPERATOR_RULES.read_bytes()


def test_sync_script_reports_nothing_stale() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "ci" / "sync_chart_files.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_crds_are_the_operators_plus_labels_and_keep(crds: dict[str, Manifest]) -> None:
    for source in OPERATOR_CRDS:
        expected = yaml.safe_load(source.read_text())
        rendered = copy.deepcopy(crds[expected["spec"]["names"]["kind"]])
        meta = rendered["metadata"]
        assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
        added = set(meta["labels"]) - set(expected["metadata"].get("labels", {}))
        assert added == CHART_ADDS
        for key in added:
            del meta["labels"][key]
        assert rendered == expected


def test_crds_without_keep_when_asked(helm: Path) -> None:
    for crd in helm_template(helm, CRDS_CHART, sets=["keepOnUninstall=false"]):
        assert "annotations" not in crd["metadata"]


def test_cluster_role_rules_equal_the_operators(rendered: dict[str, list[Manifest]]) -> None:
    expected = yaml.safe_load(OPERATOR_RULES.read_text())
    assert one(rendered["default"], "ClusterRole")["rules"] == expected
    binding = one(rendered["default"], "ClusterRoleBinding")
    account = one(rendered["default"], "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": account["namespace"]}]


def test_namespaced_mode_splits_the_same_rules(helm: Path) -> None:
    manifests = helm_template(helm, CHART, sets=["operator.watchNamespaces={serving}"])
    expected = yaml.safe_load(OPERATOR_RULES.read_text())
    split = one(manifests, "ClusterRole")["rules"] + one(manifests, "Role")["rules"]
    assert sorted(map(repr, split)) == sorted(map(repr, expected))
