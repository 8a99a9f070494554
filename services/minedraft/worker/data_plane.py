"""Token payloads between the draft service and the verifier over torch.distributed.

Rank 0 is the verifier (it hosts the rendezvous store for the life of the process),
rank 1 the draft service. Each (re-)formation of the pair is an *epoch* with its own key
prefix in the store, so a restarted draft service can join a fresh process group while
the verifier keeps running. Sends are asynchronous (isend) and waited on only before the
next send, so neither side blocks on the other's receive.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch
import torch.distributed as dist

from minedraft.core.errors import MinedraftError
from minedraft.engine.hidden_rows import HiddenRows
from minedraft.engine.tetris import ragged_lengths
from minedraft.engine.transfer import to_device
from minedraft.worker.data_frames import (
    FRAME_SLOTS,
    HEADER_SLOTS,
    HIDDEN_DTYPES,
    DraftPayload,
    PostedDrafts,
    PostedVerdict,
    VerdictPayload,
    posted_verdict,
    verdict_slots,
)
from minedraft.worker.nccl_report import nccl_log
from minedraft.worker.rendezvous import bare_group

log = logging.getLogger(__name__)
VERIFIER_RANK = 0
DRAFT_RANK = 1


class DataPlaneError(MinedraftError):
    """The peer is gone or the transport failed; the caller falls back."""


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
        manager_run: str = "",
    ) -> None:
        self.rank = rank
        self.epoch = epoch
        self.aborted = False  # set by `abort`, from any thread
        self.peer = 1 - rank
        self.device = device
        self.backend = backend
        self._pending: list[dist.Work] = []
        self._keep: list[torch.Tensor] = []
        self._posted: dict[str, tuple[torch.Tensor, dist.Work]] = {}  # a frame's receive per channel, queued early
        self.verdict_states: tuple[int, int] | None = None  # the head's states' width and dtype code, once seen
        self.draft_vocab: int | None = None  # the width of the draft probabilities, once a frame with them is read
        report = nccl_log() if backend == "nccl" else None
        report_start = report.mark() if report is not None else 0
        try:
            # One group per direction: with NCCL each group has its own stream, so a verdict travelling one
            # way never queues behind a draft payload travelling the other. Bare backends, not registered with
            # torch.distributed: an epoch's groups are dropped (or aborted) without touching any global state.
            self.groups = {name: bare_group(backend, dist.PrefixStore(f"{manager_run}/epoch{epoch}/{name}", store),
                                            rank, 2, timedelta(seconds=timeout_s), f"data-plane-{epoch}-{name}")
                           for name in ("drafts", "verdicts")}
            self._connect_channels()
        except Exception as exc:  # the peer never arrived
            raise DataPlaneError(f"data plane epoch {epoch} did not form: {exc}") from exc
        # What the link runs over: "gloo", or NCCL's own word for it ("P2P", "SHM", "NET").
        self.transport = report.transport_since(report_start) if report is not None else backend

    def _connect_channels(self) -> None:
        """One tiny message each way now: NCCL connects peers lazily, so this moves the connection
        out of the first step and has NCCL report the transport while the plane forms."""
        token = torch.zeros(1, dtype=torch.int64, device=self.device)
        drafts, verdicts = self.groups["drafts"], self.groups["verdicts"]
        if self.rank == VERIFIER_RANK:
            drafts.recv([token], self.peer, 0).wait()
            verdicts.send([token], self.peer, 0).wait()
        else:
            drafts.send([token], self.peer, 0).wait()
            verdicts.recv([token], self.peer, 0).wait()
        if token.is_cuda:
            torch.cuda.synchronize(token.device)

    def _send(self, tensors: list[torch.Tensor], channel: str) -> None:
        try:
            for work in self._pending:
                work.wait()
            group = self.groups[channel]
            tensors = [t.contiguous() for t in tensors]
            self._pending = [group.send([t], self.peer, 0) for t in tensors]
            self._keep = tensors  # alive until the sends complete
        except Exception as exc:
            raise DataPlaneError(f"send to peer failed: {exc}") from exc

    def _recv(self, shape: tuple[int, ...], dtype: torch.dtype, channel: str) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        try:
            self.groups[channel].recv([buf], self.peer, 0).wait()
        except Exception as exc:
            raise DataPlaneError(f"receive from peer failed: {exc}") from exc
        return buf

    def _send_frame(self, header: list[int], body: torch.Tensor, channel: str,
                    extra: list[torch.Tensor] | None = None) -> None:
        """Header and int64 body in one fixed-size message (what does not fit follows it), so
        the receiver needs one receive and one host synchronisation per payload."""
        head = torch.zeros(HEADER_SLOTS, dtype=torch.int64)
        head[: len(header)] = torch.tensor(header, dtype=torch.int64)
        head[HEADER_SLOTS - 1] = body.numel()
        room = FRAME_SLOTS - HEADER_SLOTS
        first = body[:room]
        frame = torch.cat((to_device(head, self.device), first,
                           torch.zeros(room - first.numel(), dtype=torch.int64, device=self.device)))
        tensors = [frame] + ([body[room:]] if body.numel() > room else []) + (extra or [])
        self._send(tensors, channel)

    def post_drafts_receive(self) -> None:
        """Queue the receive of the next draft frame now. With NCCL it waits behind the work already on
        the stream (it starts once the verify kernels are done, so it takes no SMs from them, and finds
        the drafts waiting); `recv_drafts` or `take_posted_drafts` then only wait for it. An unanswered
        one dies with the process group (`close`)."""
        self._post_receive("drafts")

    def post_verdict_receive(self) -> None:
        """The draft service's twin of `post_drafts_receive` (read by `recv_verdict` or `take_posted_verdict`)."""
        self._post_receive("verdicts")

    def can_take_verdict(self, batch: int, k: int, hidden: bool = False) -> bool:
        """Whether `take_posted_verdict` will give a verdict of `batch` rows of width k + 1 (with `hidden`, and
        the head's states, whose width and dtype an earlier verdict told)."""
        fits = verdict_slots(batch, k, hidden) <= FRAME_SLOTS - HEADER_SLOTS
        return "verdicts" in self._posted and fits and (not hidden or self.verdict_states is not None)

    def _post_receive(self, channel: str) -> None:
        if channel in self._posted:
            return
        frame = torch.empty(FRAME_SLOTS, dtype=torch.int64, device=self.device)
        try:
            self._posted[channel] = (frame, self.groups[channel].recv([frame], self.peer, 0))
        except Exception as exc:
            raise DataPlaneError(f"receive from peer failed: {exc}") from exc

    def take_posted_drafts(self, batch: int, k: int, sampled: bool = False) -> PostedDrafts | None:
        """The posted draft frame as device views, for a verify queued before the frame is read on the
        host (launch-ahead): its tokens [batch, k] (the stream waits for the receive, the host does
        not) and its header + sequence ids, which the caller checks once it reads them back. With `sampled`
        (a row of the batch samples, so the draft probabilities [batch, k, vocab] follow the frame) their
        receive is queued too, the same way. None when no receive is posted, the payload would not fit one
        frame, or the probabilities' width is not known yet (no frame with them has been read)."""
        if "drafts" not in self._posted or batch + batch * k > FRAME_SLOTS - HEADER_SLOTS:
            return None
        if sampled and self.draft_vocab is None:
            return None
        frame = self._claim_posted("drafts")
        tokens = frame[HEADER_SLOTS + batch : HEADER_SLOTS + batch + batch * k].view(batch, k)
        probs = self._recv((batch, k, self.draft_vocab), torch.float32, "drafts") if sampled else None
        return PostedDrafts(tokens, frame[: HEADER_SLOTS + batch], probs)

    def take_posted_verdict(self, batch: int, k: int, hidden: bool = False) -> PostedVerdict | None:
        """The posted verdict frame as device views (accepted counts, token rows, header), for drafts
        queued before the verdict is read on the host; None when no receive is posted or a verdict of
        `batch` rows of width k + 1 would not fit one frame. With `hidden`, also the head's states of
        every row's k + 1 verified positions, received after it (the caller has made sure that is what
        the verifier sends: a receive of another size would not match its send)."""
        if not self.can_take_verdict(batch, k, hidden):
            return None
        frame = self._claim_posted("verdicts")
        states = None
        if hidden:
            assert self.verdict_states is not None
            width, code = self.verdict_states
            states = self._recv((batch * (k + 1), width), HIDDEN_DTYPES[code], "verdicts")
        return posted_verdict(frame, batch, k, states)

    def _claim_posted(self, channel: str) -> torch.Tensor:
        """The posted frame, once its receive is waited on (NCCL: by the stream; gloo: by this thread)."""
        frame, work = self._posted.pop(channel)
        try:
            work.wait()
        except Exception as exc:
            raise DataPlaneError(f"receive from peer failed: {exc}") from exc
        return frame

    def _take_frame(self, channel: str) -> torch.Tensor:
        if channel not in self._posted:
            return self._recv((FRAME_SLOTS,), torch.int64, channel)
        return self._claim_posted(channel)

    def _recv_frame(self, channel: str) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(header, the body on the host, the body on the device): one copy to the host."""
        frame = self._take_frame(channel)
        host = frame.cpu()
        self.check()
        header = host[:HEADER_SLOTS].tolist()
        length = header[HEADER_SLOTS - 1]
        room = FRAME_SLOTS - HEADER_SLOTS
        body = frame[HEADER_SLOTS : HEADER_SLOTS + min(length, room)]
        if length > room:
            rest = self._recv((length - room,), torch.int64, channel)
            body = torch.cat((body, rest))
            host = torch.cat((host, rest.cpu()))
        return header, host[HEADER_SLOTS : HEADER_SLOTS + length], body

    def _ids(self, seq_ids: list[int]) -> torch.Tensor:
        return to_device(torch.tensor(seq_ids, dtype=torch.int64), self.device)

    def send_drafts(self, payload: DraftPayload) -> None:
        batch, k = payload.tokens.shape
        probs = payload.probs
        vocab = probs.shape[-1] if probs is not None else 0
        body = torch.cat((self._ids(payload.seq_ids), payload.tokens.to(self.device, torch.int64).reshape(-1)))
        extra = [probs.to(self.device, torch.float32)] if probs is not None else None
        self._send_frame([payload.step, batch, k, int(probs is not None), vocab], body, "drafts", extra)

    def recv_drafts(self) -> DraftPayload:
        (step, batch, k, has_probs, vocab, _), host, body = self._recv_frame("drafts")
        probs = self._recv((batch, k, vocab), torch.float32, "drafts") if has_probs else None
        if has_probs:
            self.draft_vocab = vocab
        lengths = ragged_lengths(host[batch:].view(batch, k))  # TETRIS rows: their verified drafts
        return DraftPayload(step, host[:batch].tolist(), body[batch:].view(batch, k), probs, lengths)

    def send_verdict(self, payload: VerdictPayload) -> None:
        batch, width = payload.tokens.shape
        parts = [self._ids(payload.seq_ids), payload.accepted.to(self.device, torch.int64),
                 payload.tokens.to(self.device, torch.int64).reshape(-1)]
        header = [payload.step, batch, width - 1]
        extra = None
        if payload.hidden is not None:  # an EAGLE head's states: runs per row, then the rows themselves
            hidden = payload.hidden
            rows = hidden.rows if hidden.rows.dtype in HIDDEN_DTYPES else hidden.rows.float()
            parts.append(self._ids([*hidden.starts, *hidden.counts, HIDDEN_DTYPES.index(rows.dtype)]))
            header += [int(rows.shape[1]), int(rows.shape[0])]
            extra = [rows.to(self.device)] if rows.shape[0] else None
        self._send_frame(header, torch.cat(parts), "verdicts", extra)

    def recv_verdict(self) -> VerdictPayload:
        # The draft service reads tokens on the host only, so they stay there; hidden states stay on the device.
        (step, batch, k, width, count, _), host, _ = self._recv_frame("verdicts")
        tokens_end = 2 * batch + batch * (k + 1)
        hidden = None
        if width:
            runs = host[tokens_end:tokens_end + 2 * batch + 1].tolist()
            dtype = HIDDEN_DTYPES[runs[-1]]
            rows = (self._recv((count, width), dtype, "verdicts") if count
                    else torch.zeros((0, width), dtype=dtype, device=self.device))
            hidden = HiddenRows(runs[:batch], runs[batch:2 * batch], rows)
            self.verdict_states = (width, runs[-1])
        return VerdictPayload(step, host[:batch].tolist(), host[2 * batch:tokens_end].view(batch, k + 1),
                              host[batch : 2 * batch], hidden)

    def abort(self) -> None:
        """From any thread, when the peer is known dead: NCCL never notices a dead peer (a receive waits for
        the communicator's timeout, and the stream waits with it), so the epoch's communicators are aborted,
        which ends the pending operations; every receive then raises DataPlaneError. Gloo fails on its own
        once the peer's socket closes."""
        self.aborted = True
        if self.backend != "nccl":
            return
        for group in list(self.groups.values()):
            try:
                group.abort()
            except Exception as exc:  # already gone: nothing left to unblock
                log.warning("aborting a data-plane communicator: %s", exc)

    def check(self) -> None:
        """Raise when the plane was aborted: whatever a receive returned since is not the peer's."""
        if self.aborted:
            raise DataPlaneError(f"data plane epoch {self.epoch} aborted: the draft service is gone")

    def close(self) -> None:
        self._posted.clear()  # an unanswered receive dies with the communicators below
        try:
            for work in [] if self.aborted else self._pending:
                work.wait()
        except Exception:
            pass
        self._pending, self._keep = [], []
        for group in self.groups.values():
            if not self.aborted and hasattr(group, "shutdown"):
                try:
                    group.shutdown()  # NCCL: free the communicators now (an aborted one is left to its destructor)
                except Exception as exc:
                    log.warning("closing a data-plane communicator: %s", exc)
        self.groups = {}
