"""Verifying drafts that are still in flight: the verify is queued before the draft frame reaches the host.

Without this, a verify plan whose drafts come over the data plane first waits on the host for the frame
(`DataPlane.recv_drafts`: the header is read back), and only then builds the step's inputs and queues it,
so the GPU idles through that preparation once the drafts are in. In sequential SD with the draft service
on its own GPU that is every cycle: the verifier can do nothing but wait while the draft model drafts.
When the receive of the frame is already posted (`VerifierExecutor._hand_on`), the verify can instead
read the drafts as device tokens from the posted frame: the stream waits for the receive, the host does
not, so the inputs are built and the step queued while the draft GPU is still drafting, and the verify
starts as soon as the drafts land.

The frame's layout must then be known before it arrives: the rows are the drafting plan's draft batch in
its order, each with that plan's k drafts, and the draft probabilities [B, k, V] follow it when a row samples
(their width V as an earlier frame of the link told it). So only what `device_rows` allows takes this path
(steady rows without a grammar; sampled ones not under tensor parallelism), and only the plan right after the
drafting plan that verifies exactly its draft batch with k fixed (no TETRIS selection, whose lengths are
read on the host). The header travels with the frame and is checked once it is read back, before the step
commits; a mismatch (which these rules exclude) is reported as a broken data plane and the draft service
re-synced. Greedy verification is exact for any drafts, so even then no output token is wrong; a sampled
step is judged again without drafts, since its verdict is exact only with the drafts' true probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass

from minedraft.engine.drafter import Proposal
from minedraft.engine.readback import Readback, device_mark
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.verifier.device_rows import device_rows, samples
from minedraft.worker.data_frames import expected_header
from minedraft.worker.data_plane import DataPlane


@dataclass(frozen=True, slots=True)
class DraftedBatch:
    """What a plan asked the draft service to draft: the frame the plan after it verifies."""

    step: int
    ids: tuple[int, ...]
    k: int
    selected: bool  # TETRIS-selected drafts: ragged rows whose lengths are read on the host

    @classmethod
    def of(cls, plan: control_pb2.StepPlan) -> DraftedBatch:
        return cls(plan.step, tuple(plan.draft_batch), plan.k, plan.draft_budget > 0)


@dataclass(slots=True)
class PostedProposal:
    """Drafts read from a posted frame on the device, with the header to check once it is read back."""

    ids: list[int]
    proposal: Proposal
    header: Readback
    expected_header: list[int]

    def proposal_for(self, ids: list[int]) -> Proposal:
        """The drafts, for the verify batch the plan's membership left (the rules make it the drafted one)."""
        if ids != self.ids:
            raise RuntimeError(f"a verify of {ids[:8]} took the drafts of {self.ids[:8]}")
        return self.proposal

    @property
    def sampled(self) -> bool:
        """A row samples: the drafts' probabilities came with them, and a broken step is judged again."""
        return self.proposal.probs is not None

    def mismatch(self, step: int) -> str:
        return mismatch(step, self.header.tolist(), self.expected_header)

    def broken(self, plane: DataPlane | None) -> bool:
        """Whether the frame was not the expected one (or the data plane was aborted while it was in flight)."""
        return self.header.tolist() != self.expected_header or bool(getattr(plane, "aborted", False))


def posted_ids(worker: Verifier, drafted: DraftedBatch, plan: control_pb2.StepPlan, sampled: bool = True
               ) -> list[int] | None:
    """The plan's verify batch when its drafts may be taken from the posted frame, else None (checked before
    the plan's membership is applied: its removals must spare the batch; `sampled`: rows that sample may)."""
    ids = list(plan.verify_batch)
    if plan.step != drafted.step + 1 or not plan.with_drafts or drafted.selected or drafted.k < 1:
        return None
    if not ids or tuple(ids) != drafted.ids or not set(plan.remove).isdisjoint(ids):
        return None
    return ids if device_rows(worker, ids, sampled) else None


def take_posted(worker: Verifier, plane: DataPlane, drafted: DraftedBatch, plan: control_pb2.StepPlan,
                sampled: bool = True) -> PostedProposal | None:
    """The plan's drafts as device tokens (and probabilities) from the posted frame, when `posted_ids` allows
    and a receive is posted that the payload fits; None otherwise (the frame is then read on the host)."""
    ids = posted_ids(worker, drafted, plan, sampled)
    return take_drafts(worker, plane, ids, drafted.step, drafted.k) if ids is not None else None


def take_drafts(worker: Verifier, plane: DataPlane, ids: list[int], step: int, k: int) -> PostedProposal | None:
    """The posted frame's drafts of these rows (drafted at `step`) as a proposal on the device, with its header
    to read back once they are in and what it must hold; None when the plane cannot give them unread
    (launch_ahead.py takes them the same way)."""
    posted = plane.take_posted_drafts(len(ids), k, samples(worker, ids))
    if posted is None:
        return None
    header = Readback(posted.header)  # ready once the drafts are in, before the verify runs
    # A frame cut short by an abort holds garbage: keep every id valid (the step is reported lost at commit, and
    # a sampled one judged again without drafts).
    proposal = Proposal(posted.tokens.clamp(0, worker.vocab_size - 1), posted.probs)
    return PostedProposal(ids, proposal, header, expected_header(step, ids, k, vocab_of(proposal)))


def vocab_of(proposal: Proposal) -> int:
    """The width of the proposal's draft probabilities (0: an all-greedy batch has none), as its header says."""
    return proposal.probs.shape[-1] if proposal.probs is not None else 0


def judged_without_drafts(worker: Verifier, ids: list[int], send_verdict: bool) -> Readback:
    """A sampled step whose frame was broken: its verdict used probabilities that may not be the drafts' (an
    aborted receive leaves garbage behind), and sampled verification is exact only with the true ones, so the
    step is judged again as plain AR, whose one token per row is the target's own draw. Sampled rows take
    this path only without tensor parallelism, so no follower has to judge again."""
    started = device_mark(worker.runner.device)
    verdict = worker.judge(ids, None)
    if send_verdict:
        worker.runner.take_hidden(ids)  # an EAGLE head's states of this judge: the plane is gone, none go out
    return worker.read_back(verdict, started)


def mismatch(step: int, header: list[int], expected: list[int]) -> str:
    """What to log when a verify used drafts of a frame that was not the expected one."""
    return (f"step {step} verified drafts whose header {header[:8]} is not the expected {expected[:8]}; "
            "re-syncing the draft service")
