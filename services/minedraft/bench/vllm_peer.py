"""vLLM as a peer process: located, started in its own environment, driven over a pipe.

vLLM pins its own torch and is 3.4 GB, so it never shares minedraft's interpreter: its
environment is made by scripts/setup_vllm_env.sh and `bench/vllm_worker.py` runs there as a
subprocess. This module only knows how to find that interpreter and talk to the worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from minedraft.core.errors import MinedraftError

PYTHON_ENV = "MINEDRAFT_VLLM_PYTHON"
WORKER = Path(__file__).resolve().with_name("vllm_worker.py")
# scripts/setup_vllm_env.sh installs here by default (.tools/ is the checkout's git-ignored tool folder).
DEFAULT_VENV = Path(__file__).resolve().parents[3] / ".tools" / "vllm-venv"
SETUP_HINT = "create it with scripts/setup_vllm_env.sh, or point MINEDRAFT_VLLM_PYTHON at its python"


class VllmUnavailable(MinedraftError):
    """No usable vLLM environment, or the vLLM worker died."""


def vllm_python(explicit: str | None = None) -> Path:
    """The vLLM environment's interpreter: the argument, $MINEDRAFT_VLLM_PYTHON, or the default venv."""
    chosen = explicit or os.environ.get(PYTHON_ENV)
    path = Path(chosen) if chosen else DEFAULT_VENV / "bin" / "python"
    if not path.exists():
        raise VllmUnavailable(f"no vLLM interpreter at {path}; {SETUP_HINT}")
    return path


def vllm_importable(python: Path) -> bool:
    """Whether `import vllm` works in that interpreter (checked in a subprocess, a few seconds)."""
    probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, timeout=300)
    return probe.returncode == 0


@dataclass(slots=True)
class Timed:
    """A batch's greedy outputs and how long producing them took: wall seconds, and the CPU
    seconds of the producing process (every thread), which other processes' load does not inflate."""

    outputs: list[list[int]]
    seconds: float
    cpu_seconds: float


@dataclass(slots=True)
class PeerConfig:
    target: str
    draft: str | None = None  # None: autoregressive
    k: int = 4
    threads: int = 1
    max_num_seqs: int = 16
    max_model_len: int = 1024
    skip_tokenizer: bool = False

    def argv(self) -> list[str]:
        args = ["--target", self.target, "--k", str(self.k), "--threads", str(self.threads),
                "--max-num-seqs", str(self.max_num_seqs), "--max-model-len", str(self.max_model_len)]
        if self.draft:
            args += ["--draft", self.draft]
        if self.skip_tokenizer:
            args.append("--skip-tokenizer")
        return args


class VllmPeer:
    """One vLLM engine (AR or SD) in its own process; `generate` returns (token ids, seconds)."""

    def __init__(self, config: PeerConfig, python: Path | None = None, start_timeout_s: float = 600) -> None:
        self.config = config
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as the peer) vLLM's stderr
        self._proc = subprocess.Popen(
            [str(python or vllm_python()), str(WORKER), *config.argv()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1,
        )
        ready = self._read(start_timeout_s)
        self.version = str(ready.get("vllm", "?"))
        self.threads = int(ready.get("threads", 0))

    def generate(self, prompts: list[list[int]], max_tokens: int, timeout_s: float = 1800) -> Timed:
        """Greedy, ignore_eos; the times are vLLM's own (wall and CPU) for the batch."""
        self._send({"prompts": prompts, "max_tokens": max_tokens})
        reply = self._read(timeout_s)
        return Timed([list(map(int, o)) for o in reply["outputs"]], float(reply["seconds"]),
                     float(reply["cpu_seconds"]))

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._send({"quit": True})
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> VllmPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: dict) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError as exc:
            raise VllmUnavailable(f"the vLLM worker exited:\n{self._tail()}") from exc

    def _read(self, timeout_s: float) -> dict:
        """The worker's next reply; a dead or silent worker raises with the end of its log."""
        assert self._proc.stdout is not None
        lines: deque[str] = deque()
        reader = threading.Thread(target=lambda: lines.append(self._proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive():
            self._proc.kill()
            raise VllmUnavailable(f"the vLLM worker did not answer within {timeout_s:.0f} s:\n{self._tail()}")
        line = lines.popleft() if lines else ""
        if not line:
            self._proc.wait()
            raise VllmUnavailable(f"the vLLM worker exited ({self._proc.returncode}):\n{self._tail()}")
        return json.loads(line)

    def _tail(self, chars: int = 4000) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-chars:]

