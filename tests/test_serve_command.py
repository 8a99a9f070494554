"""`minedraft serve` as a user runs it: one command up, clients work, Ctrl-C stops all three."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from minedraft.cli.local_stack import free_port


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "serve exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail("minedraft serve did not become healthy")


def test_serve_starts_three_processes_serves_openai_and_stops_on_ctrl_c(random_pair: tuple[Path, Path]) -> None:
    target, draft = random_pair
    http_port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "minedraft.cli.main", "serve", "--target", str(target), "--draft", str(draft),
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--admin-port", str(free_port()), "--k", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_healthy(http_port, proc)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 3
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused")
        out = client.completions.create(model="target", prompt="w4 w5", max_tokens=5, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 5
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert f"http://127.0.0.1:{http_port}/v1" in output and f"127.0.0.1:{grpc_port}" in output
    assert "minedraft: stopped" in output
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
