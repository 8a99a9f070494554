"""The control-plane trace (MINEDRAFT_CONTROL_TRACE) and its report: where a plan's round trip goes.

A real worker gRPC server (its step a 10 ms wait that leaves the interpreter free, as a GPU step does)
driven by the real batch manager over gRPC. At pipeline depth 2 each plan is in the worker's inbox well
before its step; at depth 1 it cannot be (the manager issues it only once the step before has answered),
and the report must show the difference."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.bench.control_trace_report import breakdown, load, main, render
from minedraft.bench.manager_load import WaitingVerifier
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.observability import control_trace
from minedraft.worker.server import serve_worker

STEP_S = 0.010


def traced_run(folder: Path, depth: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[float]]:
    monkeypatch.setenv(control_trace.ENV, str(folder))
    control_trace.restart()
    server = serve_worker(WaitingVerifier(STEP_S), "127.0.0.1", 0)

    async def scenario() -> None:
        config = ManagerConfig(mode="ar", max_num_seqs=4, pipeline_depth=depth)
        coordinator = Coordinator.over_grpc(Tokenizer(TINY_TARGET), "fake", f"127.0.0.1:{server.port}", None,
                                            config)
        await coordinator.start()

        async def one() -> None:
            async for _ in coordinator.generate([5, 6, 7], SamplingParams(max_tokens=30, ignore_eos=True), "r"):
                pass

        await asyncio.gather(*(one() for _ in range(4)))
        await coordinator.stop()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        server.shutdown(grace_s=1)
        monkeypatch.delenv(control_trace.ENV)
        control_trace.restart()
    return breakdown(load(folder), depth)


def test_the_report_shows_plans_queued_a_step_ahead_at_depth_2_and_just_late_at_depth_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ahead = traced_run(tmp_path / "depth2", 2, monkeypatch)
    late = traced_run(tmp_path / "depth1", 1, monkeypatch)
    median = {name: {label: sorted(v)[len(v) // 2] for label, v in parts.items()}
              for name, parts in (("ahead", ahead), ("late", late))}
    assert len(ahead["step (begin -> end)"]) >= 15 and len(late["step (begin -> end)"]) >= 15
    for parts in median.values():
        assert parts["step (begin -> end)"] >= STEP_S * 1000
        assert all(ms >= 0 for ms in parts.values())
        # the parts of the round trip add up to it
        chain = ("event to gRPC handler", "handler to manager", "manager: event -> next plan", "plan to gRPC write",
                 "gRPC write to worker inbox")
        assert sum(parts[label] for label in chain) == pytest.approx(parts["round trip (end -> next plan in)"],
                                                                     rel=0.5)
    assert median["ahead"]["plan queued (in -> its step)"] > STEP_S * 1000 / 3
    assert median["ahead"]["gap between steps"] < 1.0
    assert median["late"]["plan queued (in -> its step)"] < 1.0
    assert median["late"]["gap between steps"] >= median["late"]["round trip (end -> next plan in)"] * 0.8 > 0.1


def test_the_report_parts_come_from_the_marks_and_the_command_reads_a_folder(tmp_path: Path, capsys) -> None:
    lines = []
    for s in range(12):  # steps of 5 ms back to back; each plan comes in 1 ms after the step 2 before it ends
        begin = s * 5_000_000
        lines += [f"begin {s} {begin}", f"end {s} {begin + 5_000_000}", f"out {s} {begin + 5_100_000}",
                  f"arrive {s + 2} {begin + 6_000_000}"]
    manager = []
    for s in range(12):
        end = s * 5_000_000 + 5_000_000
        manager += [f"verdict {s} {end + 400_000}", f"plan {s + 2} {end + 700_000}", f"write {s + 2} {end + 750_000}"]
    (tmp_path / "verifier-11.txt").write_text("\n".join(lines) + "\n", encoding="ascii")
    (tmp_path / "manager-12.txt").write_text("\n".join(manager) + "\n", encoding="ascii")
    (tmp_path / "draft-13.txt").write_text("begin 0 1\n", encoding="ascii")  # another worker's: not followed
    parts = breakdown(load(tmp_path), depth=2, skip=0)
    assert parts["event to gRPC handler"][0] == pytest.approx(0.1)
    assert parts["handler to manager"][0] == pytest.approx(0.3)
    assert parts["manager: event -> next plan"][0] == pytest.approx(0.3)
    assert parts["gRPC write to worker inbox"][0] == pytest.approx(0.25)
    assert parts["round trip (end -> next plan in)"][0] == pytest.approx(1.0)
    assert parts["plan queued (in -> its step)"][0] == pytest.approx(4.0)
    assert len(parts["step (begin -> end)"]) == 10  # the last two steps' next plans never came
    assert len(breakdown(load(tmp_path), depth=2, skip=1, steps=range(3, 8))["gap between steps"]) == 4  # one cell
    assert "round trip" in render(parts)
    assert main([str(tmp_path)]) == 0 and "plan queued" in capsys.readouterr().out
    assert main([str(tmp_path / "nothing")]) == 1
