"""What the step driver needs from a worker: the narrow interface of one control link.

The product implements it over gRPC (`worker_link.GrpcWorkerLink`); the unit tests drive
the real step loop through in-memory links. Plans go out without waiting for replies;
events come back through the handlers given to `open`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from minedraft.proto import control_pb2

EventHandler = Callable[[control_pb2.WorkerEvent], None]
LostHandler = Callable[[], None]


class WorkerLink(Protocol):
    """The batch manager's end of one worker's control stream."""

    role: str  # "verifier" or "draft", for logs

    async def info(self, timeout: float = 5.0) -> control_pb2.WorkerInfo:
        """The worker's snapshot; waits up to `timeout` for it to answer, else raises."""
        ...

    async def open(self, on_event: EventHandler, on_lost: LostHandler) -> None:
        """Start a fresh control stream (the worker resets its state for it).

        `on_event` gets every event of this stream; `on_lost` is called once if the stream
        ends by itself (not by `close_stream`).
        """
        ...

    def send(self, msg: control_pb2.ControlMessage) -> None:
        """Queue a message on the open stream; dropped when there is none."""
        ...

    async def close_stream(self) -> None:
        """End the current stream without calling its `on_lost`."""
        ...

    async def close(self) -> None:
        """End the stream and release the connection."""
        ...


def raise_fault(error: Exception) -> None:
    raise error


def guarded(handler: EventHandler, on_fault: Callable[[Exception], None]) -> EventHandler:
    """`handler`, with any error it raises given to `on_fault`: a handler that fails inside a stream's reader
    would otherwise end the reader quietly, and no event of that worker would ever be handled again."""

    def call(event: control_pb2.WorkerEvent) -> None:
        try:
            handler(event)
        except Exception as error:
            on_fault(error)

    return call
