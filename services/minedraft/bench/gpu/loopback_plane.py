"""The draft service's end of the data plane, inside the verifier's process, for the PSD step cell.

In PSD the verifier judges one batch while the draft service drafts the other; the next plan's drafts
arrive in a receive posted on the GPU stream, so the verifier queues the next verify before it reads this
one back (verifier/launch_ahead.py). To time that loop on one GPU without a draft service, this object
answers the verifier executor's data-plane calls as a link whose drafts are always there: each batch's
drafts are fixed tokens already on the device (with fixed probabilities when the rows sample), and a posted
frame's header says what the draft service's would (the step that drafted it, the batch, k, whether
probabilities follow and their width, the sequence ids), so the executor's own checks of it pass or fail
exactly as on a real link. Verdicts are not sent: the cell's plans ask for none.

With `land_ms` (CUDA) a frame lands that long after the work queued before its receive was posted: a side
stream waits for the verifier's stream there, as NCCL's does, then sleeps, and a verify that takes the frame
waits for it on the device, a host that reads it waits on the host. In sequential SD with the draft service on
its own GPU ("sd2" cell) that is the draft GPU's k forwards after the verdict: the verifier's host work between
two verifies can hide behind them, as it does on two GPUs.

`LoopbackVerdicts` is the verifier's end for the draft side of PSD (the "psd-draft" cell): the draft service
drafts each batch from the verdict on its device, queued before the previous plan's drafts are read back
(draft_service/launch_ahead.py), so the verdict a posted receive gets is a fixed frame per batch already on the
device (each row accepting a fixed number of its drafts), its step set as the receive lands.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from minedraft.bench.gpu.blocked_gpu import sleep_cycles
from minedraft.draft_service.launch_ahead import AwaitedVerdict
from minedraft.engine.transfer import to_device
from minedraft.verifier.posted_drafts import DraftedBatch
from minedraft.worker.data_frames import (
    FRAME_SLOTS,
    DraftPayload,
    PostedDrafts,
    PostedVerdict,
    VerdictPayload,
    expected_header,
    expected_verdict_header,
    posted_verdict,
)


class LoopbackDrafts:
    """Stands where `VerifierExecutor.plane` (worker/data_plane.DataPlane) does; `drafted()` is what the executor
    expects the next frame to hold when it posts a receive (`VerifierExecutor.drafted`), and the frames are taken
    in the order their receives were posted, as on the real link."""

    backend = "nccl"  # receives are posted on the stream, as over NCCL
    transport = "loopback"
    epoch = 0
    aborted = False

    def __init__(self, drafts: dict[tuple[int, ...], torch.Tensor], drafted: Callable[[], DraftedBatch | None],
                 device: torch.device, land_ms: float = 0.0,
                 probs: dict[tuple[int, ...], torch.Tensor] | None = None) -> None:
        self.drafts = drafts  # per batch (its sequence ids in order): [B, k] token ids on the device
        self.probs = probs  # ... and, for sampled rows, their [B, k, V] draft probabilities
        self.drafted = drafted
        self.device = device
        self.land_cycles = sleep_cycles(land_ms) if land_ms > 0 and device.type == "cuda" else 0
        self.side = torch.cuda.Stream(device) if self.land_cycles else None  # where the frames "travel"
        # posted frames: drafting step, batch, k, and the event of its landing (None: there at once)
        self.queue: deque[tuple[int, list[int], int, torch.cuda.Event | None]] = deque()
        self.posted = 0  # receives posted so far
        self.taken = 0  # ... of which a verify read on the device (launched ahead, or queued before the frame)
        self.received = 0  # drafts read on the host first (the ordinary path)

    def _landing(self) -> torch.cuda.Event | None:
        """With a landing time: the side stream waits for the work queued so far, sleeps, and marks the landing."""
        if self.side is None:
            return None
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(self.land_cycles)
            landed = torch.cuda.Event()
            landed.record()
        return landed

    def post_drafts_receive(self) -> None:
        drafted = self.drafted()
        assert drafted is not None, "a receive is posted only for drafts on their way"
        self.queue.append((drafted.step, list(drafted.ids), drafted.k, self._landing()))
        self.posted += 1

    def take_posted_drafts(self, batch: int, k: int, sampled: bool = False) -> PostedDrafts | None:
        """The oldest posted frame as device views, when one is posted and holds `batch` rows of k drafts (the
        stream waits for it to land, the host does not), with their probabilities where `sampled` (the link
        must hold them then: a real one has learnt their width)."""
        if not self.queue or (len(self.queue[0][1]), self.queue[0][2]) != (batch, k):
            return None
        if sampled != (self.probs is not None):
            return None
        step, ids, k, landed = self.queue.popleft()
        if landed is not None:
            torch.cuda.current_stream(self.device).wait_event(landed)
        self.taken += 1
        probs = self.probs[tuple(ids)] if self.probs is not None else None
        vocab = probs.shape[-1] if probs is not None else 0
        header = to_device(torch.tensor(expected_header(step, ids, k, vocab), dtype=torch.long), self.device)
        return PostedDrafts(self.drafts[tuple(ids)], header, probs)

    def recv_drafts(self) -> DraftPayload:
        """The oldest posted frame, read on the host once it has landed (every receive is posted first: the
        backend is "nccl")."""
        step, ids, _, landed = self.queue.popleft()
        if landed is not None:
            landed.synchronize()
        self.received += 1
        probs = self.probs[tuple(ids)] if self.probs is not None else None
        return DraftPayload(step, ids, self.drafts[tuple(ids)], probs)

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        """Nothing to tear down: no process group was formed."""


class LoopbackVerdicts:
    """Stands where `DraftExecutor.plane` does; `awaited()` is the verdict the executor awaits (its step and
    batch), of the cell's k drafts per row. Row i of each batch accepts i % (k + 1) of them (k / 2 on average)."""

    backend = "nccl"
    transport = "loopback"
    epoch = 0
    aborted = False
    verdict_states = None  # no EAGLE head's states

    def __init__(self, awaited: Callable[[], AwaitedVerdict | None], k: int, vocab: int, device: torch.device) -> None:
        self.awaited = awaited
        self.k = k
        self.vocab = vocab
        self.device = device
        self.frames: dict[tuple[int, ...], torch.Tensor] = {}  # per batch: its verdict frame on the device
        self.posted = 0  # verdict receives posted
        self.taken = 0  # ... of which drafts queued on the device consumed
        self.received = 0  # verdicts read on the host (the ordinary path)
        self.sent = 0  # draft payloads sent

    def _frame(self) -> tuple[AwaitedVerdict, torch.Tensor]:
        awaited = self.awaited()
        assert awaited is not None, "no verdict is awaited"
        ids, k = tuple(awaited.seq_ids), self.k
        if ids not in self.frames:
            accepted = [i % (k + 1) for i in range(len(ids))]
            tokens = torch.randint(3, self.vocab, (len(ids) * (k + 1),)).tolist()
            body = [*expected_verdict_header(awaited.step, list(ids), k), *accepted, *tokens]
            frame = torch.zeros(FRAME_SLOTS, dtype=torch.int64)
            frame[: len(body)] = torch.tensor(body, dtype=torch.int64)
            self.frames[ids] = to_device(frame, self.device)
        frame = self.frames[ids]
        frame[0].fill_(awaited.step)  # on the stream, as a receive's write would be
        return awaited, frame

    def post_verdict_receive(self) -> None:
        self.posted += 1

    def can_take_verdict(self, batch: int, k: int, hidden: bool = False) -> bool:
        return not hidden and k == self.k

    def take_posted_verdict(self, batch: int, k: int, hidden: bool = False) -> PostedVerdict | None:
        awaited, frame = self._frame()
        if not self.can_take_verdict(batch, k, hidden) or len(awaited.seq_ids) != batch:
            return None
        self.taken += 1
        return posted_verdict(frame, batch, k)

    def recv_verdict(self) -> VerdictPayload:
        """The awaited verdict read on the host (the draft service's ordinary path)."""
        awaited, frame = self._frame()
        posted = posted_verdict(frame, len(awaited.seq_ids), self.k)
        self.received += 1
        return VerdictPayload(awaited.step, list(awaited.seq_ids), posted.tokens.cpu(), posted.accepted.cpu())

    def send_drafts(self, payload: DraftPayload) -> None:
        self.sent += 1

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        """Nothing to tear down: no process group was formed."""
