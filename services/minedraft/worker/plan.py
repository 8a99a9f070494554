"""Helpers both executors use to read plans."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from minedraft.core.codec import sampling_from_spec
from minedraft.engine.sequence_host import SequenceHost
from minedraft.proto import control_pb2


def apply_membership(worker: SequenceHost, plan: control_pb2.StepPlan) -> None:
    """Removals free KV at once; additions are computed lazily on their first step."""
    for seq_id in plan.remove:
        worker.remove(seq_id)
    for spec in plan.add:
        worker.remove(spec.seq_id)
        worker.add(spec.seq_id, list(spec.tokens), sampling_from_spec(spec))


def forget_all(worker: SequenceHost) -> None:
    for seq_id in list(worker.seqs):
        worker.remove(seq_id)


@contextmanager
def timed(timing: control_pb2.StepTiming, field: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        setattr(timing, field, getattr(timing, field) + (time.perf_counter() - start) * 1000.0)


def worker_info(worker: SequenceHost, role: str, last_step: int, **extra: object) -> control_pb2.WorkerInfo:
    alloc = worker.runner.allocator
    return control_pb2.WorkerInfo(
        role=role,
        vocab_size=worker.vocab_size,
        max_context=worker.runner.config.max_position_embeddings,
        num_blocks=alloc.num_blocks,
        block_size=alloc.block_size,
        free_blocks=alloc.num_free,
        sequences=len(worker.seqs),
        device=str(worker.runner.device),
        last_step=last_step,
        eos_token_ids=list(worker.runner.config.eos_token_ids),
        **extra,
    )
