"""The CRDs: generated files are current, valid for Kubernetes 1.34, and admit exactly what they should."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from minedraft_operator import rbac
from minedraft_operator.crds import all_crds, dump
from tests.operator.admission import admit, crd_schema

OPERATOR = Path(__file__).resolve().parents[2] / "operator"
K8S_VERSION = "1.34.0"


def test_committed_crds_are_generated_from_the_schema_code() -> None:
    for name, crd in all_crds().items():
        assert (OPERATOR / "crds" / name).read_text() == dump(crd), f"run: python -m minedraft_operator.crds " \
                                                                     f"operator/crds ({name} is stale)"


def test_committed_rbac_rules_are_current() -> None:
    assert (OPERATOR / "rbac" / "rules.yaml").read_text() == rbac.dump()
    assert yaml.safe_load(rbac.dump()) == rbac.RULES


@pytest.mark.parametrize("name", sorted(all_crds()))
def test_crd_passes_strict_kubernetes_validation(name: str) -> None:
    assert kubernetes_validate.validate(all_crds()[name], K8S_VERSION, strict=True) == "1.34"


def _walk(schema: dict[str, Any], path: str):
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", sorted(all_crds()))
def test_schema_is_structural_and_explained(name: str) -> None:
    """The API server refuses non-structural schemas; `kubectl explain` needs descriptions."""
    for path, node in _walk(crd_schema(all_crds()[name]), ""):
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed, f"{path} has no type"
        for junctor in ("anyOf", "oneOf", "allOf"):
            for branch in node.get(junctor, []):
                assert set(branch) <= {"type"}, f"{path}: only bare types inside {junctor}"
        if path.count(".") >= 2 and not path.endswith(("{}", "[]")) and ".metadata" not in path:
            assert node.get("description"), f"{path} has no description"


def test_examples_are_admitted_with_defaults(gpu_mdd, cpu_mdd, policy, mdd_crd, specpol_crd) -> None:
    for crd, obj in ((mdd_crd, gpu_mdd), (mdd_crd, cpu_mdd), (specpol_crd, policy)):
        _, errors = admit(crd, obj)
        assert errors == []
    cpu, _ = admit(mdd_crd, cpu_mdd)
    assert cpu["spec"]["target"]["tensorParallelSize"] == 1
    assert cpu["spec"]["ports"] == {"verifier": 50061, "draft": 50062, "tensorParallel": 29650,
                                    "dataPlane": 29651, "admin": 8081}
    assert cpu["spec"]["nccl"]["nvlsEnable"] is False
    assert (cpu["spec"]["networkPolicy"], cpu["spec"]["disruptionBudget"]) == ({"enabled": True},
                                                                              {"enabled": True, "maxUnavailable": 1})
    bare, errors = admit(specpol_crd, {"apiVersion": "minedraft.io/v1alpha1", "kind": "SpeculationPolicy",
                                       "metadata": {"name": "p"}, "spec": {}})
    assert errors == []
    assert bare["spec"]["k"] == {"initial": 4, "min": 1, "max": 8}
    assert bare["spec"]["fallback"]["onLowAcceptance"] == {"minTokensPerStep": 1.3, "probeSteps": 200}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return mutate


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = obj
        for key in parents:
            node = node[key]
        del node[last]
    return mutate


MDD_INVALID = [
    ("two model sources", _set("spec.target.model.hostPath", {"path": "/m"}), "exactly one of pvc"),
    ("no model source", _set("spec.draft.model", {}), "exactly one of pvc"),
    ("tp 0", _set("spec.target.tensorParallelSize", 0), "less than the minimum"),
    ("tp 9", _set("spec.target.tensorParallelSize", 9), "greater than the maximum"),
    ("tp 8 with a draft GPU", _set("spec.target.tensorParallelSize", 8), "a replica must fit on one node"),
    ("bf16 on cpu", _set("spec.gpu", {"mode": "none"}), "dtype must be float32"),
    ("admin port clash", _set("spec.ports.admin", 8000), "all ports of the pod must differ"),
    ("grpc == http", _set("spec.service.grpcPort", 8000), "grpcPort and httpPort must differ"),
    ("no surge, none down", _set("spec.rollout", {"maxSurge": 0, "maxUnavailable": 0}), "cannot both be 0"),
    ("preStop 61", _set("spec.preStopSeconds", 61), "greater than the maximum"),
    ("drain 301", _set("spec.drainSeconds", 301), "greater than the maximum"),
    ("startup 3601", _set("spec.startupSeconds", 3601), "greater than the maximum"),
    ("selectors w/o dra", _set("spec.gpu", {"mode": "devicePlugin", "deviceSelectors": ["true"]}),
     "deviceSelectors need mode dra"),
    ("long name", _set("metadata.name", "x" * 51), "DNS label of at most 50"),
    ("upper-case name", _set("metadata.name", "Llama"), "DNS label of at most 50"),
    ("gpu in resources", _set("spec.draft.resources", {"limits": {"nvidia.com/gpu": 1}}), "GPUs come from spec.gpu"),
    ("relative host path", _set("spec.target.model", {"hostPath": {"path": "models/x"}}), "does not match"),
    ("dotdot in pvc path", _set("spec.target.model.pvc.path", "a/../../etc"), "must not contain '..'"),
    ("unknown field", _set("spec.target.speculate", True), "unknown field"),
    ("bad gpu mode", _set("spec.gpu.mode", "mig"), "is not one of"),
    ("unknown blas", _set("spec.target.blas", "rocblas"), "is not one of"),
    ("bad shm size", _set("spec.sharedMemorySize", "lots"), "does not match"),
    ("no images", _drop("spec.images"), "'images' is a required property"),
    ("negative replicas", _set("spec.replicas", -1), "less than the minimum"),
    ("admin ref w/o name", _set("spec.auth.adminSecretRef", {"key": "k"}), "'name' is a required property"),
    ("empty admin key name", _set("spec.auth.adminSecretRef", {"name": "s", "key": ""}), "should be non-empty"),
    ("budget of 0", _set("spec.disruptionBudget.maxUnavailable", 0), "less than the minimum"),
    ("unknown netpol field", _set("spec.networkPolicy.allowFrom", []), "unknown field"),
    ("negative batched tokens", _set("spec.batchManager.maxNumBatchedTokens", -1), "less than the minimum"),
    ("batched tokens below 16", _set("spec.batchManager.maxNumBatchedTokens", 8), "or at least 16"),
    ("prefix caching not a boolean", _set("spec.batchManager.prefixCaching", "yes"), "is not of type 'boolean'"),
    ("bundled head, kind model", _set("spec.draft.model", {"bundled": "tiny-eagle"}), "tiny-eagle needs kind eagle"),
    ("bundled model, kind eagle", _set("spec.draft", {"kind": "eagle", "model": {"bundled": "tiny-draft"}}),
     "with kind eagle must be the head tiny-eagle"),
    ("bundled head as target", _set("spec.target.model", {"bundled": "tiny-eagle"}), "it is no target"),
    ("unknown bundled model", _set("spec.draft.model", {"bundled": "tiny-medusa"}), "is not one of"),
]

POLICY_INVALID = [
    ("min above initial", _set("spec.k", {"initial": 2, "min": 3, "max": 8}), "min <= initial <= max"),
    ("initial above max", _set("spec.k", {"initial": 9, "min": 1, "max": 8}), "min <= initial <= max"),
    ("k 17", _set("spec.k.max", 17), "greater than the maximum"),
    ("pipeline depth 5", _set("spec.batching.pipelineDepth", 5), "greater than the maximum"),
    ("auto threshold < 1", _set("spec.fallback.onLowAcceptance.minTokensPerStep", 0.5), "less than the minimum"),
    ("bad mode", _set("spec.mode", "turbo"), "is not one of"),
    ("bad fallback", _set("spec.fallback.onDraftFailure", "fail"), "is not one of"),
    ("bad draft selection", _set("spec.draftSelection.strategy", "eagle"), "is not one of"),
    ("9 extra drafts", _set("spec.draftSelection.extraDrafts", 9), "greater than the maximum"),
    ("negative extra drafts", _set("spec.draftSelection.extraDrafts", -1), "less than the minimum"),
    ("min batch 0", _set("spec.draftSelection.minBatch", 0), "less than the minimum"),
]


@pytest.mark.parametrize(("case", "mutate", "message"), MDD_INVALID, ids=[c[0] for c in MDD_INVALID])
def test_deployment_schema_rejects(case, mutate, message, gpu_mdd, mdd_crd) -> None:
    mutate(gpu_mdd)
    _, errors = admit(mdd_crd, gpu_mdd)
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize(("case", "mutate", "message"), POLICY_INVALID, ids=[c[0] for c in POLICY_INVALID])
def test_policy_schema_rejects(case, mutate, message, policy, specpol_crd) -> None:
    mutate(policy)
    _, errors = admit(specpol_crd, policy)
    assert any(message in e for e in errors), errors


def test_every_cel_rule_is_exercised_by_an_invalid_example(mdd_crd, specpol_crd) -> None:
    expected = {m for _, _, m in MDD_INVALID + POLICY_INVALID}
    for crd in (mdd_crd, specpol_crd):
        for path, node in _walk(crd_schema(crd), ""):
            for r in node.get("x-kubernetes-validations", []):
                assert any(m in r["message"] for m in expected), f"{path}: rule {r['rule']!r} has no failing case"
