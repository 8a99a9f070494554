"""What the API server does to a custom resource on create, offline: defaults, schema, CEL rules.

kubernetes-validate does not know our CRDs and evaluates no CEL, so tests admit objects here:
defaults from the schema, OpenAPI validation with jsonschema, unknown fields rejected (kubectl's
strict field validation), then every `x-kubernetes-validations` rule evaluated with cel-python.
"""

from __future__ import annotations

from typing import Any

import celpy
import jsonschema

from minedraft_operator.defaults import apply_defaults

_cel = celpy.Environment()


def crd_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _unknown_fields(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    errors: list[str] = []
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") or path == ".metadata":
            return []
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            if props is not None and name in props:
                errors += _unknown_fields(props[name], item, f"{path}.{name}")
            elif isinstance(extra, dict):
                errors += _unknown_fields(extra, item, f"{path}.{name}")
            elif props is not None:
                errors.append(f"{path}.{name}: unknown field")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _unknown_fields(schema["items"], item, f"{path}[{i}]")
    return errors


def evaluate_rule(expression: str, value: Any) -> bool:
    program = _cel.program(_cel.compile(expression))
    return bool(program.evaluate({"self": celpy.json_to_cel(value)}))


def _cel_errors(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    errors = [f"{path or '.'}: {r['message']}" for r in schema.get("x-kubernetes-validations", [])
              if not evaluate_rule(r["rule"], value)]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            sub = props.get(name, extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors += _cel_errors(sub, item, f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def admit(crd: dict[str, Any], obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the defaulted object, the reasons the API server would reject it; empty = accepted)."""
    schema = crd_schema(crd)
    defaulted = apply_defaults(schema, obj)
    errors = _unknown_fields(schema, defaulted, "")
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors += [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(defaulted)]
    if not errors:  # the API server runs CEL only on schema-valid objects
        errors += _cel_errors(schema, defaulted, "")
    return defaulted, errors
