"""The batch manager's GenerationBackend: two workers, one step loop.

Start-up checks that the verifier and the draft service can work together (vocabulary,
context, KV cache), forms the data plane, then runs the loop. The parts live next door:
`step_driver` (plans out, verdicts in), `admission` (who starts, KV reservation),
`draft_supervisor` + `draft_state` (the draft service's loss and return) and `link`
(what a worker connection must offer; `worker_link` implements it over gRPC).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from minedraft.batch_manager.admission import Admission, KvLimits
from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.link import WorkerLink
from minedraft.batch_manager.step_driver import StepDriver
from minedraft.batch_manager.worker_link import GrpcWorkerLink
from minedraft.core.errors import ModelLoadError
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer


class Coordinator:
    """A GenerationBackend that drives a remote verifier and (optionally) a draft service."""

    def __init__(self, tokenizer: Tokenizer, model_name: str, verifier: WorkerLink, draft: WorkerLink | None,
                 config: ManagerConfig) -> None:
        config.validate()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.admission = Admission(config.max_queue)
        self.driver = StepDriver(config, tokenizer, verifier, draft, self.admission)
        self._loop_task: asyncio.Task | None = None

    @classmethod
    def over_grpc(cls, tokenizer: Tokenizer, model_name: str, verifier_address: str, draft_address: str | None,
                  config: ManagerConfig) -> Coordinator:
        """The product's wiring; mode ar at start-up leaves the draft service out for good."""
        draft = GrpcWorkerLink("draft", draft_address) if draft_address and config.mode != "ar" else None
        return cls(tokenizer, model_name, GrpcWorkerLink("verifier", verifier_address), draft, config)

    @property
    def config(self) -> ManagerConfig:
        return self.driver.config

    @property
    def max_context(self) -> int:
        return self.admission.limits.max_context

    # ----- life cycle -------------------------------------------------------------------

    async def start(self, connect_timeout: float = 120.0) -> None:
        """Wait for the workers, check the pair, form the data plane, start the loop."""
        d = self.driver
        vinfo = await d.verifier.info(timeout=connect_timeout)
        if vinfo.vocab_size < self.tokenizer.vocab_size:
            raise ModelLoadError(f"tokenizer has {self.tokenizer.vocab_size} tokens but the verifier's model only "
                                 f"{vinfo.vocab_size}")
        limits = KvLimits(vinfo.max_context, self.tokenizer.vocab_size, vinfo.num_blocks, vinfo.block_size or 16)
        d.eos_ids = self.tokenizer.stop_ids(vinfo.eos_token_ids)
        await d.verifier.open(d.on_verifier_event, d.on_verifier_lost)
        if d.draft.link is not None:
            dinfo = await d.draft.link.info(timeout=connect_timeout)
            if dinfo.vocab_size != vinfo.vocab_size:
                raise ModelLoadError(f"verifier and draft have different vocabularies ({vinfo.vocab_size} vs "
                                     f"{dinfo.vocab_size} tokens)")
            limits.max_context = min(limits.max_context, dinfo.max_context)
            limits.block_budget = min(limits.block_budget, dinfo.num_blocks)
        self.admission.limits = limits
        await d.draft.start()
        d.serving = True
        self._loop_task = asyncio.create_task(d.run())

    async def stop(self) -> None:
        d = self.driver
        d.stop()
        if self._loop_task is not None:
            self._loop_task.cancel()
        await d.draft.stop()
        d.abort_everything()
        await d.verifier.close()

    # ----- GenerationBackend ------------------------------------------------------------

    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str
                 ) -> AsyncIterator[GenerationChunk]:
        return self.driver.generate(prompt_ids, params)

    async def apply_policy(self, **changes: object) -> dict[str, object]:
        """Change mode, k, caps or thresholds without a restart (SpeculationPolicy)."""
        return await self.driver.apply_policy(changes)

    def current_mode(self) -> str:
        if not self.driver.drafting_now():
            return "ar"
        b0, b1 = self.driver.sched.batch_sizes()
        return "psd" if b0 and b1 else "sd"

    def status(self) -> dict[str, object]:
        d, c = self.driver, self.driver.counters
        return {
            "mode": self.current_mode(),
            "configured_mode": d.config.mode,
            "k": d.config.k,
            "running": len(d.requests),
            "waiting": len(self.admission.waiting),
            "batch_sizes": list(d.sched.batch_sizes()),
            "draft_connected": d.draft.state.connected,
            "draft_state": d.draft.state.state.value,
            "draft_link_transport": d.draft.transport if d.draft.state.connected else "",
            "data_plane_epoch": d.draft.epoch,
            "step": d.step,
            "reserved_blocks": self.admission.reserved_blocks,
            "block_budget": self.admission.limits.block_budget,
            "fallbacks": c.fallbacks,
            "timing_totals": {k: round(v, 3) for k, v in c.timing.items()},
            "tokens_total": c.tokens,
            "drafted_total": c.drafted,
            "accepted_total": c.accepted,
            "seq_verifies_total": c.seq_verifies,
            "steps_by_kind": {"psd": c.psd_steps, "sd": c.sd_steps, "ar": c.ar_steps},
            "recoveries": c.recoveries,
            "acceptance_rate": round(c.accepted / c.drafted, 4) if c.drafted else 0.0,
            "mean_accepted_length": round(c.tokens / c.seq_verifies, 4) if c.seq_verifies else 0.0,
        }
