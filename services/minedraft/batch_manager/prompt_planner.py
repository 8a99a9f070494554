"""Which prompt tokens each plan computes: the prefix cache's expected hits and chunked prefill.

The batch manager owns both decisions, so the two workers never disagree about a step. Prefix caching: a
sequence joins a worker with `SeqSpec.prefix_cache` and its salt; the worker attaches whatever its own cache
holds of the prompt (core/prefix_hash.py keys, the same in every process). To plan, the manager keeps a
directory of the keys it expects both caches to hold (the full blocks of tokens every worker has verified,
least recently used dropped beyond the cache's size): that estimate, not a worker's answer, sets where a
prompt's chunks start, so one plan fits both workers; a worker that holds more skips the work, one that holds
less (it evicted, or restarted) computes the difference in its first chunk. Chunks carry absolute ends, so
both workers reach the same position at the same step whatever their caches held.

Chunked prefill: each plan has a token budget for the verifier (vLLM's max_num_batched_tokens): the verify
rows come first (k + 1 tokens each), prompts get the rest, and at least half the budget, so a full batch
cannot starve them. A new prompt whose uncached part fits what is left joins the batches at once and is
computed by its first step, as without chunking. A longer one is held here: each plan computes its next chunk
on both workers (StepPlan.prefill, before the verify and draft halves), up to its last token, and the plan
after the last chunk puts it in the batches, where its first step feeds that token alone. Running streams
thus see a step grow by at most the budget, never by a whole prompt. Requests that want prompt logprobs
need the logits of every prompt position from one forward: they skip the cache read and are never chunked.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from minedraft.core.prefix_hash import extend_keys, reusable_blocks
from minedraft.core.request import Request
from minedraft.proto import control_pb2


@dataclass(slots=True)
class PromptKeys:
    salt: str | None
    keys: list[bytes] = field(default_factory=list)
    published: int = 0  # leading keys already put in the directory


@dataclass(slots=True)
class Prefilling:
    """A prompt computed chunk by chunk: planned up to `done`, complete at `end` (all but its last token)."""

    seq_id: int
    done: int
    end: int


class PromptPlanner:
    """Expected cache hits, the prompts being chunked, and each plan's prompt chunks."""

    def __init__(self, block_size: int = 16, capacity_blocks: int = 0) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.caching = True
        self.budget = 96
        self._directory: OrderedDict[bytes, None] = OrderedDict()  # keys expected on both workers, LRU first
        self._keys: dict[int, PromptKeys] = {}  # running sequences' keys, by seq id
        self._prefilling: dict[int, Prefilling] = {}  # in admission order
        self._ready: list[int] = []  # complete: they join the batches at the next plan
        self.expected_hits = 0  # tokens the directory expected cached, over every start (for tests and /health)

    def configure(self, caching: bool, budget: int, block_size: int, capacity_blocks: int) -> None:
        self.caching, self.budget = caching, budget
        self.block_size, self.capacity_blocks = block_size, capacity_blocks

    @property
    def active(self) -> bool:
        """Prompts are being chunked (plans must go out even with empty batches)."""
        return bool(self._prefilling or self._ready)

    @staticmethod
    def reads_cache(req: Request) -> bool:
        """Prompt logprobs need every position's logits: such a request computes its whole prompt."""
        return req.params.prompt_logprobs is None or req.prompt_logprobs is not None

    def start(self, req: Request, room: int) -> tuple[bool, int]:
        """A request leaving the queue: (joins the batches now, prompt tokens its first step computes there)."""
        tokens = req.all_tokens
        hit = self._expected_hit(req, tokens) if self.caching and self.reads_cache(req) else 0
        self.expected_hits += hit
        uncached = len(tokens) - hit
        if uncached <= max(room, 1) or not self.reads_cache(req):
            return True, uncached
        self._prefilling[req.req_id] = Prefilling(req.req_id, hit, len(tokens) - 1)
        return False, 0

    def _expected_hit(self, req: Request, tokens: list[int]) -> int:
        entry = self._keys.setdefault(req.req_id, PromptKeys(req.params.cache_salt))
        bs = self.block_size
        extend_keys(entry.keys, tokens, bs, reusable_blocks(len(tokens), bs), entry.salt)
        hit = 0
        for key in entry.keys:
            if key not in self._directory:
                break
            self._directory.move_to_end(key)
            hit += 1
        return hit * bs

    def take_ready(self) -> list[int]:
        """Prompts whose last chunk went out in an earlier plan: into the batches now."""
        ready, self._ready = self._ready, []
        return ready

    def chunks(self, verify_tokens: int) -> list[control_pb2.PrefillChunk]:
        """This plan's prompt chunks, oldest prompt first, within what the verify rows leave of the budget."""
        room = max(self.budget - verify_tokens, self.budget // 2)
        out: list[control_pb2.PrefillChunk] = []
        for seq_id, pre in list(self._prefilling.items()):
            if room <= 0:
                break
            take = min(room, pre.end - pre.done)
            pre.done += take
            room -= take
            out.append(control_pb2.PrefillChunk(seq_id=seq_id, end=pre.done))
            self._publish(seq_id, pre.done)
            if pre.done >= pre.end:
                del self._prefilling[seq_id]
                self._ready.append(seq_id)
        return out

    def verified(self, req: Request) -> None:
        """The request's committed tokens grew: the full blocks both workers now hold verified join the
        directory."""
        self._publish(req.req_id, req.num_tokens - 1, req)

    def _publish(self, seq_id: int, upto: int, req: Request | None = None) -> None:
        entry = self._keys.get(seq_id)
        if entry is None or not self.caching:
            return
        count = upto // self.block_size
        if count <= entry.published:
            return
        if req is not None and len(entry.keys) < count:
            extend_keys(entry.keys, req.all_tokens, self.block_size, count, entry.salt)
        for key in entry.keys[entry.published:count]:
            self._directory[key] = None
            self._directory.move_to_end(key)
        entry.published = min(count, len(entry.keys))
        while self.capacity_blocks and len(self._directory) > self.capacity_blocks:
            self._directory.popitem(last=False)

    def drop(self, seq_id: int) -> None:
        """The sequence left (finished, aborted, preempted): forget its chunks, not what it cached."""
        self._keys.pop(seq_id, None)
        self._prefilling.pop(seq_id, None)
        if seq_id in self._ready:
            self._ready.remove(seq_id)

    def caches_lost(self) -> None:
        """A worker restarted with an empty cache: expect nothing cached until blocks are verified again."""
        self._directory.clear()
