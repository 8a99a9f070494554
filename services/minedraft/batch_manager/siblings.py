"""n > 1: the sibling requests of one API request compute their shared prompt once per worker.

Siblings (same `share_prompt` key, same prompt) start one at a time until one of them holds the prompt's KV on
both workers: the first to start leads and the others wait in the queue, in their place, until the leader has
had a verdict (its prompt is then cached on the verifier, and on the draft service, which drafted it first).
From then on a sibling starts as a fork of a running member that had a verdict since it (re)started (its seq
id goes in SeqSpec.fork_of) and computes only what follows the shared whole blocks. A leader that leaves
before its verdict (finished, preempted, aborted) hands the lead to whichever sibling starts next. A worker
that cannot share (the parent is gone, or never computed the prompt) computes the prompt itself, so output
never depends on sharing.

The state is brought up to date from the running requests before each plan (`refresh`) rather than told of
every verdict, preemption and end: the step loop keeps no extra hooks, and nothing can be missed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minedraft.core.request import Request


@dataclass(slots=True)
class SiblingGroup:
    """Members not yet ended, the one computing the prompt now, and those whose prompt KV is on both workers."""

    key: str
    members: list[Request] = field(default_factory=list)
    leader: Request | None = None  # started, no verdict yet
    sources: list[Request] = field(default_factory=list)  # running, had a verdict since they (re)started


class Siblings:
    """Groups by share key. A request is known by identity (a preempted one changes its seq id); the group
    holds it, so its id() stays its own until it leaves the group."""

    def __init__(self) -> None:
        self._groups: dict[str, SiblingGroup] = {}
        self._group_of: dict[int, SiblingGroup] = {}  # id(request) -> its group
        self._steps_at_start: dict[int, int] = {}  # id(request) -> its verdict count when it last started

    def __len__(self) -> int:
        return len(self._groups)

    def join(self, req: Request, key: str | None) -> None:
        """A queued request that may share its prompt with those given the same key."""
        if key is None:
            return
        group = self._groups.setdefault(key, SiblingGroup(key))
        group.members.append(req)
        self._group_of[id(req)] = group

    def refresh(self, running: list[Request]) -> None:
        """Before a plan: who still leads, who holds the prompt's KV, who ended."""
        if not self._groups:
            return
        live = {id(r) for r in running}
        for group in list(self._groups.values()):
            for req in [r for r in group.members if r.finished]:
                group.members.remove(req)
                del self._group_of[id(req)]
                self._steps_at_start.pop(id(req), None)
            had_verdict = [r for r in group.members if id(r) in live and self._verified(r)]
            group.sources = sorted(had_verdict, key=lambda r: r.stats.started)
            if group.leader is not None and (id(group.leader) not in live
                                             or any(s is group.leader for s in group.sources)):
                group.leader = None
            if not group.members:
                del self._groups[group.key]

    def _verified(self, req: Request) -> bool:
        """A verdict came since it last started: its prompt is in both workers' KV."""
        return req.stats.steps > self._steps_at_start.get(id(req), req.stats.steps)

    # ----- the admission gate ------------------------------------------------------------

    def held(self, req: Request) -> bool:
        """Wait while a sibling computes the prompt and none holds it yet."""
        group = self._group_of.get(id(req))
        return group is not None and not group.sources and group.leader is not None and group.leader is not req

    def starting(self, req: Request) -> None:
        group = self._group_of.get(id(req))
        if group is None:
            return
        self._steps_at_start[id(req)] = req.stats.steps
        if not group.sources and group.leader is None:
            group.leader = req

    def fork_source(self, req: Request) -> int | None:
        """The running sibling whose prompt KV `req`, starting now, may share (its seq id), or None."""
        group = self._group_of.get(id(req))
        if group is None or not group.sources or group.leader is req:
            return None
        source = group.sources[0]
        if req.params.prompt_logprobs is not None and req.prompt_logprobs is None:
            if source.prompt_logprobs is None:
                return None  # a fork does not compute the prompt's logprobs: compute them
            req.prompt_logprobs = list(source.prompt_logprobs)  # the same prompt: the same logprobs
        return source.req_id
