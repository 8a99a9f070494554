"""The batch manager's end of one worker's control stream (grpc.aio)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from minedraft.proto import control_pb2, control_pb2_grpc

log = logging.getLogger(__name__)

EventHandler = Callable[[str, control_pb2.WorkerEvent], None]
LostHandler = Callable[[str], None]


class WorkerLink:
    """Sends plans without waiting for replies; events arrive through a callback."""

    def __init__(self, role: str, address: str, on_event: EventHandler, on_lost: LostHandler) -> None:
        self.role = role
        self.address = address
        self.on_event = on_event
        self.on_lost = on_lost
        self.channel: grpc.aio.Channel | None = None
        self.stub: control_pb2_grpc.WorkerStub | None = None
        self.alive = False
        self._outbox: asyncio.Queue[control_pb2.ControlMessage | None] | None = None
        self._reader: asyncio.Task | None = None
        self._call: grpc.aio.StreamStreamCall | None = None

    async def info(self, timeout: float = 5.0) -> control_pb2.WorkerInfo:
        if self.channel is None:
            self.channel = grpc.aio.insecure_channel(self.address)
            self.stub = control_pb2_grpc.WorkerStub(self.channel)
        assert self.stub is not None
        return await self.stub.Info(control_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True)

    async def open(self) -> None:
        """Start a fresh control stream (the worker resets its state for it)."""
        await self.close_stream()
        assert self.stub is not None
        self._outbox = asyncio.Queue()
        self._call = self.stub.Control(self._messages())
        self.alive = True
        self._reader = asyncio.create_task(self._read_events(self._call))

    async def _messages(self) -> AsyncIterator[control_pb2.ControlMessage]:
        outbox = self._outbox
        assert outbox is not None
        while (msg := await outbox.get()) is not None:
            yield msg

    async def _read_events(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            async for event in call:
                self.on_event(self.role, event)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                log.warning("%s control stream failed: %s", self.role, exc.details())
        except asyncio.CancelledError:
            return
        if self._call is call:
            self._mark_lost()

    def _mark_lost(self) -> None:
        if self.alive:
            self.alive = False
            self.on_lost(self.role)

    def send(self, msg: control_pb2.ControlMessage) -> None:
        if self.alive and self._outbox is not None:
            self._outbox.put_nowait(msg)

    async def close_stream(self) -> None:
        call, self._call = self._call, None
        self.alive = False
        if self._outbox is not None:
            self._outbox.put_nowait(None)
        if call is not None:
            call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None

    async def close(self) -> None:
        await self.close_stream()
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
