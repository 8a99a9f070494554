"""The draft <-> verifier data plane over gloo: payloads arrive intact, small and oversized."""

from __future__ import annotations

import multiprocessing as mp

import torch
import torch.distributed as dist

from minedraft.worker.data_plane import DRAFT_RANK, VERIFIER_RANK, DataPlane, DraftPayload, VerdictPayload, host_store


def payloads(batch: int, k: int, sampled: bool) -> tuple[DraftPayload, VerdictPayload]:
    gen = torch.Generator().manual_seed(batch * 10 + k)
    ids = (torch.randperm(10 * batch, generator=gen)[:batch] + 7).tolist()
    tokens = torch.randint(0, 50000, (batch, k), generator=gen)
    probs = torch.rand(batch, k, 33, generator=gen) if sampled else None
    verdict_tokens = torch.randint(-1, 50000, (batch, k + 1), generator=gen)
    accepted = torch.randint(0, k + 1, (batch,), generator=gen)
    return DraftPayload(3, ids, tokens, probs), VerdictPayload(4, ids, verdict_tokens, accepted)


CASES = [(1, 1, False), (5, 4, True), (2000, 6, False)]  # the last one overflows the first frame


def draft_side(port: int, queue: mp.Queue) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    plane = DataPlane(DRAFT_RANK, 0, store, "gloo", torch.device("cpu"))
    ok = True
    for batch, k, sampled in CASES:
        drafts, verdict = payloads(batch, k, sampled)
        plane.send_drafts(drafts)
        got = plane.recv_verdict()
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
        for batch, k, sampled in CASES:
            drafts, verdict = payloads(batch, k, sampled)
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
