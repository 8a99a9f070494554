"""values.schema.json types and describes every value, and every ci values file meets it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.chart.k8s_tools import CHART, CI_VALUES

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def merged(overrides: dict[str, Any]) -> dict[str, Any]:
    """values.yaml with a values file on top, as helm merges them (maps deep, everything else replaced)."""
    def merge(base: Any, top: Any) -> Any:
        if isinstance(base, dict) and isinstance(top, dict):
            return {k: merge(base[k], v) if k in base else v for k, v in top.items()} | {
                k: v for k, v in base.items() if k not in top}
        return top
    return merge(copy.deepcopy(DEFAULTS), overrides)


def validator() -> jsonschema.Draft7Validator:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    return jsonschema.Draft7Validator(SCHEMA)


def test_default_values_meet_the_schema() -> None:
    assert list(validator().iter_errors(DEFAULTS)) == []


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_ci_values_meet_the_schema(values: Path) -> None:
    errors = [e.message for e in validator().iter_errors(merged(yaml.safe_load(values.read_text())))]
    assert errors == []


def _schema_nodes(schema: dict[str, Any], values: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, schema node) for every key present in `values`, recursively (free-form maps are leaves)."""
    out = [(path, schema)]
    if isinstance(values, dict) and "properties" in schema:
        for key, value in values.items():
            assert key in schema.get("properties", {}), f"{path}.{key} is not in values.schema.json"
            out += _schema_nodes(schema["properties"][key], value, f"{path}.{key}")
    return out


def test_every_default_value_is_typed_and_described() -> None:
    for path, node in _schema_nodes(SCHEMA, DEFAULTS, "")[1:]:
        assert node.get("type"), f"{path} has no type"
        assert len(node.get("description", "")) > 10, f"{path} has no description"


@pytest.mark.parametrize(("path", "value"), [
    (("deployment", "spec", "target", "dtype"), "fp8"),
    (("deployment", "spec", "gpu", "mode"), "mig"),
    (("policy", "spec", "k", "initial"), 32),
    (("policy", "spec", "mode"), "fast"),
    (("images", "worker", "pullPolicy"), "Sometimes"),
    (("test", "maxTokens"), 0),
])
def test_schema_rejects_bad_values(path: tuple[str, ...], value: Any) -> None:
    values = merged(yaml.safe_load((CHART / "ci" / "cpu-values.yaml").read_text()))
    node = values
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    assert list(validator().iter_errors(values)), f"{'.'.join(path)}={value!r} was accepted"


def test_enabled_deployment_needs_target_and_draft() -> None:
    values = merged({"deployment": {"enabled": True, "spec": {"target": {"model": {"bundled": "tiny-target"}}}}})
    messages = [e.message for e in validator().iter_errors(values)]
    assert messages == ["'draft' is a required property"]
