"""One engine step in this process, measured three ways: whole, split into host phases, and GPU alone.

Cells (step_report.MODES): "ar" and "verify" run the verifier service's own executor
(`VerifierExecutor.handle_plan`: plan membership, the judge, the verdict's readback and commit, the
event) on plans of one-token decodes or of k fixed drafts per row; "draft" has the draft model propose
k tokens (its drafts read back, then committed as all accepted); "fused" is SD colocated, one plan per
cycle that verifies the last drafts and drafts again on the verifier's own draft model; "psd" is the verifier
of PSD m+m: plans verify two batches of m in turn, each plan's draft batch the other, the drafts arriving over a
link that always has them (loopback_plane.py), so the executor queues each verify before reading the previous
one back, as it does in PSD; "sd2" is the verifier of sequential SD with the draft service on its own GPU: each
plan verifies the batch the plan before drafted, its drafts taken from the posted frame on the device
(verifier/posted_drafts.py), the frame landing `land_ms` after the verify before it (the draft GPU's k forwards,
in the profile the draft cell's GPU time at the same batch and k), so the host prepares each verify while the
drafts are on their way; "psd-draft" is the draft service of PSD m+m (`DraftExecutor.handle_plan`): plans
draft the two batches in turn, each from the verdict on the other side of the loopback link, so each plan's
drafts are queued from a verdict on the device before the previous plan's are read back.

Each cell runs rounds of three blocks of steps (clean, instrumented, GPU-alone; the order reversed every
other round, so each kind sees the same contexts on average):
- whole: wall time of consecutive plain steps, the last one's GPU work waited for, per step;
- phases: the same steps with the engine's functions wrapped (`phase_clock.py`), host ms per phase;
- GPU: each step's GPU work queued behind a sleeping kernel, so the host is ahead and the kernels run
  back to back; the events around it give the GPU time the step would take with no host in the way.
  A segment is late when the host reached its end after the GPU did (then it includes host gaps).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from minedraft.bench.gpu.blocked_gpu import BlockedGpu
from minedraft.bench.gpu.cell_rows import draft_probs, row_spec
from minedraft.bench.gpu.loopback_plane import LoopbackDrafts, LoopbackVerdicts
from minedraft.bench.gpu.phase_clock import OTHER, Hook, Patches, PhaseClock
from minedraft.bench.gpu.step_report import ModelBytes, bound_ms, compute_ms, draft_bytes, step_flops
from minedraft.core.sampling_params import SamplingParams
from minedraft.draft_service.executor import DraftExecutor
from minedraft.engine import drafter as drafter_module
from minedraft.engine import verifier as verifier_module
from minedraft.engine.block_tables import BlockTables
from minedraft.engine.cuda_graphs import GraphCache
from minedraft.engine.drafter import Drafter
from minedraft.engine.kv_cache import BlockAllocator, KVCache
from minedraft.engine.readback import Readback
from minedraft.engine.runner import ModelRunner
from minedraft.engine.sequence_host import SequenceHost
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.verifier import executor as executor_module
from minedraft.verifier.colocated import ColocatedDrafter
from minedraft.verifier.executor import VerifierExecutor
from minedraft.worker.data_frames import DraftPayload


@dataclass(frozen=True, slots=True)
class Cell:
    mode: str  # step_report.MODES
    batch: int  # sequences per step (psd: per batch; the cell holds two)
    k: int = 0
    sampling: str = "greedy"  # step_report.SAMPLINGS: the rows' processing

    @property
    def sequences(self) -> int:
        return 2 * self.batch if self.mode in TWO_BATCHES else self.batch


TWO_BATCHES = ("psd", "psd-draft")  # cells whose plans alternate two batches of `batch`


def model_bytes(runner: ModelRunner) -> ModelBytes:
    params = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    count = sum(p.numel() for p in runner.model.parameters())
    embedding = sum(p.numel() for name, p in runner.model.named_parameters() if "embed_tokens" in name)
    cfg, kv = runner.config, runner.cache.layers[0][0]
    return ModelBytes.of(params, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, kv.element_size(), count - embedding)


def phase_hooks() -> list[Hook]:
    """Which engine function does which part of a step (exclusive time: the innermost named one counts)."""
    ex = executor_module
    return [
        Hook(ex, "apply_membership", "plan decode"), Hook(ex, "verify_ids", "plan decode"),
        Hook(ex, "align_drafts", "plan decode"), Hook(ColocatedDrafter, "apply_membership", "plan decode"),
        Hook(KVCache, "block_table_tensor", "block tables"), Hook(BlockAllocator, "ensure", "block tables"),
        Hook(BlockTables, "get", "block tables"),
        Hook(SequenceHost, "sampling", "sampling tensors"),
        Hook(ModelRunner, "to_device", "input copies"), Hook(ModelRunner, "forward", "input copies"),
        Hook(GraphCache, "replay", "input copies"),
        Hook(torch.cuda.CUDAGraph, "replay", "graph replay"),
        Hook(ModelRunner, "run", "eager launches"), Hook(verifier_module, "verify_drafts", "eager launches"),
        Hook(drafter_module, "sample_tokens", "eager launches"),
        Hook(Readback, "__init__", "readback queue"), Hook(Verifier, "read_back", "readback queue"),
        Hook(torch.cuda.Event, "synchronize", "readback wait"),
        Hook(Verifier, "commit", "commit"), Hook(Drafter, "commit", "commit"),
        Hook(ColocatedDrafter, "commit", "commit"), Hook(VerifierExecutor, "_commit", "commit"),
        Hook(VerifierExecutor, "_report", "commit"),
        Hook(Drafter, "propose", OTHER, scope="draft"), Hook(ColocatedDrafter, "draft_ahead", OTHER, scope="draft"),
    ]


class CellDriver:
    """Sets a cell's sequences up, runs its steps (each returns the bytes it had to read), takes them down."""

    def __init__(self, verifier: Verifier, drafter: Drafter | None, cell: Cell, first_id: int,
                 prompts: list[list[int]], land_ms: float = 0.0) -> None:
        self.cell, self.verifier, self.drafter = cell, verifier, drafter
        self.ids = list(range(first_id, first_id + cell.sequences))
        half = cell.batch
        self.batches = [self.ids[:half], self.ids[half:]] if cell.mode in TWO_BATCHES else [self.ids]
        self.prompts = prompts
        self.land_ms = land_ms if cell.mode == "sd2" and verifier.runner.device.type == "cuda" else 0.0
        self.target_bytes = model_bytes(verifier.runner)
        self.draft_bytes = model_bytes(drafter.runner) if drafter is not None else None
        self.step_no = 0
        self.ahead = False  # the next plan is in the inbox (launch-ahead may queue it), except a block's last
        self.executor: VerifierExecutor | None = None
        self.draft_executor: DraftExecutor | None = None
        if cell.mode == "psd-draft":  # the draft service's loop, its verdicts over a loopback link
            assert drafter is not None
            self.draft_executor = DraftExecutor(drafter, launch_ahead=True)
            self.draft_executor.upcoming = lambda: self.plan(False) if self.ahead else None
            self.draft_executor.plane = LoopbackVerdicts(  # type: ignore[assignment]
                lambda: self.draft_executor.awaited if self.draft_executor else None, cell.k, drafter.vocab_size,
                drafter.runner.device)
        elif cell.mode != "draft":
            colocated = ColocatedDrafter(drafter) if cell.mode == "fused" and drafter is not None else None
            self.executor = VerifierExecutor(verifier, None, "", 0, colocated=colocated,  # type: ignore[arg-type]
                                             launch_ahead=True)  # as a verifier on one GPU runs (auto)
            self.executor.upcoming = lambda: self.plan(False) if self.ahead else None
        device, vocab, sampled = verifier.runner.device, verifier.vocab_size, cell.sampling == "sampled"
        if cell.mode == "verify":
            drafts = torch.randint(3, vocab, (cell.batch, cell.k), device=device)
            probs = draft_probs(cell.batch, cell.k, vocab, device) if sampled else None
            self.executor._receive_drafts = (  # type: ignore[method-assign, union-attr]
                lambda timing, here: DraftPayload(self.step_no, self.ids, drafts, probs))
        if cell.mode in ("psd", "sd2"):
            assert self.executor is not None
            per_batch = {tuple(b): torch.randint(3, vocab, (len(b), cell.k), device=device) for b in self.batches}
            probs_per_batch = ({ids: draft_probs(len(ids), cell.k, vocab, device) for ids in per_batch} if sampled
                               else None)
            executor = self.executor
            self.executor.plane = LoopbackDrafts(  # type: ignore[assignment]
                per_batch, lambda: executor.drafted, device, self.land_ms, probs_per_batch)

    def plan(self, first: bool) -> control_pb2.StepPlan:
        mode, step = self.cell.mode, self.step_no
        ids = self.batches[step % len(self.batches)]
        if mode == "psd-draft":  # drafts one batch while the other is verified (none before the first drafted)
            plan = control_pb2.StepPlan(step=step, draft_batch=ids, k=self.cell.k, with_drafts=True, send_verdict=True,
                                        verify_batch=self.batches[(step + 1) % 2] if step else [])
            if first:
                plan.add.extend(row_spec(s, p) for s, p in zip(self.ids, self.prompts, strict=True))
            return plan
        drafted = {"fused": ids, "sd2": ids, "psd": self.batches[(step + 1) % len(self.batches)]}.get(mode, [])
        plan = control_pb2.StepPlan(step=step, verify_batch=ids, k=self.cell.k,
                                    with_drafts=mode in ("verify", "fused", "psd", "sd2"), draft_here=mode == "fused",
                                    draft_batch=drafted)
        if first:
            plan.add.extend(row_spec(s, p, self.cell.sampling, seed=i)
                            for i, (s, p) in enumerate(zip(self.ids, self.prompts, strict=True)))
        return plan

    def setup(self) -> None:
        if self.draft_executor is not None:
            self._run_plan(first=True)
            self._run_plan()  # the other batch's first drafts: every timed plan drafts from a verdict
        elif self.executor is None:
            assert self.drafter is not None
            for seq_id, prompt in zip(self.ids, self.prompts, strict=True):
                self.drafter.add(seq_id, prompt, SamplingParams(max_tokens=1 << 20, ignore_eos=True))
            self.step()
        else:
            self._run_plan(first=True)
            for _ in self.batches[1:]:  # PSD: the other batch's prefill, so every timed plan is steady
                self._run_plan()

    def _run_plan(self, first: bool = False) -> None:
        executor = self.draft_executor or self.executor
        assert executor is not None
        plan = self.plan(first)
        self.step_no += 1
        executor.handle_plan(plan)

    def launched(self) -> tuple[int, int]:
        """Steps launched ahead so far (the verifier's verifies, or the draft service's plans) and of how many."""
        if self.draft_executor is not None:
            return self.draft_executor.ahead_count, self.step_no
        if self.executor is not None:
            return self.executor.launched_count, self.executor.verified_count
        return 0, 0

    def step(self, ahead: bool = False) -> int:
        """One step; with `ahead`, the next plan is already there (the last step of a block passes False, so a
        block never ends with a step launched ahead that the next block would finish)."""
        self.ahead = ahead
        k, mode = self.cell.k, self.cell.mode
        if mode == "psd-draft":
            assert self.drafter is not None and self.draft_bytes is not None
            drafted = self.batches[self.step_no % 2]
            total = draft_bytes(self.draft_bytes, [self.drafter.seqs[s].length for s in drafted], k)
            self._run_plan()
            return total
        if mode == "draft":
            assert self.drafter is not None and self.draft_bytes is not None
            lengths = [self.drafter.seqs[s].length for s in self.ids]
            proposal = self.drafter.propose(self.ids, k)
            for seq_id, row in zip(self.ids, Readback(proposal.tokens).tolist(), strict=True):
                self.drafter.commit(seq_id, [*row, row[-1]], k)
            return draft_bytes(self.draft_bytes, lengths, k)
        seqs = self.verifier.seqs
        width = 1 if mode == "ar" else k + 1
        verified = self.batches[self.step_no % len(self.batches)]
        total = self.target_bytes.forward(seqs[s].cached + width for s in verified)
        self._run_plan()
        if mode == "fused":
            assert self.drafter is not None and self.draft_bytes is not None
            total += draft_bytes(self.draft_bytes, [self.drafter.seqs[s].length for s in self.ids], k)
        return total

    def teardown(self) -> None:
        if self.draft_executor is not None:
            self.draft_executor.reset()
        elif self.executor is not None:
            self.executor.reset()
        elif self.drafter is not None:
            for seq_id in self.ids:
                self.drafter.remove(seq_id)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_cell(driver: CellDriver, copy_GBps: float, rounds: int = 4, steps: int = 6, warm: int = 3,
                 matmul_TFLOPs: float = 0.0) -> dict:
    """Whole, phased and GPU-alone blocks of `steps` steps, `rounds` times; means per step (with the matmul
    rate, the step's compute floor too)."""
    device = driver.verifier.runner.device
    clock, gpu = PhaseClock(), BlockedGpu(device)
    hooks = phase_hooks()
    driver.setup()
    for _ in range(warm):
        driver.step()
    whole: list[float] = []
    phased: list[float] = []
    gpu_ms: list[float] = []
    nbytes: list[int] = []
    phases: dict[str, float] = defaultdict(float)
    for r in range(rounds):
        for kind in ("clean", "phased", "gpu") if r % 2 == 0 else ("gpu", "phased", "clean"):
            _sync(device)
            if kind == "clean":
                start = time.perf_counter()
                nbytes.extend(driver.step(ahead=j + 1 < steps) for j in range(steps))
                _sync(device)
                whole.append((time.perf_counter() - start) * 1000.0 / steps)
            elif kind == "phased":
                with Patches(clock, hooks):
                    for j in range(steps):
                        start = time.perf_counter()
                        with clock.phase(OTHER):
                            driver.step(ahead=j + 1 < steps)
                        phased.append((time.perf_counter() - start) * 1000.0)
                for name, ms in clock.take().items():
                    phases[name] += ms / (rounds * steps)
            else:
                with Patches(clock, [], gpu.extra()):
                    for _ in range(steps):
                        gpu.open()
                        nbytes.append(driver.step())
                        gpu.close()
                gpu_ms.append(gpu.take_ms() / steps)
    launched = driver.launched()
    posted = driver.executor.posted_count if driver.executor is not None else 0
    driver.teardown()
    cell = driver.cell
    mean_bytes = sum(nbytes) / len(nbytes)
    flops = step_flops(cell.mode, cell.batch, cell.k, driver.target_bytes, driver.draft_bytes)
    return {"mode": cell.mode, "batch": cell.batch, "k": cell.k, "sampling": cell.sampling, "steps": rounds * steps,
            "whole_ms": sum(whole) / len(whole), "whole_range": [min(whole), max(whole)],
            "gpu_ms": sum(gpu_ms) / len(gpu_ms), "gpu_range": [min(gpu_ms), max(gpu_ms)],
            "bytes": mean_bytes, "bound_ms": bound_ms(mean_bytes, copy_GBps), "flops": flops,
            "compute_ms": compute_ms(flops, matmul_TFLOPs),
            "phased_whole_ms": sum(phased) / len(phased), "phases": dict(phases), "late_segments": gpu.late,
            "launched_ahead": launched[0], "verified": launched[1], "posted": posted,
            "land_ms": driver.land_ms}
