"""A Secret volume laid out as the kubelet lays it out, and updated as the kubelet updates it.

The kubelet writes a Secret's keys into a fresh timestamped folder, points `..data` at it with an
atomic rename of a symlink, and each key is a symlink `<path> -> ..data/<path>`; an update writes a
new folder and swaps `..data`, so a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Any

_generation = itertools.count()


def project(volume: dict[str, Any], data: dict[str, str]) -> dict[str, str]:
    """File path -> content for a `secret` volume source (`items` picks and renames keys)."""
    items = volume["secret"].get("items")
    if items is None:
        return dict(data)
    missing = [i["key"] for i in items if i["key"] not in data]
    if missing:  # the kubelet keeps the pod from starting (unless the volume is optional)
        raise ValueError(f"Secret {volume['secret']['secretName']!r} lacks keys {missing}")
    return {i["path"]: data[i["key"]] for i in items}


def write(folder: Path, files: dict[str, str], mode: int = 0o440) -> None:
    """Create or update the volume in `folder` atomically, as the kubelet's atomic writer does."""
    folder.mkdir(parents=True, exist_ok=True)
    fresh = folder / f"..{os.getpid()}_{next(_generation)}"
    fresh.mkdir()
    for name, content in files.items():
        (fresh / name).write_text(content)
        (fresh / name).chmod(mode)
    data = folder / "..data"
    old = data.resolve() if data.is_symlink() else None
    swap = folder / "..data_tmp"
    swap.symlink_to(fresh.name)
    os.replace(swap, data)
    for name in files:
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    if old is not None and old != fresh:
        shutil.rmtree(old)
