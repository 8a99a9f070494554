"""TETRIS's side of the plan: how many drafts each sequence drafts, how many the batch verifies, and the
floor below which a draft is not worth verifying.

With `draft_selection: tetris` a plan's draft batch drafts k + tetris_extra per sequence and only the
C best drafts over the batch are verified (engine/tetris.py), C = k x batch: the verify checks at most the
tokens fixed-k SD would check, b(k + 1), but spends them where the draft expects acceptance. k is the
policy's k, or in auto adaptive k's choice, which already weighs the measured verify cost per token
(by tokens checked) against the acceptance by position; so the budget is learnt as k is, and a verify
cost that grows with tokens makes auto choose a smaller k and so a smaller C.

The floor: a verified draft adds its estimated acceptance a (exp of its score) in tokens for m more verify
ms, m the verify's marginal ms per token around b(k + 1) tokens at this batch size; that raises the step's
rate R = b E(k) / step_ms(k) only if a > theta = m x R (verify_floor), so the plan asks the
drafter to verify none below theta. In PSD a verify cheaper than the draft adds nothing to the step (the two
overlap), and theta is 0; theta is 0 too until both sides' costs at k are measured, and never above 0.5.
With tetris_extra = 0 the floor is the whole of selection: draft k, verify only the drafts worth it.

Selection only pays when verifying is the bottleneck: while the verify's cost is flat in its tokens (a
small batch, where the weights' read dominates), verifying every draft costs nothing more, and cutting
drafts only loses accepted tokens. So it is on when the batch has at least `tetris_min_batch` sequences
and, once the verify's cost by tokens is measured on both sides, when the drafts selection decides on
would cost at least COMPUTE_BOUND more to verify: the extra drafts too (b(k + extra + 1) against b(k + 1)
tokens) or, with no extra drafts, each sequence's k-th (b(k + 1) against bk); otherwise the plan drafts k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minedraft.batch_manager.policy import two_batches

if TYPE_CHECKING:
    from minedraft.batch_manager.adaptive_k import AdaptiveK
    from minedraft.batch_manager.config import ManagerConfig

COMPUTE_BOUND = 0.05  # verifying the drafts selection decides on costs this much more: verification is the bottleneck
MAX_MIN_PROB = 0.5  # the floor's ceiling: noisy costs must never prune drafts the draft is fairly sure of


def verify_floor(marginal_ms: float, tokens_per_ms: float) -> float:
    """The estimated acceptance below which verifying a draft lowers the step's rate, clamped to
    0..MAX_MIN_PROB. A verified draft adds its acceptance chance a in tokens for `marginal_ms` (m) more
    verify time; at `tokens_per_ms` (R) tokens per ms, (T + a) / (S + m) > T / S exactly when a > m R."""
    return min(max(marginal_ms * tokens_per_ms, 0.0), MAX_MIN_PROB)


def selecting(config: ManagerConfig) -> bool:
    """TETRIS is the policy and the mode drafts."""
    return config.draft_selection == "tetris" and config.mode != "ar"


def extra_drafts(config: ManagerConfig) -> int:
    """Drafts per sequence beyond k that a plan may carry (what KV admission must reserve; AR drafts none)."""
    return config.tetris_extra if selecting(config) else 0


def verify_bound(adaptive: AdaptiveK | None, batch: int, k: int, extra: int) -> bool:
    """Whether the measured verify costs say the drafts selection may cut cost more than COMPUTE_BOUND (True
    when they cannot tell yet): k + extra against k drafts per sequence, or with no extra k against k - 1."""
    low, high = (k, k + extra) if extra > 0 else (k - 1, k)
    costs = adaptive.verify if adaptive is not None else None
    if costs is None or len(costs.points) < 2 or not costs.measured(high, batch):
        return True
    base, more = costs.estimate(low, batch), costs.estimate(high, batch)
    return base is None or more is None or more >= base * (1.0 + COMPUTE_BOUND)


def min_prob(adaptive: AdaptiveK | None, batch: int, k: int, overlapped: bool) -> float:
    """theta = m x R for a plan drafting `batch` sequences at k (module docstring); 0 while k's costs at this
    batch size are not measured, and where the verify hides under an overlapped draft."""
    if adaptive is None or k <= 0 or batch <= 0 or k > adaptive.k_max:
        return 0.0
    costs = adaptive.verify
    if len(costs.points) < 2 or not adaptive.measured(k, batch):
        return 0.0
    verify, below = costs.estimate(k, batch), costs.estimate(k - 1, batch)
    draft, step = adaptive.draft.estimate(k, grows_with_k=True, batch=batch), adaptive.step_ms(k, overlapped, batch)
    if verify is None or below is None or draft is None or not step or (overlapped and verify <= draft):
        return 0.0
    return verify_floor((verify - below) / batch, batch * adaptive.expected_tokens(k) / step)


def plan_drafts(config: ManagerConfig, k: int, batch: int, adaptive: AdaptiveK | None) -> tuple[int, int, float]:
    """(drafts per sequence, verification budget, floor on a verified draft's estimated acceptance) for a plan
    drafting `batch` sequences at k; a budget of 0 verifies every draft (fixed k)."""
    extra = extra_drafts(config)
    if not selecting(config) or k <= 0 or batch < config.tetris_min_batch or not verify_bound(adaptive, batch, k,
                                                                                             extra):
        return k, 0, 0.0
    floor = min_prob(adaptive, batch, k, two_batches(config.mode))
    if extra <= 0 and floor <= 0:
        return k, 0, 0.0  # nothing to prune: fixed k
    return k + extra, k * batch, floor
