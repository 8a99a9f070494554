"""The standard condition list (metav1.Condition) as a schema node."""

from __future__ import annotations

from collections.abc import Iterable

from minedraft_operator.crds.schema import Schema, array, integer, obj, string


def conditions(types: Iterable[str]) -> Schema:
    condition = obj(
        "A metav1.Condition.",
        {
            "type": string(f"Condition type: {', '.join(types)}.", max_length=316),
            "status": string("True, False or Unknown.", enum=("True", "False", "Unknown")),
            "reason": string("CamelCase reason.", max_length=1024),
            "message": string("Human-readable detail.", max_length=32768),
            "observedGeneration": integer("metadata.generation the condition was computed from.", minimum=0),
            "lastTransitionTime": {"type": "string", "format": "date-time",
                                   "description": "When status last changed."},
        },
        required=["type", "status", "lastTransitionTime", "reason", "message"],
    )
    node = array("Standard conditions.", condition)
    node["x-kubernetes-list-type"] = "map"
    node["x-kubernetes-list-map-keys"] = ["type"]
    return node
