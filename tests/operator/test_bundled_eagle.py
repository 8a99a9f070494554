"""The bundled tiny EAGLE head on Kubernetes: admitted only as an eagle draft, rendered at the image's
bundled folder, and the pod the operator renders for the CPU pair with the head serves AR's greedy tokens."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from minedraft.bundled import TINY_EAGLE, TINY_TARGET
from tests.operator.admission import admit
from tests.operator.conftest import cpu_pod_resource, local_cpu_pod
from tests.operator.pod_runner import complete, free_ports, http
from tests.operator.test_render import containers, env, rendered

HEAD = {"kind": "eagle", "model": {"bundled": "tiny-eagle"}}


def _errors(mdd_crd: dict[str, Any], mdd: dict[str, Any], draft: dict[str, Any]) -> list[str]:
    mdd = copy.deepcopy(mdd)
    mdd["spec"]["draft"] = copy.deepcopy(draft)
    return admit(mdd_crd, mdd)[1]


def test_admission_takes_the_bundled_head_only_as_an_eagle_draft(cpu_mdd, mdd_crd) -> None:
    assert _errors(mdd_crd, cpu_mdd, HEAD) == []
    assert _errors(mdd_crd, cpu_mdd, {"model": {"bundled": "tiny-draft"}}) == []  # the example as it was
    assert _errors(mdd_crd, cpu_mdd, {"kind": "model", "model": {"bundled": "tiny-draft"}}) == []
    assert _errors(mdd_crd, cpu_mdd, {"kind": "eagle", "model": {"hostPath": {"path": "/heads/h"}}}) == []
    for draft in ({"model": {"bundled": "tiny-eagle"}}, {"kind": "model", "model": {"bundled": "tiny-eagle"}}):
        assert any("tiny-eagle needs kind eagle" in e for e in _errors(mdd_crd, cpu_mdd, draft)), draft
    for bundled in ("tiny-draft", "tiny-target"):
        errors = _errors(mdd_crd, cpu_mdd, {"kind": "eagle", "model": {"bundled": bundled}})
        assert any("must be the head tiny-eagle" in e for e in errors), bundled
    as_target = copy.deepcopy(cpu_mdd)
    as_target["spec"]["target"]["model"] = {"bundled": "tiny-eagle"}
    assert any("it is no target" in e for e in _errors(mdd_crd, as_target, HEAD))


def test_the_rendered_pod_drafts_with_the_bundled_head_folder(cpu_mdd) -> None:
    cpu_mdd["spec"]["draft"] = copy.deepcopy(HEAD)
    cs = containers(rendered(cpu_mdd))
    draft, verifier = env(cs["draft"]), env(cs["verifier"])
    assert draft["MINEDRAFT_MODEL"] == verifier["MINEDRAFT_DRAFT_HEAD"] == "/opt/minedraft/models/tiny-eagle"
    assert draft["MINEDRAFT_DRAFT_KIND"] == verifier["MINEDRAFT_DRAFT_KIND"] == "eagle"
    assert draft["MINEDRAFT_TARGET_MODEL"] == verifier["MINEDRAFT_MODEL"] == "/opt/minedraft/models/tiny-target"
    assert draft["MINEDRAFT_DTYPE"] == "float32"
    # Everything is inside the image: no model volume on any container.
    assert not [m for c in cs.values() for m in c["volumeMounts"] if m["name"].endswith("-model")]


@pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")
def test_the_cpu_pod_with_the_bundled_head_serves_ar_greedy_tokens(tmp_path) -> None:
    from minedraft.core.sampling_params import SamplingParams
    from tests.conftest import engine_from_folders

    mdd = cpu_pod_resource(free_ports(7))
    mdd["spec"]["draft"] = copy.deepcopy(HEAD) | {"threads": 1}
    started = time.monotonic()
    with local_cpu_pod(mdd, tmp_path) as pod:
        assert {e["name"]: e["value"] for e in pod.container("verifier")["env"]}["MINEDRAFT_DRAFT_HEAD"] == \
            str(TINY_EAGLE)
        reply = complete(pod.port("batch-manager", "http"), max_tokens=16)
        status, health = http("GET", f"http://127.0.0.1:{pod.port('batch-manager', 'admin')}/health")
        assert status == 200 and health["draft_connected"] is True  # the head's draft service is in the loop
    print(f"pod up and served in {time.monotonic() - started:.1f} s")
    ar = engine_from_folders(TINY_TARGET, None, "ar").generate(
        ["Once upon a time"], SamplingParams(max_tokens=16, ignore_eos=True, temperature=0))[0]
    assert reply["usage"]["completion_tokens"] == 16
    assert reply["choices"][0]["text"] == ar.text
