"""The ring's exceptions.

RingError
├── RingFullError           max_streams streams are open; ``retry_after`` says when to try again
├── ParkTimeoutError        no worker claimed the stream within ``park_timeout`` (it is cancelled)
├── StreamCancelledError    the client went away (raised to the worker writing to its stream)
├── WorkerFailedError       the worker failed or detached before finishing (raised to the client)
├── ProtocolError           an illegal transition or a malformed frame; ``offending`` holds it
└── ControlRefusedError     a control connection refused (TLS, version, handshake), with why
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._messages import Message

__all__ = [
    "ControlRefusedError",
    "ParkTimeoutError",
    "ProtocolError",
    "RingError",
    "RingFullError",
    "StreamCancelledError",
    "WorkerFailedError",
]


class RingError(Exception):
    """Base class of everything the ring raises."""


class RingFullError(RingError):
    """The ring already holds ``max_streams`` open streams (parked or being served).

    Nothing was parked. ``retry_after`` is the number of seconds the caller should suggest
    to its client before trying again (an HTTP ingress answers 503 with ``Retry-After``).
    """

    def __init__(self, retry_after: float, max_streams: int) -> None:
        super().__init__(
            f"the ring is full ({max_streams} streams open); retry after {retry_after:g}s"
        )
        self.retry_after = retry_after
        self.max_streams = max_streams


class ParkTimeoutError(RingError):
    """No worker claimed the stream within the ring's ``park_timeout`` seconds; the stream
    has been cancelled. ``retry_after`` as in ``RingFullError`` (an HTTP ingress answers 503
    with ``Retry-After``)."""

    def __init__(self, park_timeout: float, retry_after: float) -> None:
        super().__init__(f"no worker took the request within {park_timeout:g}s")
        self.park_timeout = park_timeout
        self.retry_after = retry_after


class StreamCancelledError(RingError):
    """The client of this stream went away; nothing more written to it reaches anyone.

    Raised to a worker sending on a cancelled stream. The worker should stop generating and
    finish the stream (``end`` or ``fail``), which acknowledges the cancellation.
    """


class WorkerFailedError(RingError):
    """The worker serving this stream failed, or detached before finishing the response.

    Raised to the client side, from ``response_head()`` when no head had arrived yet, or from
    the body iterator after the chunks that did arrive.
    """


class ProtocolError(RingError):
    """A message that is illegal in the stream's or worker's current state, or a malformed frame.

    ``offending`` is the decoded message that broke the rules, the raw bytes of a frame that
    could not be decoded, or ``None`` when there is neither (a truncated stream). The state
    the error was raised from is left unchanged.
    """

    def __init__(self, reason: str, offending: Message | bytes | None = None) -> None:
        super().__init__(reason)
        self.offending = offending


class ControlRefusedError(RingError):
    """A control connection between a worker and an ingress could not be opened or was
    refused: TLS (no certificate, another CA), the WebSocket handshake, or the protocol
    version. The message says why (e.g. ``tlsv13 alert certificate required``)."""
