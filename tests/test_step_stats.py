"""Step anatomy sums: busy time is the GPU's where the worker measured it, per batch as well as per plan."""

from __future__ import annotations

from minedraft.batch_manager.step_stats import Counters, busy_ms
from minedraft.proto import control_pb2


def test_busy_time_is_the_device_time_when_the_worker_measured_one() -> None:
    launched = control_pb2.StepTiming(compute_ms=1.2, device_ms=5.0, batch=16)  # queued early, ran 5 ms on the GPU
    host_only = control_pb2.StepTiming(compute_ms=4.0, batch=16)  # a CPU worker: its clock is the measure
    idle = control_pb2.StepTiming()  # sequential SD: this side had no batch in this plan
    assert (busy_ms(launched), busy_ms(host_only), busy_ms(idle)) == (5.0, 4.0, 0.0)
    counters = Counters()
    for timing in (launched, host_only, idle):
        counters.add_timing("verify", timing, wall_ms=6.0)
    t = counters.timing
    assert (t["steps"], t["verify_busy_steps"], t["verify_busy_ms"], t["verify_compute_ms"]) == (3, 2, 9.0, 5.2)
    assert t["wall_ms"] == 18.0
