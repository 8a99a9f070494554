"""A live policy change (PUT /admin/policy, a SpeculationPolicy): applied between two steps."""

from __future__ import annotations

from dataclasses import replace

from minedraft.batch_manager.draft_state import DraftState
from minedraft.batch_manager.policy import check_policy
from minedraft.batch_manager.step_driver import StepDriver
from minedraft.core.errors import InvalidRequestError


async def apply_policy(driver: StepDriver, changes: dict[str, object]) -> dict[str, object]:
    """Check the changes, drain the loop (no step straddles them), apply; returns the new policy."""
    changes = {name: value for name, value in changes.items() if value is not None}
    check_policy(changes)
    new = replace(driver.config, **changes)
    new.validate()
    if driver.draft.link is None and not driver.draft.colocated and new.mode != "ar":
        raise InvalidRequestError("this deployment has no draft service; only mode 'ar' is possible", param="mode")
    async with driver.draining():
        driver.config = new
        driver.sched.use_two_batches(driver.draft.two_batches(new.mode))
        driver.sched.rebalance_threshold = new.rebalance_threshold
        driver.sched.restart_drafting()
        if driver.draft.state.state is DraftState.PAUSED_AUTO:
            driver.draft.state.to(DraftState.DRAFTING)
    return new.policy()

