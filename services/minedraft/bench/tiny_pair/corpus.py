"""The training corpus: the Python standard library's sources, split train / held-out by path hash."""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SKIPPED_DIR_NAMES = frozenset({"test", "tests", "site-packages"})


@dataclass(frozen=True)
class SourceFile:
    """One stdlib source file, identified by its path relative to the stdlib root."""

    rel_path: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The deterministic train / held-out split of the stdlib sources."""

    train: list[SourceFile]
    held_out: list[SourceFile]


def is_skipped_path(rel_parts: tuple[str, ...]) -> bool:
    """Return True for files under test suites or third-party packages."""
    return any(part in SKIPPED_DIR_NAMES for part in rel_parts[:-1])


def is_held_out(rel_path: str, fraction: float) -> bool:
    """Deterministically assign ~``fraction`` of files to the held-out set by path hash."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def collect_stdlib_files(stdlib_dir: Path) -> list[SourceFile]:
    """Read every UTF-8 ``*.py`` file of the stdlib, sorted by relative path."""
    files: list[SourceFile] = []
    for path in sorted(stdlib_dir.rglob("*.py"), key=lambda p: p.relative_to(stdlib_dir).as_posix()):
        rel = path.relative_to(stdlib_dir)
        if is_skipped_path(rel.parts) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append(SourceFile(rel.as_posix(), text))
    return files


def split_corpus(files: list[SourceFile], held_out_fraction: float) -> Corpus:
    """Split files into training and held-out sets by hash of their relative path."""
    train = [f for f in files if not is_held_out(f.rel_path, held_out_fraction)]
    held_out = [f for f in files if is_held_out(f.rel_path, held_out_fraction)]
    return Corpus(train=train, held_out=held_out)


def load_corpus(held_out_fraction: float) -> Corpus:
    """Load and split the stdlib corpus of the running interpreter."""
    stdlib_dir = Path(sysconfig.get_paths()["stdlib"])
    corpus = split_corpus(collect_stdlib_files(stdlib_dir), held_out_fraction)
    train_mb = sum(len(f.text) for f in corpus.train) / 1e6
    print(
        f"corpus: {stdlib_dir} -> {len(corpus.train)} train files ({train_mb:.1f} M chars), "
        f"{len(corpus.held_out)} held-out files",
        flush=True,
    )
    return corpus
