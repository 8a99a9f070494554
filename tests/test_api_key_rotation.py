"""Key files are re-read when they change: a rotated key takes effect on a running batch manager
(public HTTP, gRPC and the admin API) within about a second, and a key file that is emptied or
deleted mid-rotation keeps the last keys in force instead of opening the API."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from minedraft.batch_manager.api_keys import MISSING, RECHECK_S, WRONG, ApiKeys
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.errors import InvalidRequestError
from minedraft.proto import generation_pb2, generation_pb2_grpc
from tests.conftest import wait_until
from tests.reliability_support import bearer, grpc_metadata

INLINE = "inline-key-static-0001"
OLD, NEW = "file-key-old-aaaa1111", "file-key-new-bbbb2222"
ADMIN_OLD, ADMIN_NEW = "admin-old-cccc3333", "admin-new-dddd4444"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def swap(folder: Path, name: str, text: str) -> None:
    """Replace `folder/name` the way the kubelet updates a Secret volume: a new file, an atomic rename."""
    fresh = folder / f".{name}.new"
    fresh.write_text(text)
    os.replace(fresh, folder / name)


def auth(key: str) -> str:
    return f"Bearer {key}"


def test_a_rewritten_file_is_read_at_most_once_a_second_and_inline_keys_stay(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"# rotated by hand\n{OLD}\n")
    clock = Clock()
    keys = ApiKeys.load(INLINE, [str(tmp_path / "keys")], clock)
    assert keys.check(auth(OLD)) is None and keys.check(auth(INLINE)) is None and keys.check(auth(NEW)) == WRONG
    swap(tmp_path, "keys", f"{NEW}\n")
    clock.now += RECHECK_S / 2
    assert keys.check(auth(OLD)) is None, "the file is not stat'ed on every request"
    clock.now += RECHECK_S
    assert keys.check(auth(OLD)) == WRONG and keys.check(auth(NEW)) is None and keys.check(auth(INLINE)) is None
    (tmp_path / "keys").write_text(f"{NEW},{OLD}\n")  # in place, two keys on a line, as MINEDRAFT_API_KEY takes them
    clock.now += RECHECK_S
    assert keys.check(auth(OLD)) is None and keys.check(auth(NEW)) is None and len(keys) == 3


def test_an_emptied_or_deleted_file_keeps_the_last_keys_and_warns_once(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{OLD}\n")
    clock = Clock()
    keys = ApiKeys.load("", [str(path)], clock)
    for broken in ("", "# nothing but a comment\n\n", None, None):
        if broken is None:
            path.unlink(missing_ok=True)
        else:
            swap(tmp_path, "keys", broken)
        clock.now += RECHECK_S
        with caplog.at_level(logging.WARNING, logger="minedraft.batch_manager.api_keys"):
            assert keys.check(None) == MISSING and keys.check(auth("")) == WRONG and keys.check(auth(NEW)) == WRONG
            assert keys.check(auth(OLD)) is None and bool(keys)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one while it holds no key, one while it is gone: not one per check
    assert "holds no key" in warnings[0] and "cannot be read" in warnings[1]
    swap(tmp_path, "keys", f"{NEW}\n")
    clock.now += RECHECK_S
    assert keys.check(auth(NEW)) is None and keys.check(auth(OLD)) == WRONG


def test_a_key_file_must_exist_and_hold_a_key_at_start(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="does not exist"):
        ApiKeys.load("", [str(tmp_path / "absent")])
    (tmp_path / "blank").write_text("# none yet\n")
    with pytest.raises(InvalidRequestError, match="none is non-empty"):
        ApiKeys.load("", [str(tmp_path / "blank")])
    assert not ApiKeys.load("", [""]) and ApiKeys.load("", [""]).check(None) is None  # no keys: no check


@dataclass
class Rotating:
    stack: LocalStack
    folder: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.stack.cfg.http_port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.stack.admin_port}"

    def public_status(self, key: str) -> int:
        """HTTP status of GET /v1/models with `key` ("": no Authorization header)."""
        return httpx.get(f"{self.url}/v1/models", headers=bearer(key) if key else {}, timeout=30).status_code

    def admin_status(self, key: str) -> int:
        return httpx.get(f"{self.admin}/admin/policy", headers=bearer(key) if key else {}, timeout=30).status_code

    def grpc_code(self, key: str) -> grpc.StatusCode:
        request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[5, 6]),
                                                 sampling=generation_pb2.SamplingParameters(max_tokens=2))
        with grpc.insecure_channel(f"127.0.0.1:{self.stack.cfg.grpc_port}") as channel:
            try:
                stub = generation_pb2_grpc.GenerationStub(channel)
                stub.Generate(request, timeout=30, metadata=grpc_metadata(key) if key else ())
            except grpc.RpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    def accepts(self, public: list[str], admin: list[str]) -> bool:
        return all(self.public_status(k) == 200 and self.grpc_code(k) == grpc.StatusCode.OK for k in public) and \
            all(self.admin_status(k) == 200 for k in admin)

    def refuses(self, public: list[str], admin: list[str]) -> bool:
        return all(self.public_status(k) == 401 and self.grpc_code(k) == grpc.StatusCode.UNAUTHENTICATED
                   for k in public) and all(self.admin_status(k) == 401 for k in admin)


@pytest.fixture(scope="module")
def rotating(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rotating]:
    folder = tmp_path_factory.mktemp("rotating")
    (folder / "api-keys").write_text(f"{OLD}\n")
    (folder / "admin-keys").write_text(f"{ADMIN_OLD}\n")
    env = {"MINEDRAFT_API_KEY": INLINE, "MINEDRAFT_API_KEY_FILE": str(folder / "api-keys"),
           "MINEDRAFT_ADMIN_API_KEY_FILE": str(folder / "admin-keys")}
    cfg = StackConfig(target=str(random_pair[0]), draft=str(random_pair[1]), grpc_port=free_port(),
                      http_port=free_port(), k=3, num_blocks=256, log_dir=folder, process_env={"batch-manager": env})
    stack = LocalStack(cfg)
    try:
        stack.start(timeout=120)
        yield Rotating(stack, folder)
    finally:
        stack.stop()


def test_a_rotated_key_file_takes_effect_without_a_restart(rotating: Rotating) -> None:
    manager = rotating.stack.procs["batch-manager"].pid
    assert rotating.accepts([INLINE, OLD], [ADMIN_OLD])
    assert rotating.refuses([NEW, ADMIN_OLD], [ADMIN_NEW, OLD])
    swap(rotating.folder, "api-keys", f"{NEW}\n")
    swap(rotating.folder, "admin-keys", f"{ADMIN_NEW}\n")
    wait_until(lambda: rotating.refuses([OLD], [ADMIN_OLD]), timeout=2.0)
    assert rotating.accepts([INLINE, NEW], [ADMIN_NEW])
    # Emptied, then deleted, mid-rotation: the last keys stay in force, nothing opens.
    for broken in ("emptied", "deleted"):
        for name in ("api-keys", "admin-keys"):
            path = rotating.folder / name
            path.write_text("") if broken == "emptied" else path.unlink()
        time.sleep(1.5 * RECHECK_S)  # every listener has looked at the files again since
        assert rotating.refuses(["", OLD, "x"], ["", ADMIN_OLD, INLINE]), broken
        assert rotating.accepts([INLINE, NEW], [ADMIN_NEW]), broken
    log = (rotating.folder / "batch-manager.log").read_text()
    assert "holds no key" in log and "cannot be read" in log
    assert rotating.stack.procs["batch-manager"].pid == manager and rotating.stack.procs["batch-manager"].poll() is None
