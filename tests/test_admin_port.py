"""Three real processes with MINEDRAFT_ADMIN_PORT set: /admin/* on the admin port only (never
on the public one), /health on both, the OpenAI API on the public port only, and the draft link
reported as gloo on CPU."""

from __future__ import annotations

from pathlib import Path

import httpx

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from tests.conftest import wait_until


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_an_admin_port_serves_the_policy_and_the_public_port_does_not(random_pair: tuple[Path, Path],
                                                                   tmp_path: Path) -> None:
    target, draft = random_pair
    admin_port = free_port()
    cfg = StackConfig(target=str(target), draft=str(draft), grpc_port=free_port(), http_port=free_port(), k=3,
                      num_blocks=256, log_dir=tmp_path, admin_port=admin_port)
    stack = LocalStack(cfg)
    admin, public = f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{cfg.http_port}"
    try:
        stack.start_verifier()
        stack.start_draft()
        stack.start_manager()
        wait_until(lambda: stack.first_exit() is None and answers(f"{admin}/health"), timeout=120)
        health = httpx.get(f"{admin}/health", timeout=5).json()
        assert health["status"] == "ok" and health["draft_connected"] and health["draft_state"] == "drafting"
        assert health["draft_link_transport"] == "gloo" and health["data_plane_epoch"] == 1

        body = {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        done = httpx.post(f"{public}/v1/completions", json=body, timeout=60)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(f"{public}/health", timeout=5).status_code == 200  # probes use the public port
        assert httpx.get(f"{public}/admin/policy", timeout=5).status_code == 404
        assert httpx.put(f"{public}/admin/policy", json={"k": 2}, timeout=5).status_code == 404
        assert httpx.post(f"{admin}/v1/completions", json=body, timeout=5).status_code == 404

        changed = httpx.put(f"{admin}/admin/policy", json={"k": 2, "rebalance_threshold": 1.5}, timeout=30)
        assert changed.status_code == 200 and changed.json()["k"] == 2
        assert httpx.get(f"{admin}/admin/policy", timeout=5).json()["rebalance_threshold"] == 1.5
        assert httpx.put(f"{admin}/admin/policy", json={"kk": 2}, timeout=5).status_code == 422
    finally:
        stack.stop()
