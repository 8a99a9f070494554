# Sourced by bin/minedraft and bin/test: make .venv with the package installed, once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
STAMP="$VENV/.minedraft-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ] || [ "$ROOT/operator/pyproject.toml" -nt "$STAMP" ]; then
  echo "minedraft: setting up $VENV (first run only)..." >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  # The CPU build of torch; a plain 'torch' requirement would pull a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install -q "torch==2.13.0" >&2
  "$VENV/bin/python" -m pip install -q -e "$ROOT[dev,worker]" >&2
  # The operator is its own distribution (its image carries neither torch nor the services).
  "$VENV/bin/python" -m pip install -q -e "$ROOT/operator[test]" >&2
  touch "$STAMP"
fi
# Stubs are build outputs: regenerate them when a .proto changed since the install (fast no-op otherwise).
if [ -n "$(find "$ROOT/proto" -name '*.proto' -newer "$STAMP" 2>/dev/null)" ]; then
  "$VENV/bin/python" -m minedraft.proto._codegen && touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
