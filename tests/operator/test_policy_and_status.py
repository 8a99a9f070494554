"""Pure parts of the sync: the admin body of a policy, pod readings and conditions."""

from __future__ import annotations

from minedraft_operator.policy import default_policy_env, differs, pinned_to_ar, policy_body
from minedraft_operator.status import PodView, ReplicaReport, conditions, merge_conditions, summary


def test_policy_body_maps_every_contract_field(policy) -> None:
    policy["spec"]["batching"].update(maxSequencesPerBatch=24, rebalanceThreshold=2.5)
    assert policy_body(policy["spec"]) == {"mode": "psd", "k": 4, "k_min": 2, "max_num_seqs": 48,
                                           "pipeline_depth": 2, "rebalance_threshold": 2.5,
                                           "auto_min_tokens_per_step": 1.3, "auto_probe_steps": 200,
                                           "draft_selection": "fixed", "tetris_extra": 3, "tetris_min_batch": 32}
    tetris = policy_body({**policy["spec"], "draftSelection": {"strategy": "tetris", "extraDrafts": 2, "minBatch": 16}})
    assert (tetris["draft_selection"], tetris["tetris_extra"], tetris["tetris_min_batch"]) == ("tetris", 2, 16)
    # auto: adaptive k chooses within k.min..k.max
    auto = policy_body({**policy["spec"], "mode": "auto", "k": {"initial": 4, "min": 2, "max": 6}})
    assert (auto["k"], auto["k_min"]) == (6, 2)
    assert policy_body(None) == policy_body({})
    assert pinned_to_ar(policy_body(None))["mode"] == "ar"
    assert default_policy_env() == {"MINEDRAFT_MODE": "psd", "MINEDRAFT_K": "4", "MINEDRAFT_MAX_NUM_SEQS": "64"}


def test_differs() -> None:
    want = {"mode": "sd", "k": 3, "rebalance_threshold": 0.5}
    assert differs({"mode": "sd", "k": 3, "rebalance_threshold": 0.5000000001}, want) == []
    assert differs({"mode": "psd", "k": 3}, want) == ["mode", "rebalance_threshold"]


def _pod(draft: dict, bm_ready: bool = True, ready: bool = True) -> dict:
    return {"metadata": {"name": "p"}, "status": {
        "podIP": "10.0.0.7",
        "conditions": [{"type": "Ready", "status": str(ready)}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "draft", **draft}, {"name": "batch-manager", "ready": bm_ready}]}}


def test_a_loading_draft_is_not_a_crash_loop_but_a_restarted_one_is() -> None:
    loading = PodView.of(_pod({"ready": False, "restartCount": 0, "state": {"running": {}}}, bm_ready=False))
    assert not loading.draft_crashlooping and not loading.serving
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    crashed = PodView.of(_pod({"ready": False, "restartCount": 2, "state": waiting}))
    assert crashed.draft_crashlooping and crashed.draft_reason == "CrashLoopBackOff" and crashed.serving


def _report(transport: str | None, drafted: int, accepted: int, connected: bool = True) -> ReplicaReport:
    health = {"mode": "sd", "configured_mode": "psd", "k": 4, "draft_connected": connected,
              "drafted_total": drafted, "accepted_total": accepted, "acceptance_rate": 0.0}
    if transport is not None:
        health["draft_link_transport"] = transport
    return ReplicaReport(PodView.of(_pod({"ready": True})), health=health, applied=True, policy_generation=3)


def test_summary_weights_acceptance_by_drafted_tokens_and_shows_the_configured_mode() -> None:
    out = summary([_report("P2P", 100, 90), _report("SHM", 300, 150)])
    assert out == {"mode": "psd", "k": 4, "acceptanceRate": 0.6, "draftLinkTransport": "P2P,SHM"}
    assert summary([_report("", 10, 5, connected=False)])["mode"] == "ar"


def _by_type(conds: list[dict]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in conds}


def test_draft_link_condition_reports_the_transport() -> None:
    pods = [PodView.of(_pod({"ready": True}))]
    assert _by_type(conditions(1, "dra", pods, [_report("P2P", 1, 1)], None))["DraftLinkReady"] == ("True", "P2P")
    mixed = conditions(1, "dra", pods, [_report("P2P", 1, 1), _report("SHM", 1, 1)], None)
    assert _by_type(mixed)["DraftLinkReady"] == ("True", "Mixed")
    assert _by_type(conditions(1, "dra", pods, [_report(None, 1, 1)], None))["DraftLinkReady"] == \
        ("Unknown", "NotReported")
    down = conditions(1, "dra", pods, [_report("", 1, 1, connected=False)], None)
    assert _by_type(down)["DraftLinkReady"] == ("False", "NoDataPlane")
    assert _by_type(down)["Degraded"] == ("True", "DraftDisconnected")


def test_transition_time_moves_only_when_status_changes() -> None:
    first = merge_conditions([], [{"type": "Ready", "status": "False", "reason": "A", "message": ""}], "t1", 1)
    same = merge_conditions(first, [{"type": "Ready", "status": "False", "reason": "B", "message": ""}], "t2", 2)
    flipped = merge_conditions(same, [{"type": "Ready", "status": "True", "reason": "C", "message": ""}], "t3", 2)
    assert [c["lastTransitionTime"] for c in (*first, *same, *flipped)] == ["t1", "t1", "t3"]
    assert same[0]["observedGeneration"] == 2


class RecordingAdmin:
    """The admin API of one batch manager: what it runs and what it was sent."""

    def __init__(self, running: dict) -> None:
        self.running = dict(running)
        self.sent: list[dict] = []

    async def get_policy(self, base: str, keys: tuple[str, ...]) -> dict:
        return dict(self.running)

    async def put_policy(self, base: str, body: dict, keys: tuple[str, ...]) -> dict:
        self.sent.append(body)
        self.running.update(body)
        return dict(self.running)

    async def health(self, base: str, keys: tuple[str, ...]) -> dict:
        return {"configured_mode": self.running["mode"], "mode": "sd", "draft_connected": False,
                "draft_state": "lost_colocated", "k": self.running["k"]}


def test_a_crash_looping_draft_pins_ar_unless_the_verifier_stands_in(policy) -> None:
    import asyncio

    from minedraft_operator.sync import _replica

    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    crashed = PodView.of(_pod({"ready": False, "restartCount": 2, "state": waiting}))
    body = policy_body(policy["spec"])
    pinned, stood_in = RecordingAdmin(body), RecordingAdmin(body)
    pin_report = asyncio.run(_replica(pinned, crashed, 8081, body, 1, ("key",)))
    stand_report = asyncio.run(_replica(stood_in, crashed, 8081, body, 1, ("key",), stand_in=True))
    assert pinned.sent == [pinned_to_ar(body)] and pin_report.pinned_ar
    assert stood_in.sent == [] and not stand_report.pinned_ar and stand_report.applied  # the policy as it is
    degraded = {c["type"]: c for c in conditions(1, "dra", [crashed], [stand_report], None)}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "DraftCrashLoop")
    assert degraded["message"].startswith("the verifier drafts itself")
    assert summary([stand_report])["mode"] == "sd"  # what runs while the draft service is gone
    pinned_msg = {c["type"]: c for c in conditions(1, "dra", [crashed], [pin_report], None)}["Degraded"]["message"]
    assert pinned_msg.startswith("pinned to ar")
