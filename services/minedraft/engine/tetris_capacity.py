"""How many drafts a TETRIS step verifies, decided before it drafts.

A selection made on the device (engine/tetris_propose.py with a capacity) leaves the per-row counts there, so
the host launches the verify behind the draft without waiting for it; but the verify's shape (its packed token
count, engine/ragged_graphs.py) is the host's to choose. With a floor, how many drafts pass it varies by step,
so the host bounds it ahead: the capacity is what the previous step wanted (its drafts at or above the floor,
at most the budget), rounded up to the GEMMs' row tile and (when the verify replays packed graphs) to the next
packed graph of the batch, at most the budget. The step then verifies its `capacity` best slots: the verify
costs the same for any count within its graph and tile, so the slots under the floor that fill them are free;
a step that wants more than its capacity drops the ones nearest the floor (whose expected gain is about what
verifying them costs) and raises the next step's capacity.

The row tile is where a verify's cost steps: on CUDA the GEMMs run in tiles of 128 rows, so at batch 64 and k
= 3 pruning 256 tokens to 239 saves nothing. When the capacity rounds up to the whole budget and there is
nothing to choose between (no drafts beyond k), the step is a plain fixed-k one: no scoring, the padded
verify. Such steps still need the floor's count now and then, so one in `probe_every` of them scores and
selects; a probe that finds the floor still keeps every draft doubles the interval (up to PROBE_MAX), and
any step that may save a tile brings it back, so a pair whose floor never prunes pays for a probe about once
in PROBE_MAX steps.

Lossless: the capacity is a function of earlier steps only, never of this step's drafts, so it is one more
budget fixed before the drafts are drawn (engine/tetris.py's argument holds for any such budget).
"""

from __future__ import annotations

from dataclasses import dataclass

from minedraft.engine.cuda_graphs import GraphCache
from minedraft.engine.drafter import Proposal
from minedraft.engine.ragged_graphs import token_grain

CUDA_ROW_TILE = 128  # rows per GEMM tile of the verify's projections on CUDA (Hopper's 128-row wgmma tiles)
PROBE_EVERY = 8  # of the steps that would keep every draft, one in this many scores to measure the floor's count
PROBE_MAX = 64  # ... once probes keep finding nothing to prune, one in up to this many


def row_tile(device: str) -> int:
    """The verify's cost step in tokens on this device: 128 rows on CUDA, 1 elsewhere (a CPU's cost is linear)."""
    return CUDA_ROW_TILE if device.startswith("cuda") else 1


def round_up(value: int, grain: int) -> int:
    return -(-value // grain) * grain


@dataclass(slots=True)
class DraftCapacity:
    """The last step's wanted drafts, the row tile its capacity rounds to, and how often a capacity cut a
    selection short."""

    tile: int = 1
    grained: bool = False  # the verify replays packed graphs: round to their token counts too
    probe_every: int = PROBE_EVERY
    wanted: int | None = None  # None: nothing measured yet (the first step takes the whole budget)
    cuts: int = 0  # steps whose selection wanted more drafts than their capacity
    steps: int = 0  # steps that selected on the device
    plain: int = 0  # steps that kept every draft without scoring
    since_probe: int = 0
    interval: int = 0  # steps between probes now (0: probe_every)
    probing: tuple[int, int] | None = None  # (batch, budget) of a probe whose count is not observed yet

    def limit(self, batch: int, budget: int) -> int:
        """Drafts this step of `batch` rows may keep under `budget`: the last step's wanted count, rounded up so
        that batch + capacity is a whole number of row tiles (and, with `grained`, a packed graph's token count)."""
        if self.wanted is None or budget <= 0:
            return budget
        bucket = GraphCache.bucket(batch) if self.grained else None
        grain = token_grain(bucket) if bucket is not None else 1
        tokens = round_up(round_up(batch + self.wanted, grain), max(1, self.tile))
        return max(0, min(budget, tokens - batch))

    def plan(self, batch: int, width: int, budget: int) -> tuple[int, int | None]:
        """(budget, capacity) for `propose_selected` this step: budget 0 asks for a plain proposal (k drafts
        per row, unscored), when the capacity keeps every draft and the last probe was recent."""
        if budget <= 0:
            return 0, None
        capacity = self.limit(batch, budget)
        if self.wanted is None or capacity < budget or budget < width * batch:
            self.interval = self.probe_every  # selection may pay again: probe at the first rate
            return budget, capacity
        self.since_probe += 1
        if self.since_probe < (self.interval or self.probe_every):
            self.plain += 1
            return 0, None
        self.since_probe, self.probing = 0, (batch, budget)
        return budget, capacity

    def observe(self, wanted: int, capacity: int) -> None:
        """A step's wanted drafts (read back with its verdict) and the capacity it ran with."""
        self.wanted = wanted
        self.steps += 1
        self.cuts += wanted > capacity
        if self.probing is not None:  # nothing to prune still: probe half as often; else at the first rate
            batch, budget = self.probing
            interval = self.interval or self.probe_every
            self.interval = min(2 * interval, PROBE_MAX) if self.limit(batch, budget) >= budget else self.probe_every
            self.probing = None

    def settle(self, proposal: Proposal | None) -> None:
        """After a step's verdict was read: its device selection's counts onto the host (`Proposal.lengths`)
        and its wanted count into the next step's capacity; nothing for a proposal selected on the host."""
        selected = proposal.read_counts() if proposal is not None else None
        if selected is not None and proposal is not None:
            self.observe(selected[1], proposal.capacity)
