"""`python -m minedraft_operator.crds FOLDER`: write the CRD YAML files."""

from __future__ import annotations

import sys
from pathlib import Path

from minedraft_operator.crds import write


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m minedraft_operator.crds FOLDER", file=sys.stderr)
        return 2
    for path in write(Path(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
