"""Prompts cut from one long stream of code tokens, never the same slice twice.

The serving benchmarks need prompts that share exactly what they mean to share (a common prefix, a
conversation's earlier turns) and nothing else: a slice reused by accident would be a cache hit the
benchmark did not ask for. So every prompt piece is the next unused slice of the standard library's code,
tokenized once, which is present on every machine and is what the bundled pair was trained on.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from minedraft.core.tokenizer import Tokenizer

MODULES = ("json/decoder.py", "csv.py", "textwrap.py", "heapq.py", "fractions.py", "shlex.py", "string.py",
           "calendar.py", "difflib.py", "pprint.py", "argparse.py", "inspect.py", "typing.py", "tarfile.py",
           "pydoc.py", "subprocess.py", "logging/__init__.py", "collections/__init__.py")


class Corpus:
    """Consecutive, non-overlapping token slices of the standard library's code."""

    def __init__(self, tokenizer: Tokenizer, min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        self.ids: list[int] = []
        for name in MODULES:
            path = stdlib / name
            if path.exists():
                self.ids.extend(tokenizer.encode(path.read_text(encoding="utf-8"), add_special_tokens=False))
            if min_tokens and len(self.ids) >= min_tokens:
                break
        self.used = 0

    def take(self, count: int) -> list[int]:
        """The next `count` unused ids; an error rather than a repeat when the corpus runs out."""
        if self.used + count > len(self.ids):
            raise ValueError(f"the code corpus has {len(self.ids)} tokens; this workload needs more "
                             f"({self.used} used, {count} asked)")
        out = self.ids[self.used : self.used + count]
        self.used += count
        return out

    def text(self, count: int) -> str:
        """About `count` tokens of code as text (chat messages are text; re-encoding may shift a token)."""
        return self.tokenizer.decode(self.take(count))
