"""draft.kind eagle: both workers learn the other's model folder (and mount it); the default renders as before."""

from __future__ import annotations

import copy

from tests.operator.test_render import containers, env, rendered


def test_an_eagle_head_mounts_the_target_on_the_draft_and_the_head_on_every_verifier_rank(gpu_mdd) -> None:
    before = containers(rendered(copy.deepcopy(gpu_mdd)))
    assert "MINEDRAFT_DRAFT_KIND" not in env(before["verifier"]) | env(before["draft"])  # pods keep their template
    gpu_mdd["spec"]["target"]["tensorParallelSize"] = 2
    gpu_mdd["spec"]["draft"]["kind"] = "eagle"
    cs = containers(rendered(gpu_mdd))
    head, target = env(cs["draft"])["MINEDRAFT_MODEL"], env(cs["verifier"])["MINEDRAFT_MODEL"]
    assert env(cs["draft"])["MINEDRAFT_DRAFT_KIND"] == env(cs["verifier"])["MINEDRAFT_DRAFT_KIND"] == "eagle"
    assert env(cs["draft"])["MINEDRAFT_TARGET_MODEL"] == target
    assert env(cs["verifier"])["MINEDRAFT_DRAFT_HEAD"] == head
    mounts = {name: {m["mountPath"] for m in cs[name]["volumeMounts"] if m.get("readOnly")} for name in cs}
    assert mounts["verifier"] == mounts["draft"] == mounts["verifier-tp1"] and len(mounts["draft"]) == 2
    # followers run the same capturing forwards (their all-reduces match rank 0's); only rank 0 sends the states
    assert env(cs["verifier-tp1"])["MINEDRAFT_DRAFT_KIND"] == "eagle"
    assert env(cs["verifier-tp1"])["MINEDRAFT_DRAFT_HEAD"] == head
