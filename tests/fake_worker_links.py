"""In-memory stand-ins for the two worker processes, behind the step driver's `WorkerLink`.

They are test doubles of network peers, not of the code under test: the batch manager's
real step loop, admission and draft supervisor talk to them exactly as to the gRPC links.
The verifier runs a scripted "model" (the greedy next token is `true_next(tokens)`), the
draft service proposes k tokens of which the first `accept(seq_id, step)` are right, and
the two share a fake data plane that carries drafts one way and verdicts the other, with
the real workers' rules: a verify batch's drafts come from the previous step, a lost peer
turns the step into plain decoding and is reported as `data_plane_lost`, a plan that asks
to verify or draft a sequence the worker does not hold is an error.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from minedraft.batch_manager.link import EventHandler, LostHandler
from minedraft.proto import control_pb2

VOCAB = 64
EOS = 1


def true_next(tokens: list[int]) -> int:
    """The verifier's greedy choice after `tokens` (never EOS, so tests choose when to stop)."""
    return (tokens[-1] * 7 + len(tokens) * 3) % (VOCAB - 2) + 2


def greedy(prompt: list[int], n: int) -> list[int]:
    """What plain autoregressive decoding of the scripted model gives: the expected output."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(true_next(tokens))
    return tokens[len(prompt):]


@dataclass
class FakeDataPlane:
    """One epoch's process group: drafts[step][seq] and verdicts[step][seq] in flight."""

    epoch: int
    drafts: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    verdicts: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    broken: bool = False


@dataclass
class FakeCluster:
    """What the two fake workers share: the data plane and the rendezvous of each epoch."""

    plane: FakeDataPlane | None = None
    joined: dict[int, set[str]] = field(default_factory=dict)
    workers: list[FakeWorkerLink] = field(default_factory=list)


