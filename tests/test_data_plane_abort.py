"""Aborting the data plane when the manager sees the draft service go (DataPlaneAbort).

Over NCCL a receive from a dead peer never fails on its own: the verifier's GPU stream, waiting on
it, would hold every request until the communicator's timeout. So the control stream's reader thread
hands the abort to the verifier at once, ahead of the plans queued before it, and whatever a receive
returns after it is refused. (Gloo notices a dead peer by itself; NCCL's side is checked on a GPU,
tests/gpu/test_draft_loss_on_cuda.py.)"""

from __future__ import annotations

import multiprocessing as mp
import threading

import torch
import torch.distributed as dist

from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.verifier.executor import VerifierExecutor
from minedraft.worker.data_frames import DraftPayload
from minedraft.worker.data_plane import DRAFT_RANK, DataPlane
from minedraft.worker.rendezvous import host_store
from minedraft.worker.server import Inbox


def test_an_abort_is_handed_over_as_it_arrives_ahead_of_queued_plans() -> None:
    seen: list[tuple[int, int]] = []
    arrived, built = threading.Event(), threading.Event()

    def stream():  # the manager's messages, as the gRPC stream yields them
        yield control_pb2.ControlMessage(plan=control_pb2.StepPlan(step=1))
        built.wait(10)
        yield control_pb2.ControlMessage(abort=control_pb2.DataPlaneAbort(epoch=3, reason="draft service lost"))
        yield control_pb2.ControlMessage(plan=control_pb2.StepPlan(step=2))

    def on_abort(abort: control_pb2.DataPlaneAbort) -> None:
        seen.append((abort.epoch, inbox.queue.qsize()))  # plan 1 still waits for the step loop
        arrived.set()

    inbox = Inbox(stream(), on_abort)
    built.set()
    assert arrived.wait(10)
    assert seen == [(3, 1)]
    got = [inbox.get() for _ in range(3)]
    assert [m.plan.step for m in got[:2]] == [1, 2] and got[2] is None  # the abort is not a step


def draft_side(port: int, done: mp.Queue) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    plane = DataPlane(DRAFT_RANK, 1, store, "gloo", torch.device("cpu"))
    plane.send_drafts(DraftPayload(0, [5], torch.tensor([[7, 8]]), None))  # arrives, but after the abort
    done.get(timeout=60)
    plane.close()


def test_drafts_received_after_an_abort_are_refused_and_the_step_runs_without_them(random_pair) -> None:
    store = host_store("127.0.0.1", 0)
    executor = VerifierExecutor(Verifier(ModelRunner(load_model(random_pair[0]), 64, 16)), store, "127.0.0.1",
                                store.port)
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    peer = ctx.Process(target=draft_side, args=(store.port, done))
    peer.start()
    try:
        setup = control_pb2.DataPlaneSetup(epoch=1, master_addr="127.0.0.1", master_port=store.port,
                                           backend="gloo", timeout_s=20)
        assert executor.handle_setup(setup).setup_done
        assert executor.plane is not None
        executor.drafts_pending = True  # the previous plan had the draft service draft sequence 5
        executor.abort_data_plane(control_pb2.DataPlaneAbort(epoch=2, reason="another epoch"))
        assert not executor.plane.aborted
        executor.abort_data_plane(control_pb2.DataPlaneAbort(epoch=1, reason="draft service lost"))
        assert executor.plane.aborted
        plan = control_pb2.StepPlan(step=1, add=[control_pb2.SeqSpec(seq_id=5, tokens=[3, 4, 5])], verify_batch=[5],
                                    with_drafts=True, k=2)
        event = executor.handle_plan(plan)
        assert event.data_plane_lost and executor.plane is None
        assert (list(event.verdicts.seq_ids), list(event.verdicts.counts), list(event.verdicts.accepted)) == \
            ([5], [1], [0])  # verified alone, as in AR: the drafts that did arrive were not used
    finally:
        done.put("done")
        executor.reset()
        peer.join(timeout=30)
    assert peer.exitcode == 0
