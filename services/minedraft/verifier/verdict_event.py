"""The verdicts a verifier's step event carries: what the batch manager streams to clients and counts."""

from __future__ import annotations

from minedraft.core.codec import logprobs_to_wire
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2


def add_verdicts(event: control_pb2.WorkerEvent, worker: Verifier, ids: list[int], rows: list[list[int]],
                 accepted: list[int], drafted: list[int] | None = None) -> None:
    """Each row's accepted drafts and the token after them, with the logprobs the commit computed (`drafted`:
    TETRIS's per-row draft counts, over which adaptive k counts acceptance)."""
    counts = [n + 1 for n in accepted]
    verdicts = event.verdicts
    verdicts.seq_ids.extend(ids)
    verdicts.counts.extend(counts)
    verdicts.accepted.extend(accepted)
    verdicts.drafted.extend(drafted or ())
    verdicts.tokens.extend(t for row, c in zip(rows, counts, strict=True) for t in row[:c])
    for seq_id, entries in worker.last_logprobs.items():
        verdicts.logprobs.append(logprobs_to_wire(seq_id, entries, worker.seqs[seq_id].params.logprobs or 0))
    for seq_id, entries in worker.last_prompt_logprobs.items():
        verdicts.prompt_logprobs.append(
            logprobs_to_wire(seq_id, entries, worker.seqs[seq_id].params.prompt_logprobs or 0))