class FakeWorkerLink(ABC):
    """The link and the worker behind it: plans are executed when sent, events delivered on
    the next event-loop turns (a network peer never answers inside `send`)."""

    role = ""

    def __init__(self, cluster: FakeCluster, num_blocks: int = 256) -> None:
        self.cluster = cluster
        self.num_blocks = num_blocks
        self.seqs: dict[int, list[int]] = {}  # committed tokens of every sequence this worker holds
        self.plans: list[control_pb2.StepPlan] = []  # every plan received, in order
        self.setups: list[control_pb2.DataPlaneSetup] = []
        self.aborts: list[control_pb2.DataPlaneAbort] = []
        self.streams_opened = 0
        self.up = asyncio.Event()
        self.up.set()
        self._handlers: tuple[EventHandler, LostHandler] | None = None
        self._stream = 0
        self._pause_at: int | None = None
        self._held: list[control_pb2.WorkerEvent] = []
        self.paused = asyncio.Event()

    # ----- WorkerLink ---------------------------------------------------------------------

    async def info(self, timeout: float = 5.0) -> control_pb2.WorkerInfo:
        await asyncio.wait_for(self.up.wait(), timeout)
        return control_pb2.WorkerInfo(role=self.role, vocab_size=VOCAB, max_context=512, num_blocks=self.num_blocks,
                                      block_size=16, sequences=len(self.seqs), eos_token_ids=[EOS],
                                      data_plane_addr="fake", data_plane_port=1)

    async def open(self, on_event: EventHandler, on_lost: LostHandler) -> None:
        self._stream += 1
        self.streams_opened += 1
        self.seqs.clear()  # a new stream resets the worker, as the real servicer does
        self._handlers = (on_event, on_lost)
        if not self.up.is_set():
            self._end_stream()

    def send(self, msg: control_pb2.ControlMessage) -> None:
        if self._handlers is None or not self.up.is_set():
            return
        if msg.WhichOneof("body") == "setup":
            self.setups.append(msg.setup)
            self._join(msg.setup)
            return
        if msg.WhichOneof("body") == "abort":
            self.aborts.append(msg.abort)
            return
        self.plans.append(msg.plan)
        event = self.execute(msg.plan)
        if self._pause_at is not None and msg.plan.step >= self._pause_at:
            self._held.append(event)
            self.paused.set()
        else:
            self._emit(event)

    async def close_stream(self) -> None:
        self._handlers = None
        self._stream += 1

    async def close(self) -> None:
        await self.close_stream()

    # ----- test controls ------------------------------------------------------------------

    def pause_at(self, step: int) -> None:
        """Hold the events of plan `step` and later ones (the worker is slow) until `resume`."""
        self._pause_at = step
        self.paused.clear()

    def crash(self) -> None:
        """The worker process dies: its stream ends and its memory is gone."""
        self.up.clear()
        self.seqs.clear()
        self._end_stream()

    def resume(self) -> None:
        self._pause_at = None
        held, self._held = self._held, []
        for event in held:
            self._emit(event)

    # ----- the worker ---------------------------------------------------------------------

    @abstractmethod
    def execute(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        """This worker's half of one step plan (FakeVerifier, FakeDraft)."""

    def _membership(self, plan: control_pb2.StepPlan) -> None:
        for seq_id in plan.remove:
            self.seqs.pop(seq_id, None)
        for spec in plan.add:
            self.seqs[spec.seq_id] = list(spec.tokens)

    def _plane(self) -> FakeDataPlane | None:
        plane = self.cluster.plane
        return plane if plane is not None and not plane.broken else None

    def _join(self, setup: control_pb2.DataPlaneSetup) -> None:
        """Both workers must join an epoch before either answers (the process group forms)."""
        self.forget_pending()
        joined = self.cluster.joined.setdefault(setup.epoch, set())
        joined.add(self.role)
        if joined == {"verifier", "draft"}:
            self.cluster.plane = FakeDataPlane(setup.epoch)
            for worker in self.cluster.workers:
                worker._emit(control_pb2.WorkerEvent(step=-1, setup_done=True, transport="gloo", epoch=setup.epoch))

    @abstractmethod
    def forget_pending(self) -> None:
        """A new data plane starts with nothing in flight."""

    def _emit(self, event: control_pb2.WorkerEvent) -> None:
        stream = self._stream
        asyncio.get_running_loop().call_soon(self._deliver, stream, event)

    def _deliver(self, stream: int, event: control_pb2.WorkerEvent) -> None:
        if self._handlers is not None and stream == self._stream:
            self._handlers[0](event)

    def _end_stream(self) -> None:
        handlers, self._handlers = self._handlers, None
        self._stream += 1
        if handlers is not None:
            asyncio.get_running_loop().call_soon(handlers[1])


class FakeVerifier(FakeWorkerLink):
    """Verifies with the scripted model; drafts (if any) come from the previous step's payload."""

    role = "verifier"

    def __init__(self, cluster: FakeCluster, num_blocks: int = 256) -> None:
        super().__init__(cluster, num_blocks)
        self.drafts_pending = False

    def forget_pending(self) -> None:
        self.drafts_pending = False

    def execute(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        event = control_pb2.WorkerEvent(step=plan.step)
        drafts: dict[int, list[int]] | None = None
        if self.drafts_pending:
            plane = self._plane()
            if plane is None:
                event.data_plane_lost = True
            else:
                drafts = plane.drafts.pop(plan.step - 1, {})
        self.drafts_pending = plan.with_drafts and len(plan.draft_batch) > 0 and self._plane() is not None
        self._membership(plan)
        ids = [s for s in plan.verify_batch if s in self.seqs]
        event.timing.batch = len(ids)  # as the real verifier reports it
        verdicts: dict[int, list[int]] = {}
        for seq_id in ids:
            proposal = drafts.get(seq_id) if drafts is not None and plan.with_drafts else None
            if drafts is not None and plan.with_drafts and proposal is None:
                event.error = f"plan asks to verify sequence {seq_id} that was not drafted"
                return event
            truth = greedy(self.seqs[seq_id], len(proposal) + 1 if proposal else 1)
            accepted = 0
            while proposal and accepted < len(proposal) and proposal[accepted] == truth[accepted]:
                accepted += 1
            tokens = truth[: accepted + 1]
            self.seqs[seq_id] += tokens
            verdicts[seq_id] = tokens
            event.verdicts.seq_ids.append(seq_id)
            event.verdicts.counts.append(len(tokens))
            event.verdicts.accepted.append(accepted)
            event.verdicts.tokens.extend(tokens)
        plane = self._plane()
        if plan.send_verdict and len(plan.verify_batch) > 0:
            if plane is None:
                event.data_plane_lost = True
            else:
                plane.verdicts[plan.step] = verdicts
        return event


class FakeDraft(FakeWorkerLink):
    """Drafts k tokens per sequence: the first `accept(seq_id, step)` right, then wrong ones."""

    role = "draft"

    def __init__(self, cluster: FakeCluster, accept: Callable[[int, int], int], num_blocks: int = 256) -> None:
        super().__init__(cluster, num_blocks)
        self.accept = accept
        self.verdict_pending = False

    def forget_pending(self) -> None:
        self.verdict_pending = False

    def execute(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        event = control_pb2.WorkerEvent(step=plan.step)
        self._membership(plan)
        plane = self._plane()
        if self.verdict_pending:
            if plane is None:
                event.data_plane_lost = True
                return event
            for seq_id, tokens in plane.verdicts.pop(plan.step - 1, {}).items():
                if seq_id in self.seqs:
                    self.seqs[seq_id] += tokens
        self.verdict_pending = plan.send_verdict and len(plan.verify_batch) > 0
        if plan.with_drafts and len(plan.draft_batch) > 0 and plane is not None:
            drafts = {}
            event.timing.batch = len(plan.draft_batch)
            for seq_id in plan.draft_batch:
                if seq_id not in self.seqs:
                    event.error = f"plan asks to draft sequence {seq_id} this worker does not hold"
                    return event
                right = min(self.accept(seq_id, plan.step), plan.k)
                guess = greedy(self.seqs[seq_id], plan.k)
                drafts[seq_id] = guess[:right] + [(t + 1) % VOCAB for t in guess[right:]]
            plane.drafts[plan.step] = drafts
        return event

    def kill(self) -> None:
        """The draft process dies: its stream ends, the data plane breaks, its memory is gone."""
        if self.cluster.plane is not None:
            self.cluster.plane.broken = True
        self.verdict_pending = False
        self.crash()

    def restart(self) -> None:
        self.up.set()


def fake_pair(accept: Callable[[int, int], int] | None) -> tuple[FakeVerifier, FakeDraft | None]:
    """A verifier and (unless `accept` is None) a draft service over one fake data plane."""
    cluster = FakeCluster()
    verifier = FakeVerifier(cluster)
    draft = FakeDraft(cluster, accept) if accept is not None else None
    cluster.workers = [verifier] if draft is None else [verifier, draft]
    return verifier, draft
