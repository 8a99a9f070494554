"""A verifier that loaded the draft model too (--colocated-draft) stands in for a lost draft service when
the batch manager runs with --draft-stand-in: PSD with the draft service while it is up, fused SD on the
verifier while it is down (not plain decoding), PSD again once it is back; greedy output equals AR
throughout. Three real processes on loopback, gloo data plane."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from minedraft.bench.client import put_policy
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from tests.test_colocated_sd import PROMPTS, ar_reference, health, run_batch


def steps(before: dict, after: dict) -> dict[str, int]:
    return {kind: after["steps_by_kind"][kind] - before["steps_by_kind"][kind] for kind in ("psd", "sd", "ar")}


def wait_for(stack: LocalStack, state: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = health(stack)
        if status["draft_state"] == state:
            return status
        time.sleep(0.2)
    raise AssertionError(f"draft state never became {state}: {health(stack)['draft_state']}")


@contextmanager
def stand_in_stack(target: Path, draft: Path, log_dir: Path, **cfg: object) -> Iterator[LocalStack]:
    """PSD with a draft service, the verifier holding the same draft beside the target to stand in for it."""
    config = StackConfig(target=str(target), draft=str(draft), grpc_port=free_port(), http_port=free_port(),
                         mode="psd", k=2, num_blocks=512, log_dir=log_dir,
                         process_env={"verifier": {"MINEDRAFT_COLOCATED_DRAFT": str(draft)},
                                      "batch-manager": {"MINEDRAFT_DRAFT_STAND_IN": "1"}}, **cfg)  # type: ignore[arg-type]
    stack = LocalStack(config)
    stack.start(timeout=120)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture()
def stand_in(random_pair: tuple[Path, Path], tmp_path: Path):
    target, _ = random_pair  # the target drafts for itself: every draft should pass, so drafts really are judged
    with stand_in_stack(target, target, tmp_path) as stack:
        yield stack


def test_the_verifier_drafts_while_the_draft_service_is_lost(stand_in: LocalStack, random_pair) -> None:
    reference = ar_reference(random_pair, PROMPTS, 24)
    up = wait_for(stand_in, "drafting")
    assert up["draft_link_transport"] == "gloo"
    assert run_batch(stand_in, PROMPTS, 24) == reference
    mid = health(stand_in)
    assert steps(up, mid)["psd"] > 0  # the draft service drafts while it is there

    stand_in.kill("draft")
    put_policy(stand_in.admin_port, mode="psd", k=2)  # any step now finds the data plane gone
    assert run_batch(stand_in, PROMPTS, 24) == reference
    lost = wait_for(stand_in, "lost_colocated")
    assert lost["status"] == "degraded" and "drafts itself" in lost["reason"]
    assert run_batch(stand_in, PROMPTS, 24) == reference
    after = health(stand_in)
    assert steps(lost, after)["sd"] > 0 and steps(lost, after)["ar"] == 0  # fused SD on the verifier, not AR
    drafted, accepted = (after[key] - lost[key] for key in ("drafted_total", "accepted_total"))
    assert drafted > 0 and accepted >= 0.9 * drafted

    stand_in.start_draft()
    back = wait_for(stand_in, "drafting", timeout_s=120)
    assert run_batch(stand_in, PROMPTS, 24) == reference
    assert steps(back, health(stand_in))["psd"] > 0 and back["recoveries"] >= 1
