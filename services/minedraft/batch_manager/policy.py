"""The live speculation policy, defined once.

Every place that names a policy field derives from `POLICY_FIELDS`: `ManagerConfig`
validation, the admin API's request model (`PUT /admin/policy`), `GET /admin/policy`
and the `--mode` choices. A SpeculationPolicy pushed by the operator can change each of
these on a running batch manager; the step loop drains before applying them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minedraft.core.errors import InvalidRequestError

MODES = ("psd", "sd", "ar", "auto")
DRAFTING_MODES = ("psd", "sd", "auto")  # modes that use the draft service
TWO_BATCH_MODES = ("psd", "auto")  # modes that split the running sequences into two batches
SELECTIONS = ("fixed", "tetris")  # draft_selection (batch_manager/draft_budget.py)


def two_batches(mode: str, colocated: bool = False) -> bool:
    """Whether `mode` splits the sequences into two batches. A verifier that drafts itself (colocated)
    cannot overlap the two, so its auto runs fused SD on one batch, with k chosen for SD's costs."""
    return mode in TWO_BATCH_MODES and not (colocated and mode == "auto")


@dataclass(frozen=True, slots=True)
class PolicyField:
    """One live-tunable setting: its type, its bounds (inclusive) and what it does."""

    name: str
    type: type
    description: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None

    def check(self, value: object) -> None:
        """Raise InvalidRequestError, naming the field, when `value` is not allowed."""
        if self.choices is not None:
            if value not in self.choices:
                raise InvalidRequestError(f"{self.name} must be one of {list(self.choices)}, got {value!r}",
                                          param=self.name)
            return
        numeric = (int, float) if self.type is float else (int,)
        if isinstance(value, bool) or not isinstance(value, numeric) or not math.isfinite(value):
            raise InvalidRequestError(f"{self.name} must be a finite {self.type.__name__}, got {value!r}",
                                      param=self.name)
        if self.minimum is not None and value < self.minimum:
            raise InvalidRequestError(f"{self.name} must be >= {self.minimum:g}, got {value!r}", param=self.name)
        if self.maximum is not None and value > self.maximum:
            raise InvalidRequestError(f"{self.name} must be <= {self.maximum:g}, got {value!r}", param=self.name)


POLICY_FIELDS: tuple[PolicyField, ...] = (
    PolicyField("mode", str, "psd: two batches drafting and verifying in parallel; sd: one batch, draft then "
                "verify; ar: the verifier alone; auto: psd, falling back to ar while drafting does not pay",
                choices=MODES),
    PolicyField("k", int, "draft tokens per sequence per step (auto: the most it may choose)", 1, 16),
    PolicyField("k_min", int, "auto: the fewest draft tokens adaptive k may choose (it picks within k_min..k)", 1, 16),
    PolicyField("max_num_seqs", int, "running sequences, both batches together", 1),
    PolicyField("pipeline_depth", int, "step plans issued ahead of the verifier's verdicts", 1, 4),
    PolicyField("rebalance_threshold", float, "psd: move a sequence to the lighter batch only while the two "
                "batches' loads differ by more than this (one short sequence weighs 1.0); 0 balances fully", 0.0),
    PolicyField("auto_min_tokens_per_step", float, "auto: stop drafting while the recent mean accepted length "
                "(tokens per sequence per verify) is below this", 1.0),
    PolicyField("auto_probe_steps", int, "auto: steps of plain verifier decoding before drafting is tried again", 1),
    PolicyField("draft_selection", str, "fixed: every sequence verifies its k drafts; tetris: draft k + "
                "tetris_extra each and verify the batch's k x batch most promising drafts, each sequence to its "
                "own depth (on while the verify is compute-bound)", choices=SELECTIONS),
    PolicyField("tetris_extra", int, "tetris: drafts per sequence beyond k (0: draft k, verify only the drafts "
                "whose estimated acceptance pays for their verify)", 0, 8),
    PolicyField("tetris_min_batch", int, "tetris: the fewest sequences in a draft batch for selection to run", 1),
)
POLICY_NAMES: tuple[str, ...] = tuple(f.name for f in POLICY_FIELDS)
_BY_NAME = {f.name: f for f in POLICY_FIELDS}


def check_policy(values: dict[str, object]) -> None:
    """Raise InvalidRequestError for an unknown field or the first value out of bounds."""
    unknown = sorted(set(values) - set(_BY_NAME))
    if unknown:
        raise InvalidRequestError(f"not policy fields: {unknown}; use {list(POLICY_NAMES)}")
    for name, value in values.items():
        _BY_NAME[name].check(value)
