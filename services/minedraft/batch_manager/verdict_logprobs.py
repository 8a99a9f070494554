"""The logprobs a verdict event carries, onto the requests they belong to."""

from __future__ import annotations

from collections.abc import Mapping

from minedraft.core.codec import logprobs_from_wire
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.request import Request
from minedraft.proto import control_pb2


class VerdictLogprobs:
    """One verdict's entries by sequence id; prompt logprobs are given to their requests at once (once each)."""

    def __init__(self, verdicts: control_pb2.Verdicts, requests: Mapping[int, Request]) -> None:
        self._by_seq = {msg.seq_id: msg for msg in verdicts.logprobs}
        for msg in verdicts.prompt_logprobs:
            req = requests.get(msg.seq_id)
            if req is not None and req.prompt_logprobs is None:
                req.prompt_logprobs = [None, *logprobs_from_wire(msg, req.prompt_ids[1:])]

    def of(self, req: Request, tokens: list[int]) -> list[TokenLogprob] | None:
        """The entries of `tokens` (this verdict's tokens of `req`); None when the request asked for none."""
        msg = self._by_seq.get(req.req_id)
        if msg is None:
            if req.params.wants_logprobs:
                raise RuntimeError(f"the verifier sent no logprobs for sequence {req.req_id}, which asked for them")
            return None
        return logprobs_from_wire(msg, tokens)
