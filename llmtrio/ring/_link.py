"""The worker's side of the ring, as interfaces: what a worker (``llmtrio.worker.serve_link``)
needs from its attachment, whether the ring is in this process (``Ring.attach`` gives a
``WorkerLink``) or across the network (``connect_ring`` gives a ``RemoteLink``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Protocol, Self

import trio

from ._messages import Heartbeat, RequestHead

__all__ = ["ClaimedStream", "RingLink"]


class ClaimedStream(Protocol):
    """A stream a worker claimed: the request to serve and the response lane to write.

    Write ``send_head``, then any number of ``send``, then ``end`` (or ``fail`` at any
    point). ``cancelled`` is set when the client goes away; the worker stops and finishes the
    stream, which acknowledges the cancellation. Leaving ``with stream:`` without ending fails
    the stream (or acknowledges a cancellation).
    """

    @property
    def stream_id(self) -> int: ...

    @property
    def head(self) -> RequestHead: ...

    @property
    def body(self) -> bytes: ...

    @property
    def cancelled(self) -> trio.Event: ...

    async def send_head(
        self, status: int, headers: Iterable[tuple[str, str]] | Mapping[str, str] = ()
    ) -> None:
        """Send the status and headers. ``StreamCancelledError`` once the client is gone."""

    async def send(self, data: bytes) -> None:
        """Send a body chunk, waiting while this stream's client is behind (back-pressure on
        this stream only). ``StreamCancelledError`` once the client is gone."""

    async def end(self, last: bytes = b"") -> None:
        """The response is complete (or the cancellation is acknowledged); ``last`` is a
        final body chunk, handed over without waiting where the transport allows."""

    def fail(self, message: str) -> None:
        """The worker cannot finish; never blocks; nothing once the stream is finished."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


class RingLink(Protocol):
    """A worker's attachment to one or more rings: claim a stream when a slot is free.

    ``max_inflight`` bounds the streams held at once, over every ring the link reaches: the
    caller claims only while it holds fewer.
    """

    @property
    def worker_id(self) -> str: ...

    @property
    def max_inflight(self) -> int: ...

    def heartbeat(self, beat: Heartbeat) -> None:
        """Report the engine's capacity; never blocks."""

    async def claim(self) -> ClaimedStream:
        """Wait for the oldest parked stream; cancelling the wait takes the claim back."""


def unfinished_reason(exc_value: BaseException | None) -> str:
    """Why a claimed stream left its ``with`` block unfinished, for its ``ResponseError``: the
    ingress logs it and tells its client no internals."""
    if exc_value is None:
        return "the worker finished without ending the response"
    if isinstance(exc_value, trio.Cancelled):
        return "the worker was cancelled"
    return f"the worker failed: {exc_value!r}"
