"""The ingress's end of one worker's control connection, with no I/O at all (sans-IO).

``SessionCore`` stands between the wire and the ring, as h11's ``Connection`` stands between
bytes and an HTTP application: the control listener feeds it what the worker sent
(``receive``), what the ring has for the worker (``from_ring``) and the time (``expire``),
and carries out the effects it returns: ``ToWire`` (a message for the worker), ``ToRing`` (a
message for the ring, as it is: ``WorkerLink.post``), ``StreamLost`` (a stream given up, for the
log) and ``SessionClosed`` (the session is over). What the ring decides (which stream goes where,
what a stream's state allows) stays in ``RingCore``; what belongs to one connection is here:

- the handshake: the first message must be an ``Attach`` of this ingress's protocol version,
  within ``worker_timeout``; the worker is named by the ingress (after its certificate);
- claims: the worker's unfilled claims plus the streams it holds never exceed the
  ``max_inflight`` it attached with (a ``Claim`` beyond is a ``ProtocolError``);
- credits: each ``Assign`` grants ``credits`` body chunks; each chunk that enters its client's
  buffer comes back from the ring as a ``Credit`` and goes on to the worker; a chunk beyond
  the credits is a ``ProtocolError``, except one last chunk, after which only the end may come;
- cancels: the client going away sends ``Cancel``; a worker that does not acknowledge it within
  ``cancel_ack_timeout`` loses the stream (``StreamLost``: it is acknowledged to the ring here, and
  what the worker sends about it later is dropped);
- liveness: a worker silent for ``worker_timeout`` seconds is declared dead.

Session states (``SESSION_TRANSITIONS``)::

    AWAITING_ATTACH ─Attach, this version─▶ ATTACHED ─Detach, silence, close()─▶ CLOSED
           │                                                                    ▲
           └─ any other message, another version, silence, close() ─────────────┘

Every method either raises ``ProtocolError`` and changes nothing, or applies the event and
returns the effects, in order. Once CLOSED, nothing has an effect.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import attrs

from ._errors import ProtocolError
from ._messages import (
    PROTOCOL_VERSION,
    Assign,
    Attach,
    Cancel,
    Claim,
    Credit,
    Detach,
    Heartbeat,
    Message,
    Release,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    ResponseMessage,
    Withdraw,
    Withdrawn,
)

__all__ = [
    "SESSION_TRANSITIONS",
    "WORKER_HEADER",
    "SessionClosed",
    "SessionCore",
    "SessionEffect",
    "SessionState",
    "StreamLost",
    "ToRing",
    "ToWire",
]

WORKER_HEADER: Final = "x-llmtrio-worker"
"""The response header naming the worker that served a request (by its certificate)."""

UNACKNOWLEDGED: Final = "the worker did not acknowledge the cancel"
"""The error a lost stream is acknowledged to the ring with."""


class SessionState(enum.Enum):
    """Where a worker connection is in its life; see the drawing at the top of this module."""

    AWAITING_ATTACH = "awaiting attach"
    ATTACHED = "attached"
    CLOSED = "closed"


_S = SessionState
SESSION_TRANSITIONS: Final[Mapping[SessionState, Mapping[type[Message], SessionState]]] = {
    _S.AWAITING_ATTACH: {Attach: _S.ATTACHED},
    _S.ATTACHED: {
        Heartbeat: _S.ATTACHED,
        Claim: _S.ATTACHED,
        Withdraw: _S.ATTACHED,
        Release: _S.ATTACHED,
        ResponseHead: _S.ATTACHED,
        ResponseData: _S.ATTACHED,
        ResponseEnd: _S.ATTACHED,
        ResponseError: _S.ATTACHED,
        Detach: _S.CLOSED,
    },
}
"""What the worker's messages do to its session: state -> message type -> new state. Awaiting
its ``Attach``, any other message (or another protocol version) refuses the worker; once
attached, a message missing here is a ``ProtocolError``."""


@attrs.frozen
class ToWire:
    """Effect: send ``message`` to the worker."""

    message: Assign | Withdrawn | Credit | Cancel | Detach


@attrs.frozen
class ToRing:
    """Effect: hand ``message`` to the ring, as it is (the first is the ``Attach``, under the
    name the ingress gave the worker)."""

    message: Attach | Heartbeat | Claim | Withdraw | Release | ResponseMessage


@attrs.frozen
class StreamLost:
    """Effect: the worker did not acknowledge the ``Cancel`` of ``stream_id`` in time; the
    stream was acknowledged to the ring here (for the log)."""

    stream_id: int


@attrs.frozen
class SessionClosed:
    """Effect, always the last: the session is over; close the connection (leaving the ring's
    ``attach`` block then detaches the worker). ``fault``: the worker misbehaved or fell
    silent (worth a warning), rather than leaving or being let go."""

    reason: str
    fault: bool = False


SessionEffect: TypeAlias = ToWire | ToRing | StreamLost | SessionClosed


@attrs.define
class _Held:
    """A stream the worker holds, as this connection sees it."""

    credits: int
    """Chunks it may still send before a ``Credit`` (its one last chunk aside)."""
    overdrawn: bool = False
    """It sent its one chunk past its credits: only its end may follow."""
    cancel_by: float | None = None
    """Sent ``Cancel``: when the worker's acknowledgement is due."""


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, not {value}")


