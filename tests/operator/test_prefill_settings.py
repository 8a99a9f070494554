"""batchManager.prefixCaching and maxNumBatchedTokens: admitted, rendered into the batch manager's env
only where they differ from its defaults, read by the batch manager, and rolled out when they change."""

from __future__ import annotations

import argparse
import copy
from typing import Any

import pytest

from minedraft_operator.render import render
from tests.operator.admission import admit
from tests.operator.emulator import eventually, running_operator
from tests.operator.test_operator_loop import MDD, NS, with_namespace
from tests.operator.test_render import containers, env, rendered

SETTINGS_ENV = ("MINEDRAFT_ENABLE_PREFIX_CACHING", "MINEDRAFT_MAX_NUM_BATCHED_TOKENS")


def manager_env(mdd: dict[str, Any]) -> dict[str, str]:
    return env(containers(rendered(mdd))["batch-manager"])


def with_settings(mdd: dict[str, Any], **settings: Any) -> dict[str, Any]:
    mdd["spec"].setdefault("batchManager", {}).update(settings)
    return mdd


def test_defaults_are_the_batch_managers_and_render_no_env(cpu_mdd, gpu_mdd, mdd_crd) -> None:
    for mdd in (cpu_mdd, gpu_mdd):
        admitted, errors = admit(mdd_crd, mdd)
        assert errors == []
        bm = admitted["spec"]["batchManager"]
        assert (bm["prefixCaching"], bm["maxNumBatchedTokens"]) == (True, 0)
        # Pods made before the fields existed keep their template: an operator upgrade rolls nothing.
        assert not set(SETTINGS_ENV) & set(manager_env(mdd))
    explicit = with_settings(copy.deepcopy(cpu_mdd), prefixCaching=True, maxNumBatchedTokens=0)
    assert rendered(explicit)["Deployment"] == rendered(cpu_mdd)["Deployment"]


@pytest.mark.parametrize(("prefix_caching", "budget", "expected"), [
    (False, 0, {"MINEDRAFT_ENABLE_PREFIX_CACHING": "0"}),
    (True, 512, {"MINEDRAFT_MAX_NUM_BATCHED_TOKENS": "512"}),
    (False, 16, {"MINEDRAFT_ENABLE_PREFIX_CACHING": "0", "MINEDRAFT_MAX_NUM_BATCHED_TOKENS": "16"}),
])
def test_set_fields_reach_the_batch_manager_only(prefix_caching: bool, budget: int, expected: dict[str, str],
                                                 gpu_mdd, mdd_crd) -> None:
    mdd = with_settings(gpu_mdd, prefixCaching=prefix_caching, maxNumBatchedTokens=budget)
    assert admit(mdd_crd, mdd)[1] == []
    cs = containers(rendered(mdd))
    e = env(cs.pop("batch-manager"))
    assert {k: e[k] for k in SETTINGS_ENV if k in e} == expected
    for worker in cs.values():  # the batch manager tells the workers per sequence and per step
        assert not set(SETTINGS_ENV) & set(env(worker))


def test_a_change_rolls_the_pods(cpu_mdd) -> None:
    """Both are fixed for a pod's life, so a new value is a new pod template (not a live policy push)."""
    before = rendered(copy.deepcopy(cpu_mdd))["Deployment"]["spec"]["template"]
    for change in ({"prefixCaching": False}, {"maxNumBatchedTokens": 1024}):
        after = rendered(with_settings(copy.deepcopy(cpu_mdd), **change))["Deployment"]["spec"]["template"]
        assert after != before


@pytest.mark.parametrize("budget", [0, 16, 2048, 65536])
def test_schema_admits_the_budgets_the_batch_manager_takes(budget: int, cpu_mdd, mdd_crd) -> None:
    assert admit(mdd_crd, with_settings(cpu_mdd, maxNumBatchedTokens=budget))[1] == []


def test_the_batch_manager_reads_the_rendered_env(gpu_mdd, monkeypatch: pytest.MonkeyPatch) -> None:
    """The env names are the ones `minedraft batch-manager` takes (its flags' defaults come from them)."""
    from minedraft.batch_manager.main import manager_config, register

    mdd = with_settings(gpu_mdd, prefixCaching=False, maxNumBatchedTokens=384)
    for name, value in manager_env(mdd).items():
        if name in SETTINGS_ENV:
            monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    config = manager_config(parser.parse_args(["batch-manager"]))
    assert (config.enable_prefix_caching, config.max_num_batched_tokens) == (False, 384)


def _manager_container_env(deployment: dict[str, Any]) -> dict[str, str]:
    return env(next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "batch-manager"))


@pytest.mark.asyncio
async def test_operator_sets_and_clears_the_env(kmock, cpu_mdd) -> None:
    mdd = with_namespace(with_settings(cpu_mdd, prefixCaching=False, maxNumBatchedTokens=256), "uid-prefill")
    async with running_operator(kmock) as k:
        await k.create(*MDD, mdd)

        async def manager_runs_with(expected: dict[str, str]) -> bool:
            e = _manager_container_env(await k.get("apps/v1", "deployments", NS, "tiny"))
            assert {name: e[name] for name in SETTINGS_ENV if name in e} == expected
            return True

        await eventually(lambda: manager_runs_with({"MINEDRAFT_ENABLE_PREFIX_CACHING": "0",
                                                    "MINEDRAFT_MAX_NUM_BATCHED_TOKENS": "256"}), what="both set")
        # Back to the defaults: the env goes, as for a resource that never set them.
        await k.patch(*MDD, NS, "tiny", {"metadata": {"generation": 2}, "spec": {"batchManager": {
            "prefixCaching": True, "maxNumBatchedTokens": 0}}})
        await eventually(lambda: manager_runs_with({}), what="both cleared")
        cleared = with_settings(copy.deepcopy(mdd), prefixCaching=True, maxNumBatchedTokens=0)
        expected = next(o for o in render(cleared) if o["kind"] == "Deployment")
        deployment = await k.get("apps/v1", "deployments", NS, "tiny")
        assert _manager_container_env(deployment) == _manager_container_env(expected)
