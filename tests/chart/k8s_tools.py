"""The real helm and hadolint binaries the chart tests run, and helm's rendering parsed.

The binaries come from scripts/ci/install_k8s_tools.sh (.tools/bin) or $HELM / $HADOLINT. A
missing one fails the test with the install hint: CI must never pass by skipping these checks.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = ROOT / ".tools" / "bin"
CHART = ROOT / "charts" / "minedraft"
CRDS_CHART = ROOT / "charts" / "minedraft-crds"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.34.0"
INSTALL_HINT = "run scripts/ci/install_k8s_tools.sh (helm and hadolint into .tools/bin) or set {var}"

Manifest = dict[str, Any]


def tool(name: str, env_var: str) -> Path:
    path = Path(os.environ.get(env_var) or TOOLS_BIN / name)
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{name} not found at {path}: {INSTALL_HINT.format(var=env_var)}", pytrace=False)
    return path


def run(args: Iterable[str | Path], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def helm_template(helm: Path, chart: Path, values: Iterable[Path] = (), sets: Iterable[str] = (),
                  release: str = "minedraft", namespace: str = "minedraft-system") -> list[Manifest]:
    """`helm template` (test hooks included) parsed into manifests, in helm's order."""
    args: list[str | Path] = [helm, "template", release, chart, "--namespace", namespace,
                              "--kube-version", KUBE_VERSION]
    for file in values:
        args += ["--values", file]
    for item in sets:
        args += ["--set", item]
    return [doc for doc in yaml.safe_load_all(run(args).stdout) if doc]


def by_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    (found,) = by_kind(manifests, kind)
    return found
