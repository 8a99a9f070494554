"""Paths of the tiny model pair that ships inside the package."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TINY_TARGET = ASSETS / "tiny-target"
TINY_DRAFT = ASSETS / "tiny-draft"
TINY_EAGLE = ASSETS / "tiny-eagle"  # an EAGLE-1 head for tiny-target (python -m minedraft.bench.tiny_pair.eagle)
