"""The step loop's side of adaptive k: which k each plan drafts, and what the estimate learns from
the workers' events (the estimate itself: adaptive_k.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from minedraft.batch_manager.adaptive_k import AdaptiveK
from minedraft.batch_manager.step_costs import BucketedCosts

if TYPE_CHECKING:
    from minedraft.proto.control_pb2 import SeqSpec

log = logging.getLogger(__name__)
FINISH_REUSES = 3  # the end rule's k stands for this many more plans of the same batch


def costs_view(costs: BucketedCosts) -> dict[int, dict[int, float]]:
    return {b: {k: round(ms, 3) for k, ms in sorted(t.by_k.items())} for b, t in sorted(costs.buckets.items())}


class PlanK:
    """The step loop's hook: the k each plan drafts (the policy's k; in auto, the adaptive choice in
    1..k) and, from the workers' events, what the adaptive estimate learns.

    A step whose verify (or draft) batch holds a sequence on its first verify (draft) also computes
    that sequence's prompt: its time says nothing about k, so it teaches acceptance but not costs.
    Without this, the prefill at the start of every burst of requests inflates the EMA of the k in
    use and auto wanders off the best k for the next ten or so steps. A step that captured a CUDA
    graph (a shape met for the first time, tens of ms on a GPU) is left out of the costs alike.

    Fused SD (a colocated verifier: one plan verifies the drafts of the plan before, then drafts k
    more) reports one host time for both halves. The draft's GPU work is queued, not waited for, so
    that time holds the previous plan's draft and this plan's verify of those drafts: a whole cycle
    of the k they carried. It is kept as that k's "draft" cost (it grows with k) beside a zero verify
    cost, so the choice weighs the whole cycle (max and sum of the two halves are then the same).

    Auto weighs the end of the batch (adaptive_k.py's T(k)) while no request waits (`queued` False)
    and it knows each sequence's tokens to go (`to_go`); otherwise the steady rate."""

    def __init__(self, fused: Callable[[], bool] = lambda: False, to_go: Callable[[int], int | None] = lambda s: None,
                 queued: Callable[[], bool] = lambda: True) -> None:
        self.fused = fused  # plans now verify and draft one batch (scheduler.py)
        self.to_go = to_go  # a running sequence's tokens still to go (None: unknown)
        self.queued = queued  # requests wait for a place in the batch
        self.adaptive: AdaptiveK | None = None
        self.by_step: dict[int, int] = {}  # k drafted at each recent step (0: no drafts)
        self.unverified: set[int] = set()  # sequences whose prompt the verifier has not computed yet
        self.undrafted: set[int] = set()  # ... the draft service has not
        self.cold: dict[int, tuple[bool, bool]] = {}  # step -> (its verify, its draft) included a prompt
        self.chosen: dict[int, int] = {}  # auto: how many plans drafted each k
        self.finishing = 0  # auto: plans whose k was chosen for the batch's end
        self.finish_kept: dict[tuple[int, int], list[int]] = {}  # batch (size, first sequence) -> [k, reuses left]

    def prompt_chunks(self, step: int) -> None:
        """The plan of `step` computes prompt chunks on both workers: its costs say nothing about k."""
        self.cold[step] = (True, True)

    def for_plan(self, step: int, mode: str, k: int, with_drafts: bool, draft_batch: Sequence[int] = (),
                 verify_batch: Sequence[int] = (), added: Sequence[SeqSpec] = (),
                 redrafted: Sequence[SeqSpec] = (), removed: Sequence[int] = (), k_min: int = 1) -> int:
        """`added`: new sequences (both workers); `redrafted`: re-sent to a recovered draft service;
        auto chooses within k_min..k."""
        self.unverified.update(spec.seq_id for spec in added)
        self.undrafted.update(spec.seq_id for spec in (*added, *redrafted))
        self.forget(removed)
        cold_verify = not self.unverified.isdisjoint(verify_batch)
        cold_draft = with_drafts and not self.undrafted.isdisjoint(draft_batch)
        self.unverified.difference_update(verify_batch)
        if with_drafts:
            self.undrafted.difference_update(draft_batch)
        self.cold[step] = (cold_verify, cold_draft)
        self.cold.pop(step - 16, None)
        chosen = k
        # Every drafting mode teaches the estimate (acceptance by position, the cost of the k in use), so a
        # policy change to auto starts from what the deployment has already measured.
        if self.adaptive is None and (with_drafts or mode == "auto"):
            self.adaptive = AdaptiveK(k_max=k, k_min=min(k_min, k))
        elif self.adaptive is not None and with_drafts and k > self.adaptive.k_max:
            self.adaptive.resize(k, self.adaptive.k_min)  # a fixed k beyond auto's last bounds: its positions too
        if self.adaptive is not None and with_drafts:
            self.adaptive.track(draft_batch)
        if mode == "auto":
            assert self.adaptive is not None
            if (self.adaptive.k_max, self.adaptive.k_min) != (k, min(k_min, k)):
                self.adaptive.resize(k, k_min)
            to_go = {seq_id: self.to_go(seq_id) for seq_id in draft_batch}
            for_the_end = bool(draft_batch) and not self.queued() and None not in to_go.values()
            if for_the_end:
                chosen = self._for_the_end(draft_batch, to_go)  # type: ignore[arg-type]
                self.finishing += with_drafts
            else:
                chosen = self.adaptive.choose(overlapped=True, batch=len(draft_batch))
            if with_drafts:
                self.chosen[chosen] = self.chosen.get(chosen, 0) + 1
                if draft_batch and log.isEnabledFor(logging.DEBUG):  # a plan may only carry removals
                    self._explain(step, chosen, for_the_end, draft_batch, to_go)
        self.by_step[step] = chosen if with_drafts else 0
        self.by_step.pop(step - 16, None)
        return chosen

    def _for_the_end(self, batch: Sequence[int], to_go: dict[int, int]) -> int:
        """The end rule's k, kept for the next FINISH_REUSES plans of the same batch (same size, same first
        sequence): its inputs move little from one plan to the next, and it costs the batch manager, one core
        for the whole deployment, 0.1-0.3 ms a plan at 16-64 sequences (the rate rule 0.02). A neighbour drafted
        to measure it is not kept."""
        assert self.adaptive is not None
        key = (len(batch), batch[0])
        kept = self.finish_kept.get(key)
        if kept is not None and kept[1] > 0:
            kept[1] -= 1
            return kept[0]
        chosen = self.adaptive.choose_to_finish(to_go, overlapped=True)
        if len(self.finish_kept) > 8:  # batches that shrank or ended
            self.finish_kept.clear()
        if chosen == self.adaptive.best():
            self.finish_kept[key] = [chosen, FINISH_REUSES]
        else:
            self.finish_kept.pop(key, None)
        return chosen

    def _explain(self, step: int, chosen: int, for_the_end: bool, batch: Sequence[int],
                 to_go: dict[int, int | None]) -> None:
        """One DEBUG line per auto plan (MINEDRAFT_LOG_LEVEL=DEBUG): what decided its k."""
        a = self.adaptive
        assert a is not None
        pooled, scores = a.pooled(), " ".join(f"{k}:{v:.3g}" for k, v in a.scores.items())
        scale, slowest = min((a.seq_scale(s, pooled), s) for s in batch)
        log.debug("step %d: auto drafts k=%d for %d sequences, by %s (the rate's k: %d); pooled acceptance %.3f, "
                  "lowest sequence %d at %.2fx it (%s tokens to go, %.0f drafts judged); scores by k (%s) %s",
                  step, chosen, len(batch), "the end" if for_the_end else "the rate", a.choose(True, len(batch)),
                  pooled, slowest, scale, to_go.get(slowest), a.by_seq.get(slowest, [0.0, 0.0])[1],
                  "ms to the end" if for_the_end else "ms per token", scores)

    def forget(self, seq_ids: Sequence[int]) -> None:
        """Sequences gone from the workers (retired, or lost with a verifier): nothing of theirs is kept."""
        self.unverified.difference_update(seq_ids)
        self.undrafted.difference_update(seq_ids)
        if self.adaptive is not None:
            self.adaptive.forget(seq_ids)

    def snapshot(self) -> dict[str, object] | None:
        """What adaptive k has learnt (in any drafting mode) and, in auto, chosen (None before anything was
        drafted): for /health and for tuning k_min..k."""
        a = self.adaptive
        if a is None:
            return None
        return {"k_min": a.k_min, "k_max": a.k_max, "plans_by_k": dict(sorted(self.chosen.items())),
                "plans_for_the_end": self.finishing,
                "acceptance_by_position": [round(p, 4) for p in a.acceptance()],
                "draft_ms_by_batch_and_k": costs_view(a.draft), "verify_ms_by_tokens": a.verify.view()}

    def judged(self, step: int) -> int:
        """Drafts each sequence verified at `step` carries: its batch drafted in the step before."""
        return self.by_step.get(step - 1, 0)

    def on_verify(self, step: int, drafted: int, accepted: list[int], compute_ms: float | None,
                  seq_ids: Sequence[int] = (), lengths: Sequence[int] | None = None) -> None:
        """`compute_ms`: None when the step's time says nothing of its k (it captured a CUDA graph);
        `seq_ids`: the verified sequences, in the order of `accepted`; `lengths`: the drafts each verified,
        when TETRIS selected them (the verify's cost is filed under the tokens it checked, b + sum(lengths),
        which a floor on the estimated acceptance keeps below b(k + 1))."""
        if self.adaptive is not None and drafted > 0 and accepted:
            self.adaptive.observe_verdicts(drafted, accepted, seq_ids, lengths)
            if compute_ms is None:
                return
            if self.fused():
                cold = self.cold.get(step, (False, False))[0] or self.cold.get(step - 1, (False, False))[1]
                if not cold:
                    self.adaptive.draft.add(drafted, compute_ms, len(accepted))
                    self.adaptive.verify.add(drafted, 0.0, len(accepted))
            elif not self.cold.get(step, (False, False))[0]:
                checked = len(accepted) + sum(lengths) if lengths else None
                self.adaptive.verify.add(drafted, compute_ms, len(accepted), checked)

    def on_draft(self, step: int, compute_ms: float | None, batch: int = 0) -> None:
        k = self.by_step.get(step, 0)
        if self.adaptive is not None and k > 0 and compute_ms and not self.cold.get(step, (False, False))[1]:
            self.adaptive.draft.add(k, compute_ms, batch)
