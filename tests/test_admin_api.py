"""The live policy over HTTP: GET/PUT /admin/policy derived from the policy table, its errors,
and which app serves /admin and /health when the admin port is separate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from minedraft.batch_manager.admin_api import build_admin_app, install_admin_routes
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.http_api import build_http_app
from minedraft.batch_manager.policy import POLICY_FIELDS, POLICY_NAMES
from minedraft.core.tokenizer import Tokenizer
from tests.step_driver_support import Stack, drive, word_tokenizer

DEFAULT_POLICY = {"mode": "psd", "k": 4, "k_min": 1, "max_num_seqs": 64, "pipeline_depth": 2,
                  "rebalance_threshold": 0.0, "auto_min_tokens_per_step": 1.3, "auto_probe_steps": 200,
                  "draft_selection": "fixed", "tetris_extra": 3, "tetris_min_batch": 32}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return word_tokenizer(Path(tmp_path_factory.mktemp("tok")))


def calls(tokenizer: Tokenizer, requests: list[tuple[str, str, Any]], draft: bool = True, separate: bool = False
          ) -> tuple[list[httpx.Response], Stack]:
    """Start a batch manager over fake workers and send `requests` (method, path, json) to its
    public app (and, with `separate`, paths under /admin or /health to the admin app)."""
    stack = Stack(tokenizer, ManagerConfig(), (lambda seq, step: 1) if draft else None)
    out: list[httpx.Response] = []

    async def scenario() -> None:
        await stack.coordinator.start()
        public = build_http_app(stack.coordinator, serve_health=not separate)
        admin = build_admin_app(stack.coordinator) if separate else public
        if not separate:
            install_admin_routes(public, stack.coordinator)
        for method, path, body in requests:
            app = admin if separate and path.startswith(("/admin", "/health")) else public
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bm") as client:
                out.append(await client.request(method, path, json=body))
        await stack.coordinator.stop()

    drive(scenario)
    return out, stack


def test_the_policy_has_one_field_list_and_get_shows_all_of_it(tokenizer) -> None:
    assert tuple(DEFAULT_POLICY) == POLICY_NAMES
    (got,), _ = calls(tokenizer, [("GET", "/admin/policy", None)])
    assert got.status_code == 200 and got.json() == DEFAULT_POLICY


def test_put_changes_what_it_names_returns_the_whole_policy_and_reaches_the_loop(tokenizer) -> None:
    change = {"mode": "sd", "k": 6, "rebalance_threshold": 2.5, "auto_min_tokens_per_step": 1.8,
              "auto_probe_steps": 50}
    (put, get), stack = calls(tokenizer, [("PUT", "/admin/policy", change), ("GET", "/admin/policy", None)])
    assert put.status_code == 200 and put.json() == {**DEFAULT_POLICY, **change} == get.json()
    assert stack.driver.sched.rebalance_threshold == 2.5 and not stack.driver.sched.two_batches
    assert stack.coordinator.config.auto_probe_steps == 50


def out_of_bounds() -> list[tuple[str, object]]:
    """Each bounded field just outside its bounds, and a value of the wrong type."""
    cases: list[tuple[str, object]] = [("mode", "turbo"), ("k", "3"), ("k", True), ("k", 2.5),
                                       ("k_min", 6)]  # in bounds, but above the k (5) it comes with
    for f in POLICY_FIELDS:
        step = 1 if f.type is int else 0.5
        if f.minimum is not None:
            cases.append((f.name, f.type(f.minimum - step)))
        if f.maximum is not None:
            cases.append((f.name, f.type(f.maximum + step)))
    return cases


@pytest.mark.parametrize(("field", "value"), out_of_bounds())
def test_a_bad_value_is_400_naming_the_field_and_changes_nothing(tokenizer, field: str, value: object) -> None:
    (bad, get), _ = calls(tokenizer, [("PUT", "/admin/policy", {"k": 5, field: value}), ("GET", "/admin/policy", None)])
    assert bad.status_code == 400 and bad.json()["error"]["param"] == field and field in bad.json()["error"]["message"]
    assert get.json() == DEFAULT_POLICY


def test_an_unknown_field_is_422_and_other_bodies_400(tokenizer) -> None:
    (unknown, not_object, no_draft), _ = calls(tokenizer, [
        ("PUT", "/admin/policy", {"k": 3, "speed": "max"}),
        ("PUT", "/admin/policy", [1, 2]),
        ("PUT", "/admin/policy", {"mode": "psd"}),
    ], draft=False)
    assert unknown.status_code == 422 and "speed" in unknown.json()["error"]["message"]
    assert not_object.status_code == 400
    assert no_draft.status_code == 400 and "no draft service" in no_draft.json()["error"]["message"]


def test_with_an_admin_port_health_and_admin_leave_the_public_app(tokenizer) -> None:
    requests = [("GET", "/health", None), ("GET", "/admin/policy", None), ("GET", "/v1/models", None)]
    (health, policy, models), _ = calls(tokenizer, requests, separate=True)
    assert health.status_code == 200 and health.json()["draft_link_transport"] == "gloo"
    assert policy.status_code == 200 and models.status_code == 200
    stack = Stack(tokenizer, ManagerConfig(), lambda seq, step: 1)

    async def public_only() -> None:
        await stack.coordinator.start()
        app = build_http_app(stack.coordinator, serve_health=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bm") as client:
            assert (await client.get("/health")).status_code == 404
            assert (await client.get("/admin/policy")).status_code == 404
            assert (await client.put("/admin/policy", json={"k": 2})).status_code == 404
        admin = build_admin_app(stack.coordinator)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=admin), base_url="http://bm") as client:
            assert (await client.get("/v1/models")).status_code == 404
        await stack.coordinator.stop()

    drive(public_only)
