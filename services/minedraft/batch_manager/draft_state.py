"""Where the draft service stands in the loop: an explicit state machine.

    ABSENT ───────────────────────────────────────────────► STOPPING
    CONNECTING ──formed──► DRAFTING ◄──probe step / policy── PAUSED_AUTO
        │                    │   └──────auto: does not pay─────►│
        │ failed             │ lost                             │ lost
        ▼                    ▼                                  │
    LOST_AR ◄────────────────┴──────────────────────────────────┘
      │  ▲                       (LOST_COLOCATED instead, where the verifier has its own draft)
      │  └──failed──┐
      ▼ answers     │
    RECOVERING ─────┴──formed──► DRAFTING

Every state may go to STOPPING. In DRAFTING and PAUSED_AUTO the draft service receives
every plan and every verdict (its copy of each sequence stays complete); plans carry
drafts only in DRAFTING. In LOST_AR the verifier decodes alone. A verifier that also loaded
the draft model (--colocated-draft) stands in for a lost service: LOST_COLOCATED takes the
place of LOST_AR, and its plans draft on the verifier (fused SD, one batch). RECOVERING holds
the loop drained while a new data-plane epoch forms. Any other move is a bug and raises.
"""

from __future__ import annotations

import logging
from enum import Enum

log = logging.getLogger(__name__)


class DraftState(Enum):
    ABSENT = "absent"  # this deployment has no draft service
    CONNECTING = "connecting"  # start-up: forming the first data-plane epoch
    DRAFTING = "drafting"  # data plane up; plans carry drafts whenever the mode drafts
    PAUSED_AUTO = "paused_auto"  # data plane up; auto mode judged drafting not worth it until a probe step
    LOST_AR = "lost_ar"  # draft service or data plane gone; the verifier decodes alone, retrying the draft
    LOST_COLOCATED = "lost_colocated"  # ... gone; the verifier drafts with its own draft model meanwhile
    RECOVERING = "recovering"  # the draft answers again; loop drained, a new epoch forming
    STOPPING = "stopping"


S = DraftState
TRANSITIONS: dict[DraftState, frozenset[DraftState]] = {
    S.ABSENT: frozenset({S.STOPPING}),
    S.CONNECTING: frozenset({S.DRAFTING, S.LOST_AR, S.LOST_COLOCATED, S.STOPPING}),
    S.DRAFTING: frozenset({S.PAUSED_AUTO, S.LOST_AR, S.LOST_COLOCATED, S.STOPPING}),
    S.PAUSED_AUTO: frozenset({S.DRAFTING, S.LOST_AR, S.LOST_COLOCATED, S.STOPPING}),
    S.LOST_AR: frozenset({S.RECOVERING, S.STOPPING}),
    S.LOST_COLOCATED: frozenset({S.RECOVERING, S.STOPPING}),
    S.RECOVERING: frozenset({S.DRAFTING, S.LOST_AR, S.LOST_COLOCATED, S.STOPPING}),
    S.STOPPING: frozenset(),
}


class IllegalTransitionError(RuntimeError):
    """A move the draft state machine does not allow: a bug in the caller."""


class DraftLinkState:
    """The current state, the step a PAUSED_AUTO pause ends at, and the history of moves."""

    def __init__(self, has_draft: bool) -> None:
        self.state = S.CONNECTING if has_draft else S.ABSENT
        self.resume_at = -1  # PAUSED_AUTO: the first step that drafts again
        self.history: list[DraftState] = [self.state]

    def to(self, new: DraftState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"draft state {self.state.name} cannot go to {new.name}")
        log.info("draft service: %s -> %s", self.state.name, new.name)
        self.state = new
        self.history.append(new)

    @property
    def connected(self) -> bool:
        """The draft service is in the loop: it gets plans and verdicts (it may not be drafting)."""
        return self.state in (S.DRAFTING, S.PAUSED_AUTO)

    @property
    def drafting(self) -> bool:
        """Plans carry drafts (from the draft service, or from the verifier's own draft while it is lost)."""
        return self.state in (S.DRAFTING, S.LOST_COLOCATED)

    @property
    def lost(self) -> bool:
        return self.state in (S.LOST_AR, S.LOST_COLOCATED)

    def pause(self, until_step: int) -> None:
        """auto mode: plain verifier steps until `until_step`, then a probe."""
        self.to(S.PAUSED_AUTO)
        self.resume_at = until_step

    def resume_if_due(self, step: int) -> None:
        """PAUSED_AUTO ends at its probe step."""
        if self.state is S.PAUSED_AUTO and step >= self.resume_at:
            self.to(S.DRAFTING)
