"""The verifier's return: after its control stream is lost, ask until it answers, then reconnect.

A verifier that dies takes every sequence's KV with it, so the requests it was running fail at
once with a clear error (the step loop does that); new requests are refused with UNAVAILABLE
until a verifier answers on the same address again (a restarted process or container). Then a
fresh stream is opened (the worker starts empty) and the loop serves again; the draft service,
which lost its data-plane peer, is brought back by its own supervisor once this is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from minedraft.batch_manager.link import EventHandler, LostHandler, WorkerLink, guarded
from minedraft.proto import control_pb2

log = logging.getLogger(__name__)
INFO_TIMEOUT_S = 2.0  # how long one probe of a lost verifier waits for an answer


class VerifierHooks(Protocol):
    on_verifier_event: EventHandler
    on_verifier_lost: LostHandler
    fault: Callable[[Exception], None]  # where an error raised while handling its events goes

    def verifier_back(self, info: control_pb2.WorkerInfo) -> None:
        """The fresh stream is open: serve again."""
        ...


class VerifierSupervisor:
    def __init__(self, link: WorkerLink, loop: VerifierHooks, vocab_size: int, retry_s: Callable[[], float]) -> None:
        self.link = link
        self.loop = loop
        self.vocab_size = vocab_size  # the tokenizer's: a verifier with a smaller vocabulary cannot take over
        self.retry_s = retry_s
        self.reconnects = 0
        self._task: asyncio.Task | None = None

    def lost(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        await self.link.close_stream()
        while True:
            await asyncio.sleep(self.retry_s())
            try:
                info = await self.link.info(timeout=INFO_TIMEOUT_S)
            except Exception:
                continue
            if info.vocab_size < self.vocab_size:
                log.error("the verifier answers again but cannot take over: its model has %d tokens, the "
                          "tokenizer %d", info.vocab_size, self.vocab_size)
                continue
            await self.link.open(guarded(self.loop.on_verifier_event, self.loop.fault), self.loop.on_verifier_lost)
            self.reconnects += 1
            log.info("verifier is back (reconnect %d): serving again", self.reconnects)
            self.loop.verifier_back(info)
            return

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
