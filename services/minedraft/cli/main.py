"""`minedraft` console script: one subcommand per module."""

from __future__ import annotations

import argparse
import sys

from minedraft.batch_manager import main as batch_manager
from minedraft.bench import commands as bench
from minedraft.cli import generate, serve
from minedraft.core.errors import MinedraftError
from minedraft.draft_service import main as draft_service
from minedraft.verifier import main as verifier


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minedraft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (serve, generate, bench, verifier, draft_service, batch_manager):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a supervising process runs again
    try:
        return int(args.run(args) or 0)
    except MinedraftError as exc:
        print(f"minedraft: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
