"""In-process engine: continuous batching with autoregressive or speculative steps.

The step loop reads like the idea: admit -> reserve KV -> draft -> verify -> commit ->
retire finished requests. The batch-parallel services reuse the same workers and
request bookkeeping; this engine is the single-process reference they are tested against.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from minedraft.core.codec import sampling_from_spec, seq_spec
from minedraft.core.errors import InvalidRequestError, ModelLoadError
from minedraft.core.request import Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.core.validation import validate_k, validate_request
from minedraft.engine.drafter import Drafter
from minedraft.engine.eagle_drafter import EagleDrafter
from minedraft.engine.eagle_pair import capturing_runner, head_beside
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.tetris_capacity import DraftCapacity, row_tile
from minedraft.engine.tetris_propose import propose_selected
from minedraft.engine.verifier import Verifier

MODES = ("ar", "sd")


@dataclass(slots=True)
class EngineConfig:
    """How the in-process engine decodes and how much KV it holds."""

    mode: str = "sd"
    k: int = 4
    max_num_seqs: int = 64
    block_size: int = 16
    num_blocks: int = 4096
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    draft_kind: str = "model"  # or "eagle": the draft folder is an EAGLE head (engine/eagle_pair.py)
    tetris_extra: int = 0  # > 0: draft k + this many and verify the batch's best k x batch (engine/tetris.py)
    tetris_min_prob: float = 0.0  # > 0: verify no draft whose estimated acceptance is below this (any extra)
    tetris_tile: int = 0  # TETRIS: the verify's cost step in tokens (0: the device's, engine/tetris_capacity.py)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InvalidRequestError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "sd":
            validate_k(self.k)
        if self.max_num_seqs < 1:
            raise InvalidRequestError("max_num_seqs must be >= 1")


def check_pair(target: Verifier, draft: Drafter | None) -> None:
    """A draft is only usable when it speaks the target's vocabulary."""
    if draft is not None and draft.vocab_size != target.vocab_size:
        raise ModelLoadError(
            f"target and draft have different vocabularies ({target.vocab_size} vs {draft.vocab_size} "
            "tokens); speculative decoding needs a draft trained with the target's tokenizer"
        )


def max_context(target: Verifier, draft: Drafter | None) -> int:
    limits = [target.runner.config.max_position_embeddings]
    if draft is not None:
        limits.append(draft.runner.config.max_position_embeddings)
    return min(limits)


