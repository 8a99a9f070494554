"""Benchmark prompts: deterministic, and present on every machine without downloads."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from minedraft.core.tokenizer import Tokenizer

STDLIB_MODULES = ("json/decoder.py", "csv.py", "textwrap.py", "heapq.py", "bisect.py", "fractions.py",
                  "shlex.py", "string.py", "colorsys.py", "calendar.py", "difflib.py", "pprint.py")


def code_prompts(tokenizer: Tokenizer, count: int, tokens: int) -> list[list[int]]:
    """`count` prompts of `tokens` ids cut from standard-library modules: real code, which the
    bundled pair was trained on, so acceptance is what a user of that pair sees."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prompts: list[list[int]] = []
    offset = 0
    while len(prompts) < count:
        for name in STDLIB_MODULES:
            ids = tokenizer.encode((stdlib / name).read_text(encoding="utf-8"))
            start = 200 + offset * tokens
            prompts.append(ids[start : start + tokens])
            if len(prompts) == count:
                break
        offset += 1
    return prompts


def random_prompts(count: int, length: int = 32, seed: int = 0, low: int = 3, high: int = 2000) -> list[list[int]]:
    """Random token ids in [low, high): for the synthetic pair, whose weights carry no language."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (count, length), generator=gen).tolist()
