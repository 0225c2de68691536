"""A ring stream's life: its states, and what a worker's message does to each (sans-IO).

Stream states::

    park ─▶ PARKED ─Claim─▶ ASSIGNED ─ResponseHead─▶ RESPONDING ─ResponseEnd─▶ ENDED
              ▲               │  │                    │  ↺ ResponseData
              └───────────────┘  │ ResponseError, or  │ ResponseError,
              worker detach or   │ worker detach once │ worker detach
              Release: requeued  │ assigned           │
              at the front       │ max_assignments    │
                                 │ times              ▼
                                 └──────────────────▶ FAILED

    cancel: PARKED ─▶ forgotten at once
            ASSIGNED or RESPONDING ─▶ CANCELLED, and the worker is sent Cancel; the stream
            stays in the worker's held set until it acknowledges with ResponseEnd,
            ResponseError or Release (or detaches); anything else it sends meanwhile is dropped

What a worker's message does to the stream it names is ``TRANSITIONS`` (state -> message type
-> new state), the table the drawing is drawn from; a message missing from a state's row is a
``ProtocolError`` (``RingCore`` applies it). ENDED, FAILED and parked-then-cancelled streams
are forgotten at once; a CANCELLED stream no longer counts against ``max_streams`` but stays in
its worker's held set until the worker acknowledges.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from ._errors import ProtocolError
from ._messages import (
    Message,
    Release,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    ResponseMessage,
)

__all__ = ["TRANSITIONS", "StreamState"]


class StreamState(enum.Enum):
    """Where a stream is in its life; see the drawing at the top of this module."""

    PARKED = "parked"
    ASSIGNED = "assigned"
    RESPONDING = "responding"
    ENDED = "ended"
    FAILED = "failed"
    CANCELLED = "cancelled"


_S = StreamState
TRANSITIONS: Final[Mapping[StreamState, Mapping[type[Message], StreamState]]] = {
    _S.ASSIGNED: {ResponseHead: _S.RESPONDING, ResponseError: _S.FAILED, Release: _S.PARKED},
    _S.RESPONDING: {ResponseData: _S.RESPONDING, ResponseEnd: _S.ENDED, ResponseError: _S.FAILED},
    # The worker has been sent Cancel: an End, an Error or a Release acknowledges it (the stream
    # is then forgotten); a head or data still in flight is dropped.
    _S.CANCELLED: {
        ResponseHead: _S.CANCELLED,
        ResponseData: _S.CANCELLED,
        ResponseEnd: _S.ENDED,
        ResponseError: _S.ENDED,
        Release: _S.ENDED,
    },
}
"""What a worker's message does to a stream it holds: state -> message type -> new state.

PARKED streams are held by no worker, and ENDED and FAILED ones are forgotten, so a worker can
send nothing about them. A stream leaving CANCELLED for ENDED is acknowledged and forgotten.
"""


def next_state(state: StreamState, message: ResponseMessage | Release) -> StreamState:
    """The state ``message`` moves a stream in ``state`` to (``TRANSITIONS``).

    Error handling: ``ProtocolError`` when the message is illegal in that state.
    """
    new = TRANSITIONS.get(state, {}).get(type(message))
    if new is None:
        if isinstance(message, Release):
            raise ProtocolError(
                f"stream {message.stream_id} cannot be released once its response has started",
                message,
            )
        raise ProtocolError(
            f"{type(message).__name__} is illegal on stream {message.stream_id} in state "
            f"{state.name}",
            message,
        )
    return new