class LLMEngine:
    """Holds the target (and optionally the draft) worker and the request queues."""

    def __init__(
        self,
        target: Verifier,
        draft: Drafter | None,
        tokenizer: Tokenizer,
        config: EngineConfig,
    ) -> None:
        config.validate()
        if config.mode == "sd" and draft is None:
            raise InvalidRequestError("mode 'sd' needs a draft model")
        check_pair(target, draft)
        self.target = target
        self.draft = draft if config.mode == "sd" else None
        self.tokenizer = tokenizer
        self.config = config
        self.max_context = max_context(target, self.draft)
        self.eos_ids = tokenizer.stop_ids(target.runner.config.eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[int, Request] = {}
        self._ids = itertools.count()
        self.total_steps = 0
        tile = config.tetris_tile or row_tile(str(target.runner.device))
        # TETRIS: the drafts a step may keep, decided before it drafts
        self.capacity = DraftCapacity(tile, target.runner.packed_graphs is not None)

    @classmethod
    def from_folders(
        cls, target_dir: str | Path, draft_dir: str | Path | None, config: EngineConfig
    ) -> LLMEngine:
        config.validate()

        def runner(folder: str | Path) -> ModelRunner:
            model = load_model(folder, config.device, config.dtype)
            return ModelRunner(model, config.num_blocks, config.block_size, config.device)

        draft: Drafter | None = None
        if config.mode == "sd" and draft_dir is None:
            raise InvalidRequestError("mode 'sd' needs a draft model folder")
        if config.mode == "sd" and config.draft_kind == "eagle":
            assert draft_dir is not None
            model = load_model(target_dir, config.device, config.dtype)
            target_runner: ModelRunner = capturing_runner(model, draft_dir, config.num_blocks, config.block_size,
                                                          config.device)
            draft = head_beside(model, draft_dir, config.num_blocks, config.block_size, config.device, config.dtype)
            return cls(Verifier(target_runner), draft, Tokenizer(target_dir), config)
        if config.mode == "sd":
            assert draft_dir is not None
            draft = Drafter(runner(draft_dir))
        target = Verifier(runner(target_dir))
        return cls(target, draft, Tokenizer(target_dir), config)

    @property
    def k(self) -> int:
        return self.config.k if self.draft is not None else 0

    def add_request(self, prompt: str | list[int], params: SamplingParams) -> Request:
        """Validate and queue a request; it joins the running batch at the next step."""
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        validate_request(prompt_ids, params, self.max_context, self.target.vocab_size)
        lookahead_blocks = self.target.runner.allocator.blocks_for(len(prompt_ids) + params.max_tokens + self.width + 1)
        if lookahead_blocks > self.target.runner.allocator.num_blocks:
            raise InvalidRequestError("request is larger than the whole KV cache; lower max_tokens")
        params.resolved_seed()
        req = Request(next(self._ids), prompt_ids, params)
        self.requests[req.req_id] = req
        self.waiting.append(req)
        return req

    def abort(self, req_id: int) -> None:
        """Cancel a request and release its KV blocks on both models at once."""
        req = self.requests.pop(req_id, None)
        if req is None:
            return
        req.abort()
        if req in self.waiting:
            self.waiting.remove(req)
        self._retire(req)

    @property
    def width(self) -> int:
        """Drafts per sequence per step: k, or k + extra with TETRIS."""
        return self.k + self.config.tetris_extra

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _workers(self) -> list[Verifier | Drafter]:
        return [self.target] if self.draft is None else [self.target, self.draft]

    def _fits(self, reqs: list[Request]) -> bool:
        ids = [r.req_id for r in reqs]
        return all(
            w.blocks_needed(ids, self.width - (w is self.draft)) <= w.runner.allocator.num_free for w in self._workers()
        )

    def _admit(self) -> None:
        """Admit waiting requests while the next step's KV fits. The running batch's need is summed once and
        grown by each admitted request (adding one sequence leaves the others' tables as they are), so admitting
        a large batch stays linear in its size; free blocks are read after each add (a prefix hit takes some)."""
        workers = self._workers()
        lookahead = [self.width - (w is self.draft) for w in workers]
        running_ids = [r.req_id for r in self.running]
        needed = [w.blocks_needed(running_ids, n) for w, n in zip(workers, lookahead, strict=True)]
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            spec = seq_spec(req, self.eos_ids)  # what the workers get in the services: the same processing
            for w in workers:
                w.add(req.req_id, req.all_tokens, sampling_from_spec(spec), len(req.prompt_ids))
            needed = [total + w.blocks_needed([req.req_id], n) for total, w, n in zip(needed, workers, lookahead,
                                                                                       strict=True)]
            fits = all(total <= w.runner.allocator.num_free for total, w in zip(needed, workers, strict=True))
            if not fits and self.running:
                for w in workers:
                    w.remove(req.req_id)
                return
            self.running.append(self.waiting.popleft())

    def _preempt_until_fits(self) -> None:
        """Free the newest requests (to be recomputed later) until this step's KV fits."""
        while len(self.running) > 1 and not self._fits(self.running):
            victim = self.running.pop()
            for w in self._workers():
                w.remove(victim.req_id)
            self.waiting.appendleft(victim)

    def _retire(self, req: Request, running: bool = True) -> None:
        """Free a request's KV on both models and forget it (`running`: take it out of the running list too)."""
        for w in self._workers():
            w.remove(req.req_id)
        if running and req in self.running:
            self.running.remove(req)
        self.requests.pop(req.req_id, None)

    def _states_first(self, ids: list[int]) -> None:
        """An EAGLE head drafts from the target's states, so in one process the target computes a new prompt
        (all but its last token, which the verify feeds) before the head drafts it, as vLLM's proposer does;
        the same forwards, in another order. Prompts that want prompt logprobs are left to their first verify."""
        if not isinstance(self.draft, EagleDrafter):
            return
        seqs = self.target.seqs
        chunks = [(s, seqs[s].length - 1) for s in ids
                  if seqs[s].cached < seqs[s].length - 1 and seqs[s].params.prompt_logprobs is None]
        if not chunks:
            return
        self.target.prefill(chunks)
        hidden = self.target.runner.take_hidden([s for s, _ in chunks])
        assert hidden is not None
        for (seq_id, _), part in zip(chunks, hidden.split(), strict=True):
            self.draft.commit(seq_id, [], 0, part)

    def step(self) -> list[Request]:
        """One draft+verify (or AR) step over the running batch; returns requests that advanced."""
        self._admit()
        self._preempt_until_fits()
        if not self.running:
            return []
        batch = list(self.running)
        ids = [r.req_id for r in batch]
        self._states_first(ids)
        selects = self.width > self.k or self.config.tetris_min_prob > 0
        budget = self.k * len(ids) if selects else 0
        budget, capacity = self.capacity.plan(len(ids), self.width, budget)
        proposal = (propose_selected(self.draft, ids, self.width, budget, self.config.tetris_min_prob, capacity)
                    if self.draft is not None else None)
        verdict = self.target.verify(ids, proposal)
        self.capacity.settle(proposal)  # after the verdict's readback
        hidden = self.target.runner.take_hidden(ids)  # an EAGLE head's states (None for a draft model)
        states = hidden.split() if hidden is not None else [None] * len(ids)  # row b's run, in one pass
        self.total_steps += 1
        logprobs, prompt_logprobs = self.target.last_logprobs, self.target.last_prompt_logprobs
        for b, (req, row, accepted) in enumerate(zip(batch, verdict.tokens.tolist(), verdict.accepted.tolist(),
                                                     strict=True)):
            new_tokens = row[: accepted + 1]
            if req.req_id in prompt_logprobs and req.prompt_logprobs is None:
                req.prompt_logprobs = [None, *prompt_logprobs[req.req_id]]
            if self.draft is not None:
                self.draft.commit(req.req_id, new_tokens, accepted, states[b])
            req.stats.steps += 1
            req.stats.drafted += self.width if proposal is None or proposal.lengths is None else proposal.lengths[b]
            req.stats.accepted += accepted
            req.append_tokens(new_tokens, self.eos_ids, self.tokenizer, logprobs.get(req.req_id))
        if finished := [req for req in batch if req.finished]:
            self.running = [req for req in self.running if not req.finished]  # one pass, not a remove each
            for req in finished:
                self._retire(req, running=False)
        return batch

    def generate(
        self, prompts: Iterable[str | list[int]], params: list[SamplingParams] | SamplingParams
    ) -> list[Request]:
        """Run prompts to completion (offline use: CLI, tests, benchmarks)."""
        prompts = list(prompts)
        plist = params if isinstance(params, list) else [replace(params) for _ in prompts]
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        while self.has_unfinished():
            self.step()
        return reqs

