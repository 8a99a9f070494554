"""Small builders for OpenAPI v3 (structural) schema nodes, so the CRDs read like their spec.

Every node carries a description because `kubectl explain` shows it; `rule` builds a CEL
`x-kubernetes-validations` entry (plain CEL only: the tests evaluate them with cel-python).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Schema = dict[str, Any]


def rule(expression: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": expression, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def obj(
    description: str,
    properties: Mapping[str, Schema],
    *,
    required: Iterable[str] = (),
    rules: Iterable[dict[str, str]] = (),
    default: dict[str, Any] | None = None,
) -> Schema:
    node: Schema = {"type": "object", "description": description, "properties": dict(properties)}
    if required:
        node["required"] = list(required)
    if default is not None:
        node["default"] = default
    rules = list(rules)
    if rules:
        node["x-kubernetes-validations"] = rules
    return node


def string(
    description: str,
    *,
    enum: Iterable[str] | None = None,
    default: str | None = None,
    pattern: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
) -> Schema:
    node: Schema = {"type": "string", "description": description}
    if enum is not None:
        node["enum"] = list(enum)
    if default is not None:
        node["default"] = default
    if pattern is not None:
        node["pattern"] = pattern
    if min_length is not None:
        node["minLength"] = min_length
    if max_length is not None:
        node["maxLength"] = max_length
    return node


def integer(description: str, *, minimum: int | None = None, maximum: int | None = None,
            default: int | None = None) -> Schema:
    node: Schema = {"type": "integer", "description": description}
    if minimum is not None:
        node["minimum"] = minimum
    if maximum is not None:
        node["maximum"] = maximum
    if default is not None:
        node["default"] = default
    return node


def number(description: str, *, minimum: float | None = None, maximum: float | None = None,
           default: float | None = None) -> Schema:
    node: Schema = {"type": "number", "description": description}
    if minimum is not None:
        node["minimum"] = minimum
    if maximum is not None:
        node["maximum"] = maximum
    if default is not None:
        node["default"] = default
    return node


def boolean(description: str, *, default: bool | None = None) -> Schema:
    node: Schema = {"type": "boolean", "description": description}
    if default is not None:
        node["default"] = default
    return node


def array(description: str, items: Schema, *, max_items: int | None = None) -> Schema:
    node: Schema = {"type": "array", "description": description, "items": items}
    if max_items is not None:
        node["maxItems"] = max_items
    return node


def string_map(description: str) -> Schema:
    return {"type": "object", "description": description, "additionalProperties": {"type": "string"}}


QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"


def quantity(description: str, *, default: str | None = None) -> Schema:
    """A Kubernetes resource quantity ("8Gi", "500m", 2)."""
    node: Schema = {"description": description, "x-kubernetes-int-or-string": True,
                    "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY_PATTERN}
    if default is not None:
        node["default"] = default
    return node


def free_form(description: str) -> Schema:
    """An object passed through to a Kubernetes field as it is (e.g. affinity)."""
    return {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}
