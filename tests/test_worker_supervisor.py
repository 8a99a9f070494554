"""The draft container's supervisor (worker/supervisor.py) with real child processes: it restarts a child
that exits or stops answering health checks, backs off, and on SIGTERM passes the signal on and exits with
the child's status."""

from __future__ import annotations

import itertools
import signal
import sys
import threading
import time
from pathlib import Path

from minedraft.worker.supervisor import SupervisorTimings, WorkerSupervisor, child_command

FAST = SupervisorTimings(startup_s=5.0, check_every_s=0.05, check_timeout_s=0.05, failures_to_restart=3,
                         first_backoff_s=0.05, max_backoff_s=0.2, healthy_reset_s=60.0)


def script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def counting_child(starts: Path, then: str) -> list[str]:
    """A child that appends a line to `starts` and then runs `then`."""
    return script(f"import signal, sys, time\nopen({str(starts)!r}, 'a').write('x\\n')\n{then}")


def test_a_child_that_exits_is_restarted_until_sigterm_which_it_receives(tmp_path: Path) -> None:
    starts, got_term = tmp_path / "starts", tmp_path / "term"
    # Each child crashes after 0.1 s, except the fourth, which serves until SIGTERM and then exits 0.
    child = counting_child(starts, f"""
if len(open({str(starts)!r}).read().split()) < 4:
    time.sleep(0.1); sys.exit(3)
def on_term(*_):
    open({str(got_term)!r}, 'w').write('term'); sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True: time.sleep(0.05)
""")
    supervisor = WorkerSupervisor(child, {}, "unused", "child", FAST, check=lambda *_: True)
    outcome: list[int] = []
    runner = threading.Thread(target=lambda: outcome.append(supervisor.run()))
    runner.start()
    deadline = time.monotonic() + 20
    while (not starts.exists() or len(starts.read_text().split()) < 4) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the fourth child is up and serving
    assert supervisor.restarts == 3
    supervisor.stop()
    runner.join(10)
    assert outcome == [0], "exits with the child's own status after its drain"
    assert got_term.read_text() == "term"
    assert len(starts.read_text().split()) == 4, "nothing is restarted after SIGTERM"


def test_a_child_that_stops_answering_health_checks_is_killed_and_restarted(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    child = counting_child(starts, "while True: time.sleep(0.05)")
    healthy = threading.Event()
    healthy.set()
    checks: list[str] = []

    def check(address: str, timeout_s: float) -> bool:
        checks.append(address)
        return healthy.is_set()

    supervisor = WorkerSupervisor(child, {}, "127.0.0.1:1", "child", FAST, check=check)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        time.sleep(0.5)
        first = supervisor.child
        assert first is not None and first.poll() is None and supervisor.restarts == 0
        healthy.clear()  # hung: alive, but health checks fail
        deadline = time.monotonic() + 10
        while supervisor.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert first.poll() == -signal.SIGKILL, "the hung child is killed"
        healthy.set()
        while (supervisor.child is first or supervisor.child is None) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert supervisor.child is not first and supervisor.child.poll() is None and supervisor.restarts == 1
        assert set(checks) == {"127.0.0.1:1"}
    finally:
        supervisor.stop()
        runner.join(10)
    assert len(starts.read_text().split()) == 2


def test_a_child_that_never_becomes_healthy_is_restarted_after_the_startup_budget(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    child = counting_child(starts, "while True: time.sleep(0.05)")
    timings = SupervisorTimings(startup_s=0.3, check_every_s=0.05, check_timeout_s=0.05, first_backoff_s=0.05)
    supervisor = WorkerSupervisor(child, {}, "x", "child", timings, check=lambda *_: False)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while supervisor.restarts < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert supervisor.restarts >= 2
    finally:
        supervisor.stop()
        runner.join(10)
    assert not runner.is_alive()


def test_the_backoff_doubles_up_to_its_cap(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    child = counting_child(starts, "sys.exit(1)")
    timings = SupervisorTimings(first_backoff_s=0.1, max_backoff_s=0.4, check_every_s=0.01)
    supervisor = WorkerSupervisor(child, {}, "x", "child", timings, check=lambda *_: True)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    deadline = time.monotonic() + 20
    stamps: list[float] = []
    seen = 0
    while len(stamps) < 5 and time.monotonic() < deadline:
        count = len(starts.read_text().split()) if starts.exists() else 0
        if count > seen:
            stamps.append(time.monotonic())
            seen = count
        time.sleep(0.005)
    supervisor.stop()
    runner.join(10)
    assert list(supervisor.backoffs)[:4] == [0.1, 0.2, 0.4, 0.4], "doubles from the first wait up to the cap"
    # Each restart really waited its backoff: a start never follows the previous one sooner, less this
    # loop's 5 ms poll. A child's own start-up only adds to a gap (by a fraction of a second on a loaded
    # machine), so no upper bound is asserted.
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert len(gaps) == 4, gaps
    assert all(gap >= wait - 0.01 for gap, wait in zip(gaps, supervisor.backoffs, strict=False)), gaps


def test_the_child_runs_the_same_command_without_supervise() -> None:
    argv = ["draft", "--supervise", "1", "--port", "5", "--supervise=1", "--model", "m"]
    assert child_command(argv) == [sys.executable, "-m", "minedraft.cli.main", "draft", "--port", "5", "--model", "m"]
