"""A step that captured a CUDA graph says so (StepTiming.graph_capture_ms): the worker measures its
executor's capture time around each plan, the batch manager sums it in /health's timing totals, and
adaptive k keeps such a step out of the costs it learns (tens of ms that its shape will not pay again)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.plan_k import PlanK
from minedraft.bench.manager_load import WaitingVerifier
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import control_pb2
from minedraft.worker.server import serve_worker
from minedraft.worker.settings import add_worker_flags

CAPTURE_MS = 40.0


class CapturingVerifier(WaitingVerifier):
    """Meets a new shape (and captures its graph) at the steps given."""

    def __init__(self, capture_at: set[int]) -> None:
        super().__init__(0.002)
        self.capture_at = capture_at
        self.captured_ms = 0.0

    def graph_capture_ms(self) -> float:
        return self.captured_ms

    def handle_plan(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        if plan.step in self.capture_at:
            self.captured_ms += CAPTURE_MS
        return super().handle_plan(plan)


def test_the_capture_time_of_a_step_reaches_the_batch_managers_totals() -> None:
    server = serve_worker(CapturingVerifier({2, 5}), "127.0.0.1", 0)

    async def scenario() -> dict:
        coordinator = Coordinator.over_grpc(Tokenizer(TINY_TARGET), "fake", f"127.0.0.1:{server.port}", None,
                                            ManagerConfig(mode="ar", max_num_seqs=2))
        await coordinator.start()
        outputs = [tok async for chunk in coordinator.generate([5, 6, 7], SamplingParams(max_tokens=12,
                                                                                         ignore_eos=True), "r")
                   for tok in chunk.token_ids]
        status = coordinator.status()
        await coordinator.stop()
        assert len(outputs) == 12
        return status

    try:
        status = asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        server.shutdown(grace_s=1)
    totals = status["timing_totals"]
    assert totals["steps"] >= 12
    assert totals["verify_graph_capture_ms"] == 2 * CAPTURE_MS  # steps 2 and 5, nothing else


def test_adaptive_k_learns_acceptance_but_no_cost_from_a_step_that_captured() -> None:
    plan = PlanK()
    for step in range(3):
        plan.for_plan(step, "auto", 4, True, draft_batch=[1, 2], verify_batch=[1, 2] if step else [])
    plan.on_draft(1, 3.0, 2)
    plan.on_verify(2, 4, [4, 2], 5.0)
    assert plan.adaptive is not None
    costs = ({b: dict(t.by_k) for b, t in plan.adaptive.draft.buckets.items()}, plan.adaptive.verify.view())
    tried = sum(plan.adaptive.tried)
    plan.on_draft(2, None, 2)  # a capture: its time is the capture's, not the step's
    plan.on_verify(3, 4, [1, 0], None)
    assert ({b: dict(t.by_k) for b, t in plan.adaptive.draft.buckets.items()}, plan.adaptive.verify.view()) == costs
    assert sum(plan.adaptive.tried) > tried  # its verdicts still count


def test_capture_flags_take_the_environment_and_refuse_a_negative_bound(monkeypatch, capsys) -> None:
    parser = argparse.ArgumentParser()
    add_worker_flags(parser, "verifier")
    assert (parser.parse_args([]).capture_batch, parser.parse_args([]).capture_k) == (0, 8)  # on first use
    monkeypatch.setenv("MINEDRAFT_CAPTURE_BATCH", "64")
    parser = argparse.ArgumentParser()
    add_worker_flags(parser, "draft")
    assert parser.parse_args([]).capture_batch == 64
    with pytest.raises(SystemExit):
        parser.parse_args(["--capture-k", "-1"])
    assert "--capture-k: must be 0 or more, got -1" in capsys.readouterr().err
