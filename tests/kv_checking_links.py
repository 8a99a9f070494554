"""Fake workers (tests/fake_worker_links.py) that also count KV blocks the way the real ones
allocate them, and record every plan that would have run out: the batch manager's growth
accounting must keep that list empty, whatever it preempts."""

from __future__ import annotations

from collections.abc import Callable

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import control_pb2
from tests.fake_worker_links import FakeCluster, FakeDraft, FakeVerifier, FakeWorkerLink

BLOCK_SIZE = 16  # what the fake workers' Info reports


def blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


class KvLedger:
    """The most blocks one worker held during a plan, and the plans that needed more than it has."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.peak = 0
        self.overflows: list[tuple[int, int]] = []  # (step, blocks needed)

    def record(self, step: int, used: int) -> None:
        self.peak = max(self.peak, used)
        if used > self.num_blocks:
            self.overflows.append((step, used))


class KvVerifier(FakeVerifier):
    """A verify step holds each verified sequence's tokens plus its k drafts (the real runner's
    `ensure(length + k)`); the others hold their tokens."""

    def __init__(self, cluster: FakeCluster, num_blocks: int) -> None:
        super().__init__(cluster, num_blocks)
        self.ledger = KvLedger(num_blocks)

    def _membership(self, plan: control_pb2.StepPlan) -> None:
        super()._membership(plan)
        verify, k = set(plan.verify_batch), plan.k if plan.with_drafts else 0
        self.ledger.record(plan.step, sum(blocks(len(t) + (k if s in verify else 0)) for s, t in self.seqs.items()))


class KvDraft(FakeDraft):
    """A draft step holds each drafted sequence's tokens plus its k - 1 fed drafts."""

    def __init__(self, cluster: FakeCluster, accept: Callable[[int, int], int], num_blocks: int) -> None:
        super().__init__(cluster, accept, num_blocks)
        self.ledger = KvLedger(num_blocks)

    def _membership(self, plan: control_pb2.StepPlan) -> None:
        super()._membership(plan)
        drafting = set(plan.draft_batch) if plan.with_drafts else set()
        self.ledger.record(plan.step, sum(blocks(len(t) + (plan.k if s in drafting else 0))
                                          for s, t in self.seqs.items()))


def kv_stack(tokenizer: Tokenizer, config: ManagerConfig, num_blocks: int,
             accept: Callable[[int, int], int] | None) -> tuple[Coordinator, KvVerifier, KvDraft | None]:
    cluster = FakeCluster()
    verifier = KvVerifier(cluster, num_blocks)
    draft = KvDraft(cluster, accept, num_blocks) if accept is not None else None
    workers: list[FakeWorkerLink] = [verifier] if draft is None else [verifier, draft]
    cluster.workers = workers
    return Coordinator(tokenizer, "fake", verifier, draft, config), verifier, draft
