"""The on-demand profiling window of a worker's loop and the trace summary built on it."""

from __future__ import annotations

import torch

from minedraft.bench.gpu.trace_summary import busy_time, kernel_kind, summarize
from minedraft.proto import control_pb2
from minedraft.worker import step_timing
from minedraft.worker.torch_profile import DIR_ENV, StepProfiler


def run_steps(profiler: StepProfiler, steps: range) -> None:
    x = torch.randn(64, 64)
    for step in steps:
        profiler.before_step(step)
        timing = control_pb2.StepTiming()
        with step_timing.timed(timing, "compute_ms"):
            for _ in range(5):
                x = torch.tanh(x @ x)
        with step_timing.timed(timing, "send_ms"):
            x.sum().item()
        profiler.after_step()


def test_window_profiles_exactly_the_requested_steps(tmp_path, monkeypatch):
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    profiler = StepProfiler.from_env("verifier+draft", torch.device("cpu"))
    assert profiler is not None
    run_steps(profiler, range(0, 3))  # no request yet: nothing is recorded
    assert list(tmp_path.glob("*.trace.json")) == []
    (tmp_path / "verifier_draft.request").write_text("psd 4")
    run_steps(profiler, range(3, 12))
    trace = tmp_path / "verifier_draft-psd.trace.json"
    assert trace.exists()
    assert not (tmp_path / "verifier_draft.request").exists()  # consumed: a later request opens a new window
    assert step_timing._annotate is False  # phases are named only while a window is open
    summary = summarize(trace)
    assert summary["steps"] == 4
    mean = summary["mean"]
    assert mean["compute_ms"] > 0 and mean["send_ms"] > 0
    assert mean["compute_ms"] + mean["send_ms"] <= mean["wall_ms"] + 1e-6
    assert mean["kernels"] == 0  # a CPU worker launches no GPU kernels


def test_without_the_variable_there_is_no_profiler(monkeypatch):
    monkeypatch.delenv(DIR_ENV, raising=False)
    assert StepProfiler.from_env("verifier", torch.device("cpu")) is None


def test_busy_time_is_the_union_of_intervals():
    assert busy_time([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4
    assert busy_time([]) == 0
    assert kernel_kind("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "nccl"
    assert kernel_kind("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_TNT") == "gemm"
    assert kernel_kind("_paged_attention_kernel") == "other"
