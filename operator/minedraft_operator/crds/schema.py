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


def _node(kind: str, description: str, **keywords: Any) -> Schema:
    """A node of `kind`; keywords left at None are not part of the schema (in the order given)."""
    return {"type": kind, "description": description, **{k: v for k, v in keywords.items() if v is not None}}


def string(
    description: str,
    *,
    enum: Iterable[str] | None = None,
    default: str | None = None,
    pattern: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
) -> Schema:
    return _node("string", description, enum=None if enum is None else list(enum), default=default,
                 pattern=pattern, minLength=min_length, maxLength=max_length)


def integer(description: str, *, minimum: int | None = None, maximum: int | None = None,
            default: int | None = None) -> Schema:
    return _node("integer", description, minimum=minimum, maximum=maximum, default=default)


def number(description: str, *, minimum: float | None = None, maximum: float | None = None,
           default: float | None = None) -> Schema:
    return _node("number", description, minimum=minimum, maximum=maximum, default=default)


def boolean(description: str, *, default: bool | None = None) -> Schema:
    return _node("boolean", description, default=default)


def array(description: str, items: Schema, *, max_items: int | None = None) -> Schema:
    return _node("array", description, items=items, maxItems=max_items)


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
