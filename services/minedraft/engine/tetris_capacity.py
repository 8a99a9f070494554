"""How many drafts a TETRIS step may keep, decided before it drafts.

A selection made on the device (engine/tetris_propose.py with a capacity) leaves the per-row counts there,
so the host launches the verify behind the draft without waiting for it; but the verify's shape (its packed
token count, engine/ragged_graphs.py) is the host's to choose. With a floor, how many drafts pass it varies
by step, so the host bounds it ahead: the capacity is what the previous step wanted (its drafts at or above
the floor, at most the budget), rounded up to the next packed graph of the batch, and at most the budget. A
step that wants more keeps its `capacity` best slots (the ones cut are those nearest the floor, whose expected
gain is about what verifying them costs) and raises the next step's capacity.

Lossless: the capacity is a function of earlier steps only, never of this step's drafts, so it is one more
budget fixed before the drafts are drawn (engine/tetris.py's argument holds for any such budget).
"""

from __future__ import annotations

from dataclasses import dataclass

from minedraft.engine.cuda_graphs import GraphCache
from minedraft.engine.drafter import Proposal
from minedraft.engine.ragged_graphs import token_grain


@dataclass(slots=True)
class DraftCapacity:
    """The last step's wanted drafts, and how often a capacity cut a selection short."""

    wanted: int | None = None  # None: nothing measured yet (the first step takes the whole budget)
    cuts: int = 0  # steps whose selection wanted more drafts than their capacity
    steps: int = 0

    def limit(self, batch: int, budget: int) -> int:
        """Drafts this step of `batch` rows may keep under `budget`: the last step's wanted count, rounded up so
        that batch + capacity is a packed graph's token count."""
        if self.wanted is None or budget <= 0:
            return budget
        bucket = GraphCache.bucket(batch)
        grain = token_grain(bucket) if bucket is not None else 1
        tokens = -(-(batch + self.wanted) // grain) * grain
        return max(0, min(budget, tokens - batch))

    def observe(self, wanted: int, capacity: int) -> None:
        """A step's wanted drafts (read back with its verdict) and the capacity it ran with."""
        self.wanted = wanted
        self.steps += 1
        self.cuts += wanted > capacity

    def settle(self, proposal: Proposal | None) -> None:
        """After a step's verdict was read: its device selection's counts onto the host (`Proposal.lengths`)
        and its wanted count into the next step's capacity; nothing for a proposal selected on the host."""
        selected = proposal.read_counts() if proposal is not None else None
        if selected is not None and proposal is not None:
            self.observe(selected[1], proposal.capacity)
