"""Schema defaults applied the way the API server applies them to a custom resource.

The renderer reads specs through this, so a spec stored before a default existed (or served by
an API emulator that does no defaulting) renders exactly as a freshly admitted one.
"""

from __future__ import annotations

import copy
from typing import Any


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """A copy of `value` with every missing property that has a `default` filled in, recursively."""
    if isinstance(value, dict):
        out = dict(value)
        props: dict[str, Any] = schema.get("properties", {})
        for name, sub in props.items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(sub, out[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in out:
                if name not in props:
                    out[name] = apply_defaults(extra, out[name])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in value]
    return value
