"""A tensor-parallel rank whose wait for its GPU outlasts the group's timeout ends itself.

The GPU case (a peer dies while an all-reduce replayed in a CUDA graph waits for it) cannot happen on a
CPU, where gloo reports a dead peer; the watch itself is checked here with real waits and threads."""

from __future__ import annotations

import threading
import time

from minedraft.worker.stall_watch import StallWatch


def test_a_wait_longer_than_the_limit_is_reported_once_with_its_label() -> None:
    stalls: list[tuple[str, float]] = []
    reported = threading.Event()

    def on_stall(label: str, waited_s: float) -> None:
        stalls.append((label, waited_s))
        reported.set()

    watch = StallWatch(0.2, on_stall, poll_s=0.01)
    with watch.waiting("verify readback"):
        assert reported.wait(5)  # the watch fires while the wait is still going on
        time.sleep(0.1)
    assert len(stalls) == 1
    label, waited = stalls[0]
    assert label == "verify readback" and waited > 0.2
    watch.close()


def test_many_short_waits_never_add_up_to_a_stall() -> None:
    stalls: list[str] = []
    watch = StallWatch(0.15, lambda label, _: stalls.append(label), poll_s=0.01)
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:  # 0.6 s of back-to-back steps, each far under the limit
        with watch.waiting("step"):
            time.sleep(0.02)
    time.sleep(0.3)  # idle between steps is not a wait either
    watch.close()
    assert stalls == []
