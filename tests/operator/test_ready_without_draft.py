"""spec.routing.readyWithoutDraft: what it renders (the supervised draft container) and its default."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from minedraft_operator.render import render
from tests.operator.admission import admit


def draft_of(mdd: dict[str, Any], routing: dict[str, Any]) -> dict[str, Any]:
    mdd = copy.deepcopy(mdd)
    mdd["spec"]["routing"] = routing
    deployment = next(o for o in render(mdd) if o["kind"] == "Deployment")
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "draft")


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


POOL = {"inferencePool": {"enabled": True}}


@pytest.mark.parametrize(("routing", "supervised"), [
    ({}, False),  # no picker routes: Kubernetes restarts a failed draft container, as before
    (POOL, True),  # a picker routes: stay Ready by default
    ({**POOL, "readyWithoutDraft": False}, False),
    ({"readyWithoutDraft": True}, True),
])
def test_the_draft_is_supervised_when_asked_or_when_a_pool_routes(routing, supervised, gpu_mdd) -> None:
    draft = draft_of(gpu_mdd, routing)
    if supervised:
        assert env(draft)["MINEDRAFT_SUPERVISE"] == "1"
        assert env(draft)["MINEDRAFT_STARTUP_S"] == str(gpu_mdd["spec"].get("startupSeconds", 1800))
        # The first load is still awaited; afterwards the supervisor's health checks replace liveness restarts.
        assert "startupProbe" in draft and "livenessProbe" not in draft and "readinessProbe" not in draft
    else:
        assert "MINEDRAFT_SUPERVISE" not in env(draft)
        assert "livenessProbe" in draft and "startupProbe" in draft


def test_the_field_is_admitted_and_has_no_default(cpu_mdd, mdd_crd) -> None:
    cpu_mdd["spec"]["routing"] = {"readyWithoutDraft": True}
    admitted, errors = admit(mdd_crd, cpu_mdd)
    assert errors == [] and admitted["spec"]["routing"]["readyWithoutDraft"] is True
    cpu_mdd["spec"]["routing"] = {}
    admitted, errors = admit(mdd_crd, cpu_mdd)
    assert errors == [] and "readyWithoutDraft" not in admitted["spec"]["routing"]
    cpu_mdd["spec"]["routing"] = {"readyWithoutDraft": "yes"}
    assert admit(mdd_crd, cpu_mdd)[1], "a non-boolean is refused"
