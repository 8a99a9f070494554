"""The draft <-> verifier data plane over gloo: payloads arrive intact, small and oversized, read on the host or
taken unread from a posted receive (with a sampled batch's draft probabilities)."""

from __future__ import annotations

import multiprocessing as mp

import torch
import torch.distributed as dist

from minedraft.worker.data_frames import (
    DraftPayload,
    VerdictPayload,
    expected_header,
    expected_verdict_header,
    split_verdict_frame,
)
from minedraft.worker.data_plane import DRAFT_RANK, VERIFIER_RANK, DataPlane
from minedraft.worker.rendezvous import host_store


def payloads(batch: int, k: int, sampled: bool) -> tuple[DraftPayload, VerdictPayload]:
    gen = torch.Generator().manual_seed(batch * 10 + k)
    ids = (torch.randperm(10 * batch, generator=gen)[:batch] + 7).tolist()
    tokens = torch.randint(0, 50000, (batch, k), generator=gen)
    probs = torch.rand(batch, k, 33, generator=gen) if sampled else None
    verdict_tokens = torch.randint(-1, 50000, (batch, k + 1), generator=gen)
    accepted = torch.randint(0, k + 1, (batch,), generator=gen)
    return DraftPayload(3, ids, tokens, probs), VerdictPayload(4, ids, verdict_tokens, accepted)


# the third overflows the first frame; the fourth the verifier takes unread from a posted receive, its draft
# probabilities too (their width known from the second)
CASES = [(1, 1, False), (5, 4, True), (2000, 6, False), (3, 2, True)]


def draft_side(port: int, queue: mp.Queue) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    plane = DataPlane(DRAFT_RANK, 0, store, "gloo", torch.device("cpu"))
    ok = True
    for batch, k, sampled in CASES:
        drafts, verdict = payloads(batch, k, sampled)
        plane.send_drafts(drafts)
        plane.post_verdict_receive()  # as the draft service does with launch-ahead
        if plane.can_take_verdict(batch, k):  # read as device views, then back on the host
            posted = plane.take_posted_verdict(batch, k)
            assert posted is not None
            header, accepted, rows = split_verdict_frame(posted.frame.tolist(), batch, k)
            ok &= header == expected_verdict_header(verdict.step, verdict.seq_ids, k)
            ok &= accepted == verdict.accepted.tolist() and rows == verdict.tokens.tolist()
            ok &= torch.equal(posted.accepted, verdict.accepted) and torch.equal(posted.tokens, verdict.tokens)
            continue
        got = plane.recv_verdict()  # too big for one frame: the posted frame, then the rest
        ok &= got.step == verdict.step and got.seq_ids == verdict.seq_ids
        ok &= torch.equal(got.tokens, verdict.tokens) and torch.equal(got.accepted, verdict.accepted)
    plane.close()
    queue.put(ok)


def test_payloads_cross_intact_including_oversized_batches() -> None:
    store = host_store("127.0.0.1", 0)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    peer = ctx.Process(target=draft_side, args=(store.port, queue))
    peer.start()
    plane = DataPlane(VERIFIER_RANK, 0, store, "gloo", torch.device("cpu"))
    try:
        for case, (batch, k, sampled) in enumerate(CASES):
            drafts, verdict = payloads(batch, k, sampled)
            plane.post_drafts_receive()
            if case == 0:  # no frame with probabilities yet: their width is unknown, so the frame is read first
                assert plane.draft_vocab is None and plane.take_posted_drafts(batch, k, sampled=True) is None
            if case == 3:
                posted = plane.take_posted_drafts(batch, k, sampled=True)
                assert posted is not None and posted.probs is not None
                assert posted.header.tolist() == expected_header(drafts.step, drafts.seq_ids, k, 33)
                assert torch.equal(posted.tokens, drafts.tokens) and torch.equal(posted.probs, drafts.probs)
                plane.send_verdict(verdict)
                continue
            got = plane.recv_drafts()
            assert got.step == drafts.step and got.seq_ids == drafts.seq_ids
            assert torch.equal(got.tokens, drafts.tokens)
            if sampled:
                assert got.probs is not None and torch.equal(got.probs, drafts.probs)
            else:
                assert got.probs is None
            plane.send_verdict(verdict)
        assert queue.get(timeout=60) is True
    finally:
        plane.close()
        peer.join(timeout=30)
    assert peer.exitcode == 0


def verifier_epochs(queue: mp.Queue, go: mp.Queue) -> None:
    """The verifier's side: host the store, form epoch 1, then (once told) epoch 2."""
    store = host_store("127.0.0.1", 0)
    queue.put(store.port)
    first = DataPlane(VERIFIER_RANK, 1, store, "gloo", torch.device("cpu"), timeout_s=20)
    go.get(timeout=60)
    first.close()
    second = DataPlane(VERIFIER_RANK, 2, store, "gloo", torch.device("cpu"), timeout_s=20)
    second.close()
    queue.put("formed")


def test_draft_service_rejoins_after_a_data_plane_error(random_pair) -> None:
    """A transport error mid-step must close the draft side's process group, or every later
    epoch fails to form in that process (and the verifier waits out each attempt)."""
    from minedraft.draft_service.executor import DraftExecutor
    from minedraft.draft_service.launch_ahead import AwaitedVerdict
    from minedraft.engine.drafter import Drafter
    from minedraft.engine.loader import load_model
    from minedraft.engine.runner import ModelRunner
    from minedraft.proto import control_pb2
    from minedraft.worker.data_plane import DataPlaneError

    executor = DraftExecutor(Drafter(ModelRunner(load_model(random_pair[1]), 64, 16)))
    ctx = mp.get_context("spawn")
    queue, go = ctx.Queue(), ctx.Queue()
    peer = ctx.Process(target=verifier_epochs, args=(queue, go))
    peer.start()
    try:
        port = queue.get(timeout=60)

        def setup(epoch: int) -> control_pb2.WorkerEvent:
            return executor.handle_setup(control_pb2.DataPlaneSetup(epoch=epoch, master_addr="127.0.0.1",
                                                                    master_port=port, backend="gloo", timeout_s=20))

        assert setup(1).setup_done
        assert executor.plane is not None

        def broken() -> None:
            raise DataPlaneError("peer went away")

        executor.plane.recv_verdict = broken  # type: ignore[method-assign]
        executor.awaited = AwaitedVerdict(6, [])  # the previous plan's verify sends a verdict
        event = executor.handle_plan(control_pb2.StepPlan(step=7))
        assert event.data_plane_lost and executor.plane is None
        assert executor.plane is None
        go.put("next")
        assert setup(2).setup_done
        assert queue.get(timeout=60) == "formed"
    finally:
        executor.reset()
        peer.join(timeout=30)
    assert peer.exitcode == 0
