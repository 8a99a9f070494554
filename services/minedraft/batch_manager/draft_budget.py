"""TETRIS's side of the plan: how many drafts each sequence drafts and how many the batch verifies.

With `draft_selection: tetris` a plan's draft batch drafts k + tetris_extra per sequence and only the
C best drafts over the batch are verified (engine/tetris.py), C = k x batch: the verify checks the
tokens fixed-k SD would check, b(k + 1), but spends them where the draft expects acceptance. k is the
policy's k, or in auto adaptive k's choice, which already weighs the measured verify cost per token
(by tokens checked) against the acceptance by position; so the budget is learnt as k is, and a verify
cost that grows with tokens makes auto choose a smaller k and so a smaller C.

Selection only pays when verifying is the bottleneck: while the verify's cost is flat in its tokens (a
small batch, where the weights' read dominates), verifying every draft costs nothing more, and cutting
drafts only loses accepted tokens. So it is on when the batch has at least `tetris_min_batch` sequences
and, once the verify's cost by tokens is measured on both sides, when verifying the extra drafts too
would cost at least COMPUTE_BOUND more than verifying b(k + 1) tokens; otherwise the plan drafts k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minedraft.batch_manager.adaptive_k import AdaptiveK
    from minedraft.batch_manager.config import ManagerConfig

COMPUTE_BOUND = 0.05  # verifying the extra drafts too would cost this much more: verification is the bottleneck


def extra_drafts(config: ManagerConfig) -> int:
    """Drafts per sequence beyond k that a plan may carry (what KV admission must reserve; AR drafts none)."""
    return config.tetris_extra if config.draft_selection == "tetris" and config.mode != "ar" else 0


def verify_bound(adaptive: AdaptiveK | None, batch: int, k: int, extra: int) -> bool:
    """Whether the measured verify costs say extra tokens cost (True when they cannot tell yet)."""
    costs = adaptive.verify if adaptive is not None else None
    if costs is None or len(costs.points) < 2 or not costs.measured(k + extra, batch):
        return True
    base, more = costs.estimate(k, batch), costs.estimate(k + extra, batch)
    return base is None or more is None or more >= base * (1.0 + COMPUTE_BOUND)


def plan_drafts(config: ManagerConfig, k: int, batch: int, adaptive: AdaptiveK | None) -> tuple[int, int]:
    """(drafts per sequence, verification budget) for a plan drafting `batch` sequences at k; a budget of 0
    verifies every draft (fixed k)."""
    extra = extra_drafts(config)
    if extra <= 0 or k <= 0 or batch < config.tetris_min_batch or not verify_bound(adaptive, batch, k, extra):
        return k, 0
    return k + extra, k * batch
