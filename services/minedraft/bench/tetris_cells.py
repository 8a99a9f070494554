"""One cell of the TETRIS benchmark: B sequences decoding together under one draft policy, in one process.

A cell is a batch and a DraftPolicy: k = 0 is AR; fixed k; or TETRIS (k + extra drafts per row, extra >= 0,
the batch's k x B best verified, none the draft rates below min_prob: with extra 0 selection only prunes).
Two passes over the same sequences: a throughput pass (no syncs but the ones the step itself makes), then
an anatomy pass that synchronises around the draft and verify phases of each step, so the timers never
perturb the tokens/s they sit beside.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.drafter import Drafter
from minedraft.engine.model import CausalLM
from minedraft.engine.ragged_graphs import selection_keys
from minedraft.engine.runner import ModelRunner
from minedraft.engine.tetris_capacity import DraftCapacity, row_tile
from minedraft.engine.tetris_propose import propose_selected
from minedraft.engine.verifier import Verifier


@dataclass(frozen=True, slots=True)
class CellConfig:
    """What every cell of a run shares."""

    device: str = "cpu"
    steps: int = 20  # timed steps of the throughput pass
    warmup: int = 3  # untimed steps before it
    anatomy_steps: int = 6  # steps of the phase-timed pass after it (0: none)
    prompt_len: int = 32
    num_blocks: int = 4096


class PhaseClock:
    """Wall time of the draft and verify phases, read after the device has finished what was queued."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.draft_s = 0.0
        self.verify_s = 0.0

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


@dataclass(frozen=True, slots=True)
class DraftPolicy:
    """How a cell drafts: nothing (k = 0, AR), k per row (fixed), or TETRIS's selection (`select`)."""

    k: int = 0
    extra: int = 0
    select: bool = False
    min_prob: float = 0.0  # TETRIS: the floor on a verified draft's estimated acceptance
    host_select: bool = False  # TETRIS: read the selection back before the verify (the services' way today)
    tile: int = 0  # TETRIS on the device: the verify's cost step in tokens (0: the device's)

    @property
    def kind(self) -> str:
        if not self.k:
            return "ar"
        return ("tetris-host" if self.host_select else "tetris") if self.select else "fixed"

    def budget(self, batch: int) -> int:
        """Drafts verified over the batch (0: every draft)."""
        return self.k * batch if self.select else 0


@dataclass(slots=True)
class Counts:
    """Tokens over some steps: verified (one per row plus its verified drafts), accepted drafts, emitted."""

    verified: int = 0
    accepted: int = 0
    emitted: int = 0


def decode_step(target: Verifier, draft: Drafter, ids: list[int], policy: DraftPolicy, counts: Counts,
                clock: PhaseClock | None = None, capacity: DraftCapacity | None = None) -> None:
    """Draft (nothing for AR; k + extra selected down to k x B for TETRIS), verify, commit; adds to counts.
    With a clock, the draft phase and the verify phase (with the draft's commit) are timed apart. With a
    capacity, TETRIS selects on the device (the verify is queued behind the draft, no readback between)."""
    batch, k = len(ids), policy.k
    start = clock.now() if clock else 0.0
    budget, limit = policy.budget(batch), None
    if capacity is not None:
        budget, limit = capacity.plan(batch, k + policy.extra, budget)
    proposal = propose_selected(draft, ids, k + policy.extra, budget, policy.min_prob, limit) if k else None
    drafted = clock.now() if clock else 0.0
    verdict = target.verify(ids, proposal)
    accepted = verdict.accepted.tolist()
    if capacity is not None:
        capacity.settle(proposal)
    rows = verdict.tokens.tolist()
    if k:
        for seq_id, row, n in zip(ids, rows, accepted, strict=True):
            draft.commit(seq_id, row[: n + 1], n)
    if clock:
        done = clock.now()
        clock.draft_s += drafted - start
        clock.verify_s += done - drafted
    lengths = proposal.lengths if proposal is not None and proposal.lengths is not None else [k] * batch
    counts.verified += batch + sum(lengths)
    counts.accepted += sum(accepted)
    counts.emitted += sum(accepted) + batch


def run_cell(pair: tuple[CausalLM, CausalLM], cfg: CellConfig, batch: int, policy: DraftPolicy
             ) -> tuple[dict, list[list[int]]]:
    """One cell on fresh KV caches. Returns its numbers and every row's tokens."""
    target = Verifier(ModelRunner(pair[0], cfg.num_blocks, 16, cfg.device))
    draft = Drafter(ModelRunner(pair[1], cfg.num_blocks, 16, cfg.device))
    vocab = pair[0].config.vocab_size
    gen = torch.Generator().manual_seed(7)
    ids = list(range(batch))
    for seq_id in ids:
        prompt = torch.randint(2, vocab, (cfg.prompt_len,), generator=gen).tolist()
        for worker in (target, draft):
            worker.add(seq_id, prompt, SamplingParams(max_tokens=10**6, ignore_eos=True))
    packed = target.runner.packed_graphs
    if policy.select and packed is not None:  # a pruned verify's token count varies by step: all of them now
        width = policy.k + policy.extra + 1
        packed.capture_ahead(key for key in selection_keys(batch, policy.k, policy.extra, batch) if key[1] == width)
    tile = policy.tile or row_tile(cfg.device)
    capacity = DraftCapacity(tile, packed is not None) if policy.select and not policy.host_select else None
    for _ in range(cfg.warmup):  # the fixed-width steps' graphs are captured here
        decode_step(target, draft, ids, policy, Counts(), capacity=capacity)
    timer = PhaseClock(cfg.device)
    counts = Counts()
    started = timer.now()
    for _ in range(cfg.steps):
        decode_step(target, draft, ids, policy, counts, capacity=capacity)
    seconds = timer.now() - started
    for _ in range(cfg.anatomy_steps):
        decode_step(target, draft, ids, policy, Counts(), timer, capacity)
    per_step = 1000 / max(cfg.anatomy_steps, 1)
    cell = {"batch": batch, "k": policy.k, "extra": policy.extra, "kind": policy.kind,
            "tokens_per_s": round(counts.emitted / seconds, 1),
            "accepted_per_verified_token": round(counts.accepted / counts.verified, 4),
            "tokens_per_step": round(counts.emitted / (batch * cfg.steps), 3), "verified_tokens": counts.verified,
            "accepted_tokens": counts.accepted,
            "step_ms": round(1000 * seconds / cfg.steps, 2)}
    if policy.select:
        cell["min_prob"] = policy.min_prob
    if capacity is not None:  # steps whose selection wanted more drafts than the capacity set before drafting
        cell |= {"tile": tile, "capacity_cuts": capacity.cuts, "capacity_steps": capacity.steps,
                 "plain_steps": capacity.plain}
    if cfg.anatomy_steps:
        cell |= {"draft_ms": round(timer.draft_s * per_step, 2), "verify_ms": round(timer.verify_s * per_step, 2)}
    tokens = [target.seqs[s].tokens for s in ids]
    del target, draft
    gc.collect()  # the runners' KV caches before the next cell allocates its own (they hold GPU memory)
    if cfg.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return cell, tokens
