"""What a worker tells the batch manager about itself (the Info RPC)."""

from __future__ import annotations

from minedraft.engine.sequence_host import SequenceHost
from minedraft.proto import control_pb2


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
