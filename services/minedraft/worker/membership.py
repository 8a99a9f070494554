"""A plan's membership changes, applied to the sequences a worker holds."""

from __future__ import annotations

from minedraft.core.codec import sampling_from_spec
from minedraft.engine.sequence_host import SequenceHost
from minedraft.proto import control_pb2


def apply_membership(worker: SequenceHost, plan: control_pb2.StepPlan) -> None:
    """Removals free KV at once; additions are computed lazily on their first step."""
    for seq_id in plan.remove:
        worker.remove(seq_id)
    for spec in plan.add:
        worker.remove(spec.seq_id)
        worker.add(spec.seq_id, list(spec.tokens), sampling_from_spec(spec), spec.prompt_len or len(spec.tokens))


def verify_ids(worker: SequenceHost, plan: control_pb2.StepPlan) -> list[int]:
    """The plan's verify batch, less sequences this worker does not hold."""
    return [s for s in plan.verify_batch if s in worker.seqs]


def forget_all(worker: SequenceHost) -> None:
    for seq_id in list(worker.seqs):
        worker.remove(seq_id)
