"""A plan's membership changes, applied to the sequences a worker holds."""

from __future__ import annotations

from minedraft.core.codec import sampling_from_spec
from minedraft.engine.sequence_host import SequenceHost
from minedraft.proto import control_pb2


def apply_membership(worker: SequenceHost, plan: control_pb2.StepPlan) -> None:
    """Removals free KV at once; additions are computed lazily on their first step or by the plan's prefill
    chunks, which run here, before either half of the step. Additions that fork a sibling's prompt go first, so
    a parent this plan removes still lends its blocks; a re-added sequence is always removed before it is added
    again."""
    forks = [spec for spec in plan.add if spec.HasField("fork_of")]
    for spec in forks:
        _add(worker, spec)
        worker.fork(spec.seq_id, spec.fork_of, spec.fork_tokens)
    forked = {spec.seq_id for spec in forks}
    for seq_id in plan.remove:
        if seq_id not in forked:
            worker.remove(seq_id)
    for spec in plan.add:
        if not spec.HasField("fork_of"):
            _add(worker, spec)
    if plan.prefill:
        worker.prefill([(chunk.seq_id, chunk.end) for chunk in plan.prefill])


def _add(worker: SequenceHost, spec: control_pb2.SeqSpec) -> None:
    worker.remove(spec.seq_id)
    worker.add(spec.seq_id, list(spec.tokens), sampling_from_spec(spec), spec.prompt_len or len(spec.tokens),
               prefix_cache=spec.prefix_cache, cache_salt=spec.cache_salt or None,
               read_cache=not spec.skip_cache_read)


def cache_report(worker: SequenceHost, stats: control_pb2.PrefixCacheStats) -> None:
    """The worker's prefix-cache counts since the last report, and its block gauges, into an event's field."""
    counts = worker.prefix.take_counts()
    alloc = worker.runner.allocator
    stats.queries, stats.hits = counts.queries, counts.hits
    stats.prefill_tokens, stats.evictions = counts.prefill_tokens, counts.evictions
    stats.cached_blocks, stats.free_blocks = alloc.num_cached, alloc.num_free


def verify_ids(worker: SequenceHost, plan: control_pb2.StepPlan) -> list[int]:
    """The plan's verify batch, less sequences this worker does not hold."""
    return [s for s in plan.verify_batch if s in worker.seqs]


def forget_all(worker: SequenceHost) -> None:
    for seq_id in list(worker.seqs):
        worker.remove(seq_id)