@attrs.define
class SessionCore:
    """One worker connection at the ingress: its handshake, claims, credits, cancels and
    liveness. ``worker_id`` is the name the ingress gives the worker; ``opened`` is when the
    connection opened (the ``Attach`` is due ``worker_timeout`` seconds later), on the
    clock the caller passes to every method."""

    worker_id: str
    opened: float = attrs.field(kw_only=True)
    credits: int = attrs.field(default=16, kw_only=True, validator=_positive)
    worker_timeout: float = attrs.field(default=10.0, kw_only=True, validator=_positive)
    cancel_ack_timeout: float = attrs.field(default=5.0, kw_only=True, validator=_positive)
    _state: SessionState = attrs.field(init=False, default=SessionState.AWAITING_ATTACH)
    _max_inflight: int = attrs.field(init=False, default=0)
    _claims: int = attrs.field(init=False, default=0)
    _held: dict[int, _Held] = attrs.field(init=False, factory=dict)
    _lost: set[int] = attrs.field(init=False, factory=set)
    _heard: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._heard = self.opened

    # -- queries -------------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def claims(self) -> int:
        """Claims the worker made that no ``Assign`` filled and no ``Withdraw`` took back."""
        return self._claims

    @property
    def held(self) -> tuple[int, ...]:
        """The streams the worker holds: assigned, and neither finished nor lost."""
        return tuple(self._held)

    def credits_left(self, stream_id: int) -> int | None:
        """Chunks the worker may still send on ``stream_id`` before a ``Credit``."""
        held = self._held.get(stream_id)
        return None if held is None else held.credits

    @property
    def deadline(self) -> float:
        """When ``expire`` is next due: the ``Attach``, the worker's silence, or the first
        unacknowledged ``Cancel``; ``math.inf`` once closed."""
        if self._state is SessionState.CLOSED:
            return math.inf
        due = [held.cancel_by for held in self._held.values() if held.cancel_by is not None]
        return min([self._heard + self.worker_timeout, *due])

    # -- events --------------------------------------------------------------------------------

    def receive(self, message: Message, now: float) -> list[SessionEffect]:
        """A message from the worker (what the transport decoded), at time ``now``.

        Error handling: ``ProtocolError`` (nothing changed) for a message the worker may not
        send now: a second ``Attach``, a ring's message, a ``Claim`` beyond its
        ``max_inflight``, a message on a stream it does not hold, a chunk beyond its credits.
        Awaiting the ``Attach``, anything else refuses the worker instead (``SessionClosed``).
        """
        if self._state is SessionState.CLOSED:
            return []
        if self._state is SessionState.AWAITING_ATTACH:
            return self._attach(message, now)
        if type(message) not in SESSION_TRANSITIONS[SessionState.ATTACHED]:
            raise ProtocolError(f"a worker may not send {type(message).__name__}", message)
        effects = self._receive(message)
        self._heard = now
        return effects

    def from_ring(
        self, message: Assign | Cancel | Credit | Withdrawn, now: float
    ) -> list[SessionEffect]:
        """A message from the ring for the worker, at time ``now``: a stream assigned for one
        of its claims, the answer to its ``Withdraw``, a chunk its client's buffer took, a
        client gone."""
        if self._state is not SessionState.ATTACHED:
            return []  # the claims were withdrawn when it closed: nothing more is assigned
        match message:
            case Assign(stream_id=stream_id):
                assert self._claims > 0, "the ring assigns streams only to claims"
                self._claims -= 1
                self._held[stream_id] = _Held(self.credits)
                return [ToWire(attrs.evolve(message, credits=self.credits))]
            case Withdrawn(count=count):
                self._claims -= count
                return [ToWire(message)]
            case Credit(stream_id=stream_id, count=count):
                held = self._held.get(stream_id)
                if held is None or held.cancel_by is not None:
                    return []
                held.credits += count
                return [ToWire(message)]
            case Cancel(stream_id=stream_id):
                held = self._held.get(stream_id)
                if held is None or held.cancel_by is not None:
                    return []
                held.cancel_by = now + self.cancel_ack_timeout
                return [ToWire(message)]

    def expire(self, now: float) -> list[SessionEffect]:
        """Time passed: what is due by ``now`` (see ``deadline``) happens."""
        if self._state is SessionState.CLOSED:
            return []
        if self._state is SessionState.AWAITING_ATTACH:
            if now < self._heard + self.worker_timeout:
                return []
            return self._close(f"sent no Attach within {self.worker_timeout:g}s", fault=True)
        effects: list[SessionEffect] = []
        for stream_id, held in list(self._held.items()):
            if held.cancel_by is not None and held.cancel_by <= now:
                del self._held[stream_id]
                self._lost.add(stream_id)
                effects += [ToRing(ResponseError(stream_id, UNACKNOWLEDGED)), StreamLost(stream_id)]
        if now >= self._heard + self.worker_timeout:
            reason = f"silent for {self.worker_timeout:g}s: declared dead"
            effects += self._close(reason, fault=True)
        return effects

    def close(self, reason: str) -> list[SessionEffect]:
        """End the session from this side (the ingress shuts down, or the shell found the
        worker in breach of the protocol): the worker is told why. Nothing once closed."""
        if self._state is SessionState.CLOSED:
            return []
        return self._close(reason, tell=True)

    # -- internals -----------------------------------------------------------------------------

    def _attach(self, message: Message, now: float) -> list[SessionEffect]:
        if not isinstance(message, Attach):
            reason = f"the first message must be Attach, not {message!r}"
            return self._close(reason, tell=True, fault=True)
        if message.version != PROTOCOL_VERSION:
            reason = (
                f"incompatible protocol version {message.version}: this ingress speaks "
                f"version {PROTOCOL_VERSION}"
            )
            return self._close(reason, tell=True, fault=True)
        self._state = SessionState.ATTACHED
        self._max_inflight = message.max_inflight
        self._heard = now
        return [ToRing(attrs.evolve(message, worker_id=self.worker_id))]

    def _receive(self, message: Message) -> list[SessionEffect]:
        match message:
            case Heartbeat():
                return [ToRing(message)]
            case Claim(count=count):
                if len(self._held) + self._claims + count > self._max_inflight:
                    raise ProtocolError(
                        f"the worker claims {count} more slots, holding {len(self._held)} and "
                        f"waiting for {self._claims}, beyond its max_inflight of "
                        f"{self._max_inflight}",
                        message,
                    )
                self._claims += count
                return [ToRing(message)]
            case Withdraw():
                return [ToRing(message)]  # the ring answers with Withdrawn (from_ring)
            case Detach(reason=reason):
                return self._close(f"the worker left: {reason}" if reason else "the worker left")
            case Release() | ResponseHead() | ResponseData() | ResponseEnd() | ResponseError():
                return self._on_stream(message)
        raise AssertionError(f"unhandled {message!r}")  # pragma: no cover

    def _on_stream(self, message: Release | ResponseMessage) -> list[SessionEffect]:
        stream_id = message.stream_id
        held = self._held.get(stream_id)
        if held is None:
            if stream_id in self._lost:  # a late answer on a stream given up on
                if isinstance(message, Release | ResponseEnd | ResponseError):
                    self._lost.discard(stream_id)
                return []
            raise ProtocolError(f"the worker does not hold stream {stream_id}", message)
        match message:
            case ResponseData():
                if held.overdrawn:
                    raise ProtocolError(
                        f"the worker sent beyond its credits on stream {stream_id}", message
                    )
                if held.credits:
                    held.credits -= 1
                else:
                    held.overdrawn = True  # its one last chunk: the end must follow
            case ResponseHead(headers=headers):
                if held.overdrawn:
                    raise ProtocolError(
                        f"the worker sent a head after its last chunk on stream {stream_id}",
                        message,
                    )
                # Which worker served it, by its certificate: for logs and debugging.
                message = attrs.evolve(message, headers=(*headers, (WORKER_HEADER, self.worker_id)))
            case Release() | ResponseEnd() | ResponseError():
                del self._held[stream_id]
        return [ToRing(message)]

    def _close(
        self, reason: str, *, tell: bool = False, fault: bool = False
    ) -> list[SessionEffect]:
        """Closing withdraws the worker's claims, so that nothing more is assigned to a
        connection on its way out; the streams it holds go when the ring detaches it."""
        effects: list[SessionEffect] = []
        if self._claims and self._state is SessionState.ATTACHED:
            effects.append(ToRing(Withdraw(self._claims)))
        self._state = SessionState.CLOSED
        if tell:
            effects.append(ToWire(Detach(reason)))
        effects.append(SessionClosed(reason, fault))
        return effects
