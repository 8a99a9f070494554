"""Token payloads between the draft service and the verifier over torch.distributed.

Rank 0 is the verifier (it hosts the rendezvous store for the life of the process),
rank 1 the draft service. Each (re-)formation of the pair is an *epoch* with its own key
prefix in the store, so a restarted draft service can join a fresh process group while
the verifier keeps running. Sends are asynchronous (isend) and waited on only before the
next send, so neither side blocks on the other's receive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.engine.errors import MinedraftError
from minedraft.engine.transfer import to_device

VERIFIER_RANK = 0
DRAFT_RANK = 1
_HEADER = 6  # step, batch, k, has_probs, vocab, reserved


class DataPlaneError(MinedraftError):
    """The peer is gone or the transport failed; the caller falls back."""


@dataclass(slots=True)
class DraftPayload:
    step: int
    seq_ids: list[int]
    tokens: torch.Tensor  # [B, k]
    probs: torch.Tensor | None  # [B, k, V]


@dataclass(slots=True)
class VerdictPayload:
    step: int
    seq_ids: list[int]
    tokens: torch.Tensor  # [B, k+1], -1 padded
    accepted: torch.Tensor  # [B]


def host_store(host: str, port: int, timeout_s: float = 30.0) -> dist.TCPStore:
    """The verifier's long-lived rendezvous store (port 0 picks a free port)."""
    return dist.TCPStore(host, port, world_size=None, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


class DataPlane:
    """One epoch of the two-rank process group."""

    def __init__(
        self,
        rank: int,
        epoch: int,
        store: dist.Store,
        backend: str,
        device: torch.device,
        timeout_s: float = 20.0,
    ) -> None:
        self.rank = rank
        self.peer = 1 - rank
        self.device = device
        self.backend = backend
        self._pending: list[dist.Work] = []
        self._keep: list[torch.Tensor] = []
        try:
            dist.init_process_group(
                backend,
                store=dist.PrefixStore(f"epoch{epoch}", store),
                rank=rank,
                world_size=2,
                timeout=timedelta(seconds=timeout_s),
            )
            # One group per direction: with NCCL each group has its own stream, so a verdict
            # travelling one way never queues behind a draft payload travelling the other.
            self.groups = {"drafts": dist.new_group([0, 1]), "verdicts": dist.new_group([0, 1])}
        except Exception as exc:  # the peer never arrived
            raise DataPlaneError(f"data plane epoch {epoch} did not form: {exc}") from exc

    def _send(self, tensors: list[torch.Tensor], channel: str) -> None:
        try:
            for work in self._pending:
                work.wait()
            group = self.groups[channel]
            works = [dist.isend(t.contiguous(), self.peer, group=group) for t in tensors]
            self._pending = [w for w in works if w is not None]
            self._keep = tensors  # alive until the isends complete
        except Exception as exc:
            raise DataPlaneError(f"send to peer failed: {exc}") from exc

    def _recv(self, shape: tuple[int, ...], dtype: torch.dtype, channel: str) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        try:
            dist.recv(buf, self.peer, group=self.groups[channel])
        except Exception as exc:
            raise DataPlaneError(f"receive from peer failed: {exc}") from exc
        return buf

    def _header(self, *values: int) -> torch.Tensor:
        head = torch.zeros(_HEADER, dtype=torch.int64)
        head[: len(values)] = torch.tensor(values, dtype=torch.int64)
        return to_device(head, self.device)

    def _ids(self, seq_ids: list[int]) -> torch.Tensor:
        return to_device(torch.tensor(seq_ids, dtype=torch.int64), self.device)

    def send_drafts(self, payload: DraftPayload) -> None:
        batch, k = payload.tokens.shape
        probs = payload.probs
        vocab = probs.shape[-1] if probs is not None else 0
        ids = self._ids(payload.seq_ids)
        tensors = [self._header(payload.step, batch, k, int(probs is not None), vocab),
                   torch.cat((ids, payload.tokens.to(self.device, torch.int64).reshape(-1)))]
        if probs is not None:
            tensors.append(probs.to(self.device, torch.float32))
        self._send(tensors, "drafts")

    def recv_drafts(self) -> DraftPayload:
        step, batch, k, has_probs, vocab, _ = self._recv((_HEADER,), torch.int64, "drafts").tolist()
        ints = self._recv((batch * (1 + k),), torch.int64, "drafts")
        probs = self._recv((batch, k, vocab), torch.float32, "drafts") if has_probs else None
        return DraftPayload(step, ints[:batch].tolist(), ints[batch:].view(batch, k), probs)

    def send_verdict(self, payload: VerdictPayload) -> None:
        batch, width = payload.tokens.shape
        ids = self._ids(payload.seq_ids)
        body = torch.cat((ids, payload.accepted.to(self.device, torch.int64),
                          payload.tokens.to(self.device, torch.int64).reshape(-1)))
        self._send([self._header(payload.step, batch, width - 1), body], "verdicts")

    def recv_verdict(self) -> VerdictPayload:
        step, batch, k, *_ = self._recv((_HEADER,), torch.int64, "verdicts").tolist()
        body = self._recv((batch * (k + 3),), torch.int64, "verdicts")
        return VerdictPayload(step, body[:batch].tolist(), body[2 * batch :].view(batch, k + 1),
                              body[batch : 2 * batch])

    def close(self) -> None:
        try:
            for work in self._pending:
                work.wait()
        except Exception:
            pass
        if dist.is_initialized():
            dist.destroy_process_group()
