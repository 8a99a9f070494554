"""`minedraft serve --api-key K --api-key-file F`: the batch manager it starts checks those keys."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.cli.main import build_parser
from minedraft.cli.serve import run
from tests.test_serve_command import wait_healthy


def test_serve_accepts_both_flags_and_hands_them_to_the_batch_manager_only(monkeypatch) -> None:
    monkeypatch.delenv("MINEDRAFT_API_KEY", raising=False)
    monkeypatch.delenv("MINEDRAFT_API_KEY_FILE", raising=False)
    args = build_parser().parse_args(["serve", "--api-key", "k1,k2", "--api-key-file", "/run/keys"])
    assert args.run is run and (args.api_key, args.api_key_file) == ("k1,k2", "/run/keys")
    stack = LocalStack(StackConfig(target="t", draft="d", api_key=args.api_key, api_key_file=args.api_key_file))
    argv, env = stack.manager_command()
    assert argv[argv.index("--api-key-file") + 1] == "/run/keys"
    assert env == {"MINEDRAFT_API_KEY": "k1,k2"} and not any("k1" in a for a in argv)  # not in the process list
    assert build_parser().parse_args(["serve"]).api_key == ""
    assert LocalStack(StackConfig(target="t", draft="d")).manager_command()[1] == {}
    monkeypatch.setenv("MINEDRAFT_API_KEY_FILE", "/etc/keys")
    assert build_parser().parse_args(["serve"]).api_key_file == "/etc/keys"


def test_serve_with_keys_answers_401_without_one_and_200_with_either(random_pair, tmp_path: Path) -> None:
    target, draft = random_pair
    keys = tmp_path / "keys"
    keys.write_text("from-file\n")
    http_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "minedraft.cli.main", "serve", "--target", str(target), "--draft", str(draft),
         "--http-port", str(http_port), "--grpc-port", str(free_port()), "--admin-port", str(free_port()),
         "--api-key", "from-flag", "--api-key-file", str(keys)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_healthy(http_port, proc)
        url = f"http://127.0.0.1:{http_port}/v1/models"
        assert httpx.get(url, timeout=5).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
        for key in ("from-flag", "from-file"):
            assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code == 200
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
