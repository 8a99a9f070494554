"""The draft service's life in the loop: data-plane epochs, loss, return.

The supervisor performs the moves of `draft_state`: it forms an epoch with the verifier
(CONNECTING / RECOVERING -> DRAFTING), notices a loss from either side (-> LOST_AR), and
keeps asking the draft service until it answers, then drains the loop and forms a fresh
epoch. What a move means for the requests (counters, re-adding every running sequence)
is the step loop's business, told through `LoopHooks`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.draft_state import DraftLinkState, DraftState
from minedraft.batch_manager.link import WorkerLink, guarded
from minedraft.batch_manager.policy import two_batches
from minedraft.batch_manager.step_stats import Counters
from minedraft.proto import control_pb2

log = logging.getLogger(__name__)
S = DraftState
INFO_TIMEOUT_S = 2.0  # how long one probe of a lost draft service waits for an answer
SETUP_SLACK_S = 10.0  # beyond the workers' own data-plane timeout


def link_transport(reported: list[str], backend: str) -> str:
    """The draft link's transport from both workers' setup replies (verifier's first): a named
    one ("P2P", "SHM", "NET", "gloo") wins over "nccl" (a worker that could not read NCCL's report)."""
    named = [t for t in reported if t and t != backend]
    return named[0] if named else next((t for t in reported if t), backend)


class DraftGoneError(ConnectionError):
    """The draft service's control stream ended while an epoch was forming."""


class LoopHooks(Protocol):
    """What the supervisor asks of the step loop."""

    serving: bool  # the verifier's stream is open (an epoch needs both workers)
    fault: Callable[[Exception], None]  # where an error raised while handling a worker's event goes

    def draining(self) -> AbstractAsyncContextManager[None]:
        """Hold new plans and wait until the verifier ran every issued one."""
        ...

    def draft_left(self) -> None:
        """Drafting stopped because the draft service or the data plane is gone."""
        ...

    def draft_back(self) -> None:
        """A fresh epoch formed after a loss (called while drained): re-add every sequence."""
        ...

    def draft_step_done(self, event: control_pb2.WorkerEvent) -> None:
        """The draft service finished a step (timing)."""
        ...



class DraftSupervisor:
    """Owns the draft link and its state; `state.connected` says whether plans go to it."""

    def __init__(
        self, link: WorkerLink | None, verifier: WorkerLink, loop: LoopHooks, config: Callable[[], ManagerConfig]
    ) -> None:
        self.link = link
        self.verifier = verifier
        self.loop = loop
        self.config = config
        self.state = DraftLinkState(has_draft=link is not None)
        self.epoch = 0
        self.manager_run = secrets.token_hex(8)  # names this manager's epochs in the verifier's store
        self.transport = ""  # what the current epoch's data plane runs over ("" while none is up)
        self.reason = ""  # why the draft service last left the loop (for /health while degraded)
        self._replies: dict[str, asyncio.Future[control_pb2.WorkerEvent]] = {}
        self._recovery: asyncio.Task | None = None
        self.colocated = False  # the verifier drafts on its own GPU (no draft link, no data plane)
        self.stand_in = False  # the verifier has its own draft too: it drafts while the draft service is lost

    # ----- moves ------------------------------------------------------------------------

    def colocate(self) -> None:
        """The verifier loaded the draft model itself (--colocated-draft): drafting from the start,
        for good; a configured draft service is left out. Loss and recovery do not apply."""
        self.link = None
        self.colocated = True
        self.state = DraftLinkState(has_draft=True)
        self.state.to(S.DRAFTING)
        self.transport = "colocated"

    @property
    def drafts_here(self) -> bool:
        """Plans draft on the verifier (its --colocated-draft): for good, or while the draft service is lost."""
        return self.colocated or self.state.state is S.LOST_COLOCATED

    def two_batches(self, mode: str) -> bool:
        """Whether `mode` runs PSD's two batches now: a colocated verifier's auto, and every drafting mode of a
        stand-in verifier, run fused SD on one batch instead (one GPU cannot overlap two)."""
        return self.state.state is not S.LOST_COLOCATED and two_batches(mode, colocated=self.colocated)

    @property
    def lost_state(self) -> DraftState:
        return S.LOST_COLOCATED if self.stand_in else S.LOST_AR

    @property
    def sends_plans(self) -> bool:
        """Plans and verdicts go to a draft service (not while it is out of the loop, nor when colocated)."""
        return self.state.connected and self.link is not None

    async def start(self) -> None:
        """Form the first epoch; when that fails, keep retrying in the background."""
        if self.link is None:
            return
        if await self._form_epoch():
            self.state.to(S.DRAFTING)
        else:
            self.reason = "the draft service did not join the data plane at start-up"
            self.state.to(self.lost_state)
            self._recovery = asyncio.create_task(self._recover())

    def lost(self, why: str = "draft service lost") -> None:
        """Either side reported the draft service or the data plane gone (or the verifier died)."""
        if self.colocated:  # the draft lives in the verifier: it goes and comes back with it
            return
        if self.state.state in (S.CONNECTING, S.RECOVERING):
            self._fail_reply("draft", DraftGoneError(f"{why} during data-plane setup"))
            return
        if not self.state.connected:
            return
        assert self.link is not None
        log.warning("%s: continuing %s", why, "with the verifier's own draft model" if self.stand_in
                    else "autoregressively on the verifier")
        self.reason = why
        if self.loop.serving:  # the verifier may wait on a receive from it: NCCL would wait out its timeout
            abort = control_pb2.DataPlaneAbort(epoch=self.epoch, reason=why)
            self.verifier.send(control_pb2.ControlMessage(abort=abort))
        self.state.to(self.lost_state)
        self.transport = ""
        self.loop.draft_left()
        asyncio.get_running_loop().create_task(self.link.close_stream())
        self._recovery = asyncio.get_running_loop().create_task(self._recover())

    def judge_auto(self, step: int, counters: Counters) -> bool:
        """auto mode: pause a drafting draft service while recent speculative steps show it does not pay
        (until a probe step `auto_probe_steps` later); True when it paused. A stand-in verifier keeps drafting."""
        cfg = self.config()
        if cfg.mode != "auto" or self.state.state is not S.DRAFTING:
            return False
        if not counters.drafting_does_not_pay(cfg.auto_min_tokens_per_step):
            return False
        self.state.pause(until_step=step + cfg.auto_probe_steps)
        counters.reset_recent()
        return True

    def verifier_lost(self) -> None:
        """The verifier died: the data plane died with it; a new epoch forms once it is back."""
        self._fail_reply("verifier", DraftGoneError("the verifier was lost during data-plane setup"))
        self.lost("the verifier was lost, and the data plane with it")

    async def _recover(self) -> None:
        """Lost until the draft service (and the verifier) answer, then RECOVERING with the loop drained."""
        assert self.link is not None
        while self.state.lost:
            await asyncio.sleep(self.config().draft_retry_s)
            if not self.loop.serving:
                continue
            try:
                await self.link.info(timeout=INFO_TIMEOUT_S)
            except Exception:
                continue
            async with self.loop.draining():
                if not self.state.lost:  # stopping
                    return
                self.state.to(S.RECOVERING)
                try:
                    formed = await self._form_epoch()
                except Exception as exc:  # a worker went away while the epoch was forming
                    log.warning("data plane epoch %d did not form: %s", self.epoch, exc)
                    await self.link.close_stream()
                    formed = False
                if self.state.state is not S.RECOVERING:
                    return
                if formed:
                    self.state.to(S.DRAFTING)
                    self.loop.draft_back()
                    log.info("draft service is back: data plane epoch %d over %s", self.epoch, self.transport)
                else:
                    self.state.to(self.lost_state)

    async def stop(self) -> None:
        if self.state.state is not S.STOPPING:
            self.state.to(S.STOPPING)
        if self._recovery is not None:
            self._recovery.cancel()
        if self.link is not None:
            await self.link.close()

    # ----- one data-plane epoch ---------------------------------------------------------

    async def _form_epoch(self) -> bool:
        """Open a fresh draft stream and have both workers join a new process group."""
        assert self.link is not None
        cfg = self.config()
        vinfo = await self.verifier.info()
        await self.link.open(guarded(self._on_event, self.loop.fault), self.lost)
        self.epoch += 1
        loop = asyncio.get_running_loop()
        self._replies = {role: loop.create_future() for role in ("verifier", "draft")}
        setup = control_pb2.DataPlaneSetup(epoch=self.epoch, master_addr=vinfo.data_plane_addr,
                                           master_port=vinfo.data_plane_port, backend=cfg.data_plane_backend,
                                           timeout_s=cfg.data_plane_timeout_s, manager_run=self.manager_run)
        self.verifier.send(control_pb2.ControlMessage(setup=setup))
        self.link.send(control_pb2.ControlMessage(setup=setup))
        waiting = asyncio.gather(*self._replies.values(), return_exceptions=True)
        try:
            replies = await asyncio.wait_for(waiting, cfg.data_plane_timeout_s + SETUP_SLACK_S)
        except TimeoutError:
            replies = []
        self._replies = {}
        events = [r for r in replies if isinstance(r, control_pb2.WorkerEvent)]
        if len(events) < 2 or not all(e.setup_done for e in events):
            log.warning("data plane epoch %d did not form: %s", self.epoch, [str(r) for r in replies] or "timeout")
            await self.link.close_stream()
            return False
        self.transport = link_transport([e.transport for e in events], cfg.data_plane_backend)
        return True

    def on_setup_reply(self, role: str, event: control_pb2.WorkerEvent) -> None:
        """A worker's answer to DataPlaneSetup (replies of an abandoned epoch are ignored)."""
        waiter = self._replies.get(role)
        if waiter is not None and not waiter.done() and event.epoch in (0, self.epoch):
            waiter.set_result(event)

    def _fail_reply(self, role: str, exc: Exception) -> None:
        waiter = self._replies.get(role)
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _on_event(self, event: control_pb2.WorkerEvent) -> None:
        """Events of the draft service's stream."""
        if event.step < 0:
            self.on_setup_reply("draft", event)
            return
        if event.error:
            log.error("draft service error at step %d: %s", event.step, event.error)
        self.loop.draft_step_done(event)
        if event.data_plane_lost:
            self.lost()
