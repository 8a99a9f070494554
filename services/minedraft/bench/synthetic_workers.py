"""`python -m minedraft.bench.synthetic_workers verifier|draft ...`: the two workers on the synthetic pair.

The GPU benchmark starts the verifier and the draft service through this module (the local
stack's `worker_module`), so that `--model synthetic:...` builds a synthetic pair member
(`minedraft.bench.synthetic_pair`) instead of reading a model folder, and an EAGLE head's draft service
builds what it shares with a synthetic `--target-model` (`synthetic_shared`). The flags are those of
`minedraft verifier` and `minedraft draft`.
"""

from __future__ import annotations

import argparse
import sys

from minedraft.bench.synthetic_pair import load_synthetic, synthetic_shared
from minedraft.draft_service import main as draft_service
from minedraft.verifier import main as verifier


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minedraft.bench.synthetic_workers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (verifier, draft_service):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run is draft_service.run:
        return int(draft_service.run(args, load_synthetic, synthetic_shared) or 0)
    return int(args.run(args, load_synthetic) or 0)


if __name__ == "__main__":
    sys.exit(main())
