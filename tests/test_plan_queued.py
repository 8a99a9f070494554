"""How long a plan waits in a worker's inbox before its step begins (StepTiming.plan_queued_ms).

Near zero on every step means the batch manager's next plan arrives just as the worker needs it (its
round trip is as long as a step); a plan issued a step ahead waits most of a step. The GPU runs of
2026-12-01 needed this number and had no way to read it."""

from __future__ import annotations

import threading
import time

from minedraft.batch_manager.step_stats import Counters
from minedraft.proto import control_pb2
from minedraft.worker.server import Inbox


def test_the_inbox_says_how_long_a_plan_waited_and_says_it_once() -> None:
    released = threading.Event()

    def stream():  # the manager's messages, as the gRPC stream yields them
        yield control_pb2.ControlMessage(plan=control_pb2.StepPlan(step=4))
        released.wait(10)

    inbox = Inbox(stream())
    msg = inbox.get()
    time.sleep(0.05)  # the step loop is busy with the step before
    waited = inbox.queued_ms(msg.plan.step)
    released.set()
    assert waited >= 50.0
    assert inbox.queued_ms(4) == 0.0  # taken when its step began
    assert inbox.queued_ms(5) == 0.0  # never arrived
    assert inbox.get() is None


def test_the_batch_manager_sums_the_queued_time_per_side() -> None:
    counters = Counters()
    for queued in (3.5, 0.0, 1.25):
        counters.add_timing("verify", control_pb2.StepTiming(plan_queued_ms=queued, batch=8), wall_ms=5.0)
    counters.add_timing("draft", control_pb2.StepTiming(plan_queued_ms=2.0, batch=8))
    assert counters.timing["verify_plan_queued_ms"] == 4.75
    assert counters.timing["draft_plan_queued_ms"] == 2.0
