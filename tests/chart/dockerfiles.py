"""A small reader for our Dockerfiles: stages, instructions with ARG defaults substituted, .dockerignore.

No docker engine runs here, so the image tests read the files structurally; hadolint lints them.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from tests.chart.k8s_tools import ROOT

DOCKER = ROOT / "docker"
IMAGES = ("batch-manager", "worker-cpu", "worker-gpu", "operator")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)

    def args(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]


def logical_lines(text: str) -> list[str]:
    """Instructions with line continuations joined; comments and blank lines dropped."""
    out, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    return out


def stages(name: str) -> list[Stage]:
    """The stages of docker/<name>.Dockerfile, ARG defaults (global and per stage) substituted."""
    args: dict[str, str] = {}
    result: list[Stage] = []
    for line in logical_lines((DOCKER / f"{name}.Dockerfile").read_text()):
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest)
        if instruction == "FROM":
            words = rest.split()
            result.append(Stage(words[0], words[2] if len(words) > 2 and words[1].upper() == "AS" else None))
        elif result:
            result[-1].instructions.append((instruction, rest))
    return result


def dockerignore_excludes(path: str) -> bool:
    """Whether the build context leaves `path` (relative, posix) out; the last matching pattern decides."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatchcase(path, pattern) or path.startswith(pattern + "/"):
            excluded = not negated
    return excluded
