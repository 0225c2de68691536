"""The client side of a parked request: ``RingStream``, reading the response its worker writes.

The ring's router (``_router``) delivers a stream's response messages into its
``ResponseState`` (the head, body chunks, the end); the ``RingStream`` reads them from there,
and asks the router (never its core) for what only the ring knows: the stream's state, and
its cancellation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Never, Self

import attrs
import trio

from ._errors import ParkTimeoutError, StreamCancelledError, WorkerFailedError
from ._messages import Outcome, RequestHead, ResponseHead
from ._router import ResponseState, Router
from ._states import StreamState

__all__ = ["RingStream"]


@attrs.define(eq=False)
class RingStream:
    """The client side of one parked request: its response.

    Read it with ``await response_head()`` then ``async for chunk in body()``. ``cancel()``
    (or leaving ``with stream:``) says the client went away. ``outcome`` is what the worker
    stated the response ended with, once it has.
    """

    _router: Router
    stream_id: int
    request_head: RequestHead
    key: str
    """The routing key the request was parked with (its ``model``; may be empty)."""
    _response: ResponseState

    @property
    def state(self) -> StreamState:
        """PARKED, ASSIGNED or RESPONDING while live; then ENDED, FAILED or CANCELLED."""
        if self._response.over is not None:
            return self._response.over
        state = self._router.state(self.stream_id)
        assert state is not None, "a live stream is tracked by the core"
        return state

    @property
    def worker_id(self) -> str | None:
        """The worker that sent the response head (for logs), once it has."""
        return self._response.worker_id

    @property
    def outcome(self) -> Outcome | None:
        """What the worker stated the response ended with (``ResponseEnd``/``ResponseError``),
        once the stream has ended or failed; ``None`` before that, if it stated nothing, or if
        the stream was cancelled (by its client, or by the ring when the worker went away)."""
        return self._response.outcome

    async def response_head(self) -> ResponseHead:
        """Wait for the response head (status and headers); returns it again on later calls.

        Error handling: ``WorkerFailedError`` if the worker failed or detached before sending
        it; ``StreamCancelledError`` if this stream was cancelled first; ``ParkTimeoutError``
        (the stream is cancelled) if it stayed parked for the ring's ``park_timeout`` seconds
        at a time (each requeue starts a new wait).
        """
        timeout = self._router.park_timeout
        if timeout is not None:
            await self._watch_park(timeout)
        await self._response.settled.wait()
        if self._response.head is not None:
            return self._response.head
        self._raise_outcome()

    def body(self) -> AsyncIterator[bytes]:
        """The response body, chunk by chunk, as the worker writes it.

        Waits for the head first if ``response_head()`` was not awaited. Iteration stops when
        the worker ends the response. Error handling: raises ``WorkerFailedError`` after the
        chunks that arrived if the worker fails or detaches mid-way, ``StreamCancelledError``
        if this stream was cancelled.
        """
        return _ResponseBody(self._next_chunk)

    async def whole_body(self) -> bytes:
        """The whole response body, once the worker has ended it: the chunks of ``body()``
        joined, with one schedule point (none where it waited).

        Error handling: as ``body()``.
        """
        response = self._response
        if response.head is None:
            await self.response_head()
        await trio.lowlevel.checkpoint_if_cancelled()
        chunks: list[bytes] = []
        waited = False
        while True:
            if response.closed:  # by cancel(), maybe after the end
                raise StreamCancelledError(f"stream {self.stream_id} was cancelled")
            while response.chunks:
                chunks.append(response.take())
                if response.full:  # one moved into the buffer
                    self._router.credit(self.stream_id)
            if response.over is StreamState.ENDED:
                break
            if response.over is not None:
                self._raise_outcome()
            await response.changed.park()
            waited = True
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return b"".join(chunks)

    def cancel(self) -> None:
        """The client went away. Idempotent, never blocks.

        Resource handling: frees the stream's spot in the ring at once, drops buffered
        chunks, and tells the worker holding it (``Claimed.cancelled`` is set and its
        ``send`` raises ``StreamCancelledError``). Does nothing to a stream that has ended or
        failed, beyond dropping what was not read.
        """
        self._response.close()
        if self._response.over is not None:
            return
        self._response.finish(StreamState.CANCELLED)
        self._router.cancel(self.stream_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cancel()

    async def _watch_park(self, limit_s: float) -> None:
        parked_at = trio.current_time()
        moved = self._response.moved
        while not self._response.settled.is_set():
            if self._is_parked():
                with trio.move_on_at(parked_at + limit_s):
                    await moved.park()
                    continue
                self.cancel()
                raise ParkTimeoutError(limit_s, self._router.retry_after)
            await moved.park()
            if self._is_parked():  # requeued: its worker went away
                parked_at = trio.current_time()

    def _is_parked(self) -> bool:
        return self.state is StreamState.PARKED

    async def _next_chunk(self) -> bytes:
        response = self._response
        if response.head is None:
            await self.response_head()
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            if response.closed:  # by cancel(), maybe after the end
                raise StreamCancelledError(f"stream {self.stream_id} was cancelled")
            if response.chunks:
                data = response.take()  # room for the worker's next chunk
                if response.full:  # one moved into the buffer
                    self._router.credit(self.stream_id)
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return data
            if response.over is StreamState.ENDED:
                raise StopAsyncIteration
            if response.over is not None:
                self._raise_outcome()
            await response.changed.park()
            waited = True

    def _raise_outcome(self) -> Never:
        over = self._response.over
        if over is StreamState.FAILED:
            raise WorkerFailedError(self._response.error)
        if over is StreamState.CANCELLED:
            raise StreamCancelledError(f"stream {self.stream_id} was cancelled by its client")
        raise AssertionError(f"no response to report in state {over}")


@attrs.define(eq=False)
class _ResponseBody:
    _next: Callable[[], Awaitable[bytes]]

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        return await self._next()
