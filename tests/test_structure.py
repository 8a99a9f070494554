"""The layout's promises, checked: no import loops, a torch-free batch manager, small files."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "services" / "minedraft"
KERNEL_FILES = {"engine/cuda/paged_attention.py", "engine/cuda/fused_kernels.py"}  # Triton kernels may run long
MAX_LINES = 300


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "_pb2" not in p.name]


def imports_of(path: Path, known: set[str]) -> set[str]:
    """minedraft modules `path` imports anywhere in the file (lazy and type-only imports count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop as a path a -> ... -> a, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_loops() -> None:
    files = {module_name(p): p for p in source_files()}
    known = set(files)
    # A package's __init__ is not an edge to its own submodules' importers: only real modules count.
    graph = {name: imports_of(path, known) - {name} for name, path in files.items()}
    assert find_cycle(graph) is None, f"import loop: {' -> '.join(find_cycle(graph) or [])}"


def test_the_loop_finder_finds_a_loop() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("module", ["minedraft.batch_manager.main", "minedraft.cli.main", "minedraft.core.codec"])
def test_batch_manager_side_imports_no_torch(module: str) -> None:
    """The batch-manager image has no torch: importing its entry points must not need it."""
    code = (f"import sys, {module}; "
            "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'safetensors')); "
            "print(leaked); sys.exit(bool(leaked))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{module} pulled in {result.stdout.strip()} {result.stderr[-2000:]}"


def test_batch_manager_cli_runs_with_torch_unimportable(tmp_path: Path) -> None:
    """Stronger than the sys.modules check: with torch made unimportable, the batch-manager command still parses."""
    blocker = tmp_path / "torch"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('torch is not installed in this image')\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "minedraft.cli.main", "batch-manager", "--help"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--verifier-address" in result.stdout


def test_no_source_file_is_over_the_size_limit() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in source_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES and str(p.relative_to(PACKAGE)) not in KERNEL_FILES}
    assert not long, f"split these by concern (over {MAX_LINES} lines): {long}"
