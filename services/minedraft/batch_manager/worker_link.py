"""The batch manager's end of one worker's control stream over gRPC (grpc.aio)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from minedraft.batch_manager.link import EventHandler, LostHandler
from minedraft.observability import control_trace
from minedraft.proto import control_pb2, control_pb2_grpc

log = logging.getLogger(__name__)


class GrpcWorkerLink:
    """A `link.WorkerLink` over the worker's `Control` bidi stream and its `Info` call."""

    def __init__(self, role: str, address: str) -> None:
        self.role = role
        self.address = address
        self.channel: grpc.aio.Channel | None = None
        self.stub: control_pb2_grpc.WorkerStub | None = None
        self._outbox: asyncio.Queue[control_pb2.ControlMessage | None] | None = None
        self._reader: asyncio.Task | None = None
        self._call: grpc.aio.StreamStreamCall | None = None

    def _connect(self) -> control_pb2_grpc.WorkerStub:
        if self.stub is None:
            self.channel = grpc.aio.insecure_channel(self.address)
            self.stub = control_pb2_grpc.WorkerStub(self.channel)
        return self.stub

    async def info(self, timeout: float = 5.0) -> control_pb2.WorkerInfo:
        return await self._connect().Info(control_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True)

    async def open(self, on_event: EventHandler, on_lost: LostHandler) -> None:
        await self.close_stream()
        stub = self._connect()
        self._outbox = asyncio.Queue()
        self._call = stub.Control(self._messages(self._outbox, traced=self.role == "verifier"))
        self._reader = asyncio.create_task(self._read_events(self._call, on_event, on_lost))

    @staticmethod
    async def _messages(
        outbox: asyncio.Queue[control_pb2.ControlMessage | None], traced: bool = False,
    ) -> AsyncIterator[control_pb2.ControlMessage]:
        while (msg := await outbox.get()) is not None:
            if traced and msg.WhichOneof("body") == "plan":
                control_trace.mark("write", msg.plan.step)
            yield msg

    async def _read_events(self, call: grpc.aio.StreamStreamCall, on_event: EventHandler, on_lost: LostHandler) -> None:
        try:
            async for event in call:
                if self.role == "verifier":
                    control_trace.mark("verdict", event.step)
                on_event(event)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                log.warning("%s control stream failed: %s", self.role, exc.details())
        except asyncio.CancelledError:
            return
        if self._call is call:  # ended by the worker or the network, not by close_stream
            self._call = None
            self._outbox = None
            on_lost()

    def send(self, msg: control_pb2.ControlMessage) -> None:
        if self._call is not None and self._outbox is not None:
            if self.role == "verifier" and msg.WhichOneof("body") == "plan":
                control_trace.mark("plan", msg.plan.step)
            self._outbox.put_nowait(msg)

    async def close_stream(self) -> None:
        call, self._call = self._call, None
        if self._outbox is not None:
            self._outbox.put_nowait(None)
            self._outbox = None
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
            self.stub = None
