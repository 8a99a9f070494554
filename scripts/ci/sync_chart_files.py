#!/usr/bin/env python3
"""Copy what the charts take from the operator, so the two never drift apart.

Helm can only read files inside a chart, so the charts hold copies:
- operator/crds/*.yaml        -> charts/minedraft-crds/files/   (byte for byte)
- operator/rbac/rules.yaml    -> charts/minedraft/files/rbac-rules.yaml   (byte for byte)
- the CRDs' spec schemas      -> charts/minedraft/values.schema.json at deployment.spec and
  policy.spec (so `helm lint/install` checks the example custom resources in values files
  against the same schema the API server will), minus what the chart fills itself.

Usage: scripts/ci/sync_chart_files.py [--check]   (--check: change nothing, exit 1 if stale)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_CRDS = ROOT / "operator" / "crds"
OPERATOR_RULES = ROOT / "operator" / "rbac" / "rules.yaml"
CHART = ROOT / "charts" / "minedraft"
CRDS_CHART_FILES = ROOT / "charts" / "minedraft-crds" / "files"
CHART_RULES = CHART / "files" / "rbac-rules.yaml"
VALUES_SCHEMA = CHART / "values.schema.json"
# values key -> the CRD whose spec schema describes it
SPEC_SCHEMAS = {
    "deployment": "minedraft.io_minedraftdeployments.yaml",
    "policy": "minedraft.io_speculationpolicies.yaml",
}
# Fields the chart sets itself (from its `images` values), so values files need not give them.
CHART_FILLED = {"deployment": ("images",)}


def crd_spec_schema(crd_file: Path) -> dict[str, Any]:
    crd = yaml.safe_load(crd_file.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def values_spec_schema(key: str, crd_file: Path) -> dict[str, Any]:
    """The CRD's spec schema as a values schema: nothing required at the top (the chart's
    `enabled` switch decides, see values.schema.json), and fields the chart fills are optional."""
    schema = copy.deepcopy(crd_spec_schema(crd_file))
    schema.pop("required", None)
    for field in CHART_FILLED.get(key, ()):
        schema["properties"][field].pop("required", None)
    schema["description"] = (f"The {crd_file.stem.split('_', 1)[1]} spec, as in the CRD (kubectl explain). "
                             + schema.get("description", ""))
    return schema


def desired_values_schema() -> str:
    schema = json.loads(VALUES_SCHEMA.read_text())
    for key, crd_name in SPEC_SCHEMAS.items():
        schema["properties"][key]["properties"]["spec"] = values_spec_schema(key, OPERATOR_CRDS / crd_name)
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def planned_files() -> dict[Path, bytes]:
    """Every chart file this script owns -> the content it must have."""
    if not OPERATOR_CRDS.is_dir() or not OPERATOR_RULES.is_file():
        raise SystemExit(f"sync_chart_files: {OPERATOR_CRDS} or {OPERATOR_RULES} is missing")
    files = {CRDS_CHART_FILES / src.name: src.read_bytes() for src in sorted(OPERATOR_CRDS.glob("*.yaml"))}
    files[CHART_RULES] = OPERATOR_RULES.read_bytes()
    files[VALUES_SCHEMA] = desired_values_schema().encode()
    return files


def stale_copies(files: dict[Path, bytes]) -> list[Path]:
    """Copies whose content differs, and CRD copies the operator no longer has."""
    stale = [path for path, content in files.items() if not path.is_file() or path.read_bytes() != content]
    stale += [path for path in sorted(CRDS_CHART_FILES.glob("*.yaml")) if path not in files]
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report stale copies (exit 1 if any)")
    args = parser.parse_args(argv)
    files = planned_files()
    stale = stale_copies(files)
    for path in stale:
        print(f"{'stale' if args.check else 'updating'}: {path.relative_to(ROOT)}")
    if args.check:
        if stale:
            print("run scripts/ci/sync_chart_files.py to update them", file=sys.stderr)
        return 1 if stale else 0
    CRDS_CHART_FILES.mkdir(parents=True, exist_ok=True)
    for path in stale:
        if path in files:
            path.write_bytes(files[path])
        else:
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
