"""A tensor-parallel rank > 0: run every verify rank 0 announces, in rank 0's order of effects.

Rank 0 changes a sequence's state in three places: membership (admit, remove), the verify it
queues, and the commit of that verify's verdict. When it launches a verify ahead, it queues step
i+1 before committing step i, and it may still drop a step it queued ahead (the plan that arrives is
not the one it expected). So the follower commits an ordinary step at once (as rank 0 does, in
parallel with it) but keeps a step queued ahead uncommitted until the next message: an ahead step is
queued, then the previous one committed; any other step commits the previous one first; a drop
forgets it. Its host thus learns step i+1 (over the host channel) while its GPU still runs step i,
and queues i+1 behind it before it waits for i's verdict. The receive of the next frame is posted
before each commit, so gloo takes the frame in while the follower still waits for its own verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from minedraft.engine.readback import Readback
from minedraft.engine.verifier import Verifier
from minedraft.worker.membership import apply_membership, forget_all, verify_ids
from minedraft.worker.stall_watch import StallWatch
from minedraft.worker.torch_profile import StepProfiler
from minedraft.worker.tp_group import KIND_RESET, KIND_STOP, PendingFrame, StepBroadcast


@dataclass(slots=True)
class Queued:
    """A verify queued on the device whose verdict this rank has not committed yet."""

    ids: list[int]
    readback: Readback

    def commit(self, worker: Verifier, stall: StallWatch | None) -> None:
        with StallWatch.around(stall, "a follower's verify"):
            worker.commit(self.ids, self.readback)


def follow(worker: Verifier, channel: StepBroadcast, role: str = "verifier-tp", stall: StallWatch | None = None
           ) -> None:
    """Until rank 0 says stop. With MINEDRAFT_TORCH_PROFILE_DIR it opens profiling windows like rank 0
    (request file `<role>.request`); `stall` bounds each wait for a verdict (worker/stall_watch.py)."""
    window = StepProfiler.from_env(role, worker.runner.device)
    queued: Queued | None = None
    pending: PendingFrame | None = None  # the next frame's receive, posted while the GPU runs this step
    while True:
        msg = channel.receive(pending)
        pending = None
        if msg.kind == KIND_STOP:
            return
        if msg.kind == KIND_RESET:
            forget_all(worker)
            queued = None
            continue
        assert msg.plan is not None
        if msg.drop:
            queued = None
        if queued is not None and not msg.ahead:
            queued.commit(worker, stall)
            queued = None
        if window is not None:
            window.before_step(msg.plan.step)
        apply_membership(worker, msg.plan)
        ids = verify_ids(worker, msg.plan)
        step = Queued(ids, worker.read_back(worker.judge(ids, msg.proposal))) if ids else None
        if queued is not None:  # an ahead step: the previous verdict commits behind it
            queued.commit(worker, stall)
        queued = step if msg.ahead else None  # rank 0 may still drop a step queued ahead: the next message says
        pending = channel.post()  # the next frame may come while this verdict is still on its way
        if step is not None and not msg.ahead:
            step.commit(worker, stall)  # now, while rank 0 reads the same verdict back and plans the next step
        if window is not None:
            window.after_step()
