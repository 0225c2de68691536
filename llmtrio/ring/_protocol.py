"""The ring's wire protocol and lane state machine, with no I/O at all (sans-IO, like h11).

Three parts, each usable on its own:

- **Messages**: frozen values that travel between a worker and the ring. A worker sends
  ``Attach``, ``Heartbeat``, ``Claim``, ``ResponseHead``, ``ResponseData``, ``ResponseEnd``,
  ``ResponseError`` and ``Detach``; the ring sends ``Assign``, ``Cancel`` (and may send
  ``Detach``).
- **Framing**: ``encode(message) -> bytes`` and the incremental ``FrameDecoder``.
- **RingCore**: the state of every stream and worker. Each event method checks the event
  against the current state (raising ``ProtocolError`` and changing nothing when it is
  illegal), updates the state, and returns the *effects*: messages the caller must deliver,
  ``ToWorker`` (an ``Assign`` or ``Cancel`` for one worker) or ``ToClient`` (a response
  message for one stream's client). The in-process ring and any network transport are
  routers of these effects; the core is the single source of truth.

Frame format (all integers big-endian)::

    +-----------+---------+--------------+---------------------+--------------------+
    | length u32| type u8 | json_len u32 | JSON header (UTF-8) | payload (raw bytes)|
    +-----------+---------+--------------+---------------------+--------------------+
                 \\____________________ length bytes ___________________________/

``length`` counts everything after itself and is at most ``max_frame_size``. The JSON header
is an object holding the message's fields (unknown keys are ignored, so fields can be added
later). Only ``Assign`` (the request body) and ``ResponseData`` (the chunk) carry a payload;
for every other type it must be empty.

Stream states::

    park ─▶ PARKED ─Claim─▶ ASSIGNED ─ResponseHead─▶ RESPONDING ─ResponseEnd─▶ ENDED
              ▲               │  │                    │  ↺ ResponseData
              └───────────────┘  │ ResponseError, or  │ ResponseError,
              worker detach or   │ worker detach once │ worker detach
              release: requeued  │ assigned           │
              at the front       │ max_assignments    │
                                 │ times              ▼
                                 └──────────────────▶ FAILED

    cancel: PARKED ─▶ forgotten at once
            ASSIGNED or RESPONDING ─▶ CANCELLED, and the worker is sent Cancel; the stream
            stays in the worker's held set until it acknowledges with ResponseEnd or
            ResponseError (or detaches); anything else it sends meanwhile is dropped

ENDED, FAILED and parked-then-cancelled streams are forgotten at once; a CANCELLED stream
no longer counts against ``max_streams`` but stays in its worker's held set until the
worker acknowledges.
"""

from __future__ import annotations

import bisect
import enum
import json
import struct
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

import attrs

from ._errors import ProtocolError, RingFullError

__all__ = [
    "MAX_FRAME_SIZE",
    "Assign",
    "Attach",
    "Cancel",
    "Claim",
    "Detach",
    "Effect",
    "FrameDecoder",
    "Headers",
    "Heartbeat",
    "Message",
    "RequestHead",
    "ResponseData",
    "ResponseEnd",
    "ResponseError",
    "ResponseHead",
    "ResponseMessage",
    "RingCore",
    "RingStats",
    "StreamState",
    "ToClient",
    "ToWorker",
    "WorkerStats",
    "encode",
]

# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------

Headers: TypeAlias = tuple[tuple[str, str], ...]


def _to_headers(value: Iterable[tuple[str, str]] | Mapping[str, str]) -> Headers:
    """Normalise headers to a tuple of ``(name, value)`` string pairs, order kept."""
    items: Iterable[Any] = value.items() if isinstance(value, Mapping) else value
    headers: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, str | bytes) or len(item) != 2:
            raise TypeError(f"a header must be a (name, value) pair, not {item!r}")
        name, text = item
        if not isinstance(name, str) or not isinstance(text, str):
            raise TypeError(f"header names and values must be str, not {item!r}")
        headers.append((name, text))
    return tuple(headers)


def _to_bytes(value: bytes | bytearray | memoryview) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, not {type(value).__name__}")
    return bytes(value)


def _int_at_least(minimum: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{attribute.name} must be an int, not {value!r}")
        if value < minimum:
            raise ValueError(f"{attribute.name} must be at least {minimum}, not {value}")

    return check


def _str(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be a str, not {value!r}")


def _nonempty_str(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    _str(instance, attribute, value)
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")


def _status(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    _int_at_least(100)(instance, attribute, value)
    if value > 599:
        raise ValueError(f"status must be between 100 and 599, not {value}")


def _bytes_repr(value: bytes) -> str:
    return f"<{len(value)} bytes>"


_stream_id: Final = _int_at_least(1)


@attrs.frozen
class RequestHead:
    """The head of an uploaded request: what the client asked for, without the body."""

    method: str = attrs.field(validator=_nonempty_str)
    path: str = attrs.field(validator=_str)
    headers: Headers = attrs.field(default=(), converter=_to_headers)


@attrs.frozen
class Attach:
    """Worker → ring, first message: who the worker is and how many streams it may hold."""

    worker_id: str = attrs.field(validator=_nonempty_str)
    max_inflight: int = attrs.field(validator=_int_at_least(1))


@attrs.frozen
class Heartbeat:
    """Worker → ring: the engine's capacity now (stored for stats; assignment uses claims)."""

    inflight: int = attrs.field(validator=_int_at_least(0))
    max_inflight: int = attrs.field(validator=_int_at_least(0))
    available_slots: int = attrs.field(validator=_int_at_least(0))
    decoding: int = attrs.field(default=0, validator=_int_at_least(0))
    """Sequences in the engine's current batch (for health pages; optional on the wire)."""


@attrs.frozen
class Claim:
    """Worker → ring: "I have ``count`` more free slots; assign me up to that many streams"."""

    count: int = attrs.field(default=1, validator=_int_at_least(1))


@attrs.frozen
class Assign:
    """Ring → worker: a request lane (its head and body) the worker now holds."""

    stream_id: int = attrs.field(validator=_stream_id)
    head: RequestHead = attrs.field(validator=attrs.validators.instance_of(RequestHead))
    body: bytes = attrs.field(default=b"", converter=_to_bytes, repr=_bytes_repr)


@attrs.frozen
class ResponseHead:
    """Worker → ring → client: the response's status and headers; comes before any data."""

    stream_id: int = attrs.field(validator=_stream_id)
    status: int = attrs.field(validator=_status)
    headers: Headers = attrs.field(default=(), converter=_to_headers)


@attrs.frozen
class ResponseData:
    """Worker → ring → client: a chunk of the response body."""

    stream_id: int = attrs.field(validator=_stream_id)
    data: bytes = attrs.field(converter=_to_bytes)


@attrs.frozen
class ResponseEnd:
    """Worker → ring → client: the response is complete. Also acknowledges a ``Cancel``."""

    stream_id: int = attrs.field(validator=_stream_id)


@attrs.frozen
class ResponseError:
    """Worker → ring → client: the worker could not finish; also acknowledges a ``Cancel``."""

    stream_id: int = attrs.field(validator=_stream_id)
    message: str = attrs.field(validator=_str)


@attrs.frozen
class Cancel:
    """Ring → worker: the client went away; stop, then acknowledge with End or Error."""

    stream_id: int = attrs.field(validator=_stream_id)


@attrs.frozen
class Detach:
    """Either way, last message: the worker leaves (or is sent away) for ``reason``."""

    reason: str = attrs.field(default="", validator=_str)


Message: TypeAlias = (
    Attach
    | Heartbeat
    | Claim
    | Assign
    | ResponseHead
    | ResponseData
    | ResponseEnd
    | ResponseError
    | Cancel
    | Detach
)
ResponseMessage: TypeAlias = ResponseHead | ResponseData | ResponseEnd | ResponseError

# ---------------------------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------------------------

MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
"""Default bound on a frame's ``length`` field (the bytes after the 4-byte prefix)."""

_PREFIX: Final = struct.Struct(">I")
_FRAME_HEAD: Final = struct.Struct(">IBI")  # length, type, json_len
_MIN_LENGTH: Final = 1 + 4  # type + json_len

_CODES: Final[dict[type[Message], int]] = {
    Attach: 1,
    Heartbeat: 2,
    Claim: 3,
    Assign: 4,
    ResponseHead: 5,
    ResponseData: 6,
    ResponseEnd: 7,
    ResponseError: 8,
    Cancel: 9,
    Detach: 10,
}
_TYPES: Final[dict[int, type[Message]]] = {code: cls for cls, code in _CODES.items()}


def _split(message: Message) -> tuple[dict[str, Any], bytes]:
    """The JSON header fields and the raw payload of ``message``."""
    match message:
        case Attach(worker_id=worker_id, max_inflight=max_inflight):
            return {"worker_id": worker_id, "max_inflight": max_inflight}, b""
        case Heartbeat(
            inflight=inflight,
            max_inflight=max_inflight,
            available_slots=available,
            decoding=decoding,
        ):
            return {
                "inflight": inflight,
                "max_inflight": max_inflight,
                "available_slots": available,
                "decoding": decoding,
            }, b""
        case Claim(count=count):
            return {"count": count}, b""
        case Assign(stream_id=stream_id, head=head, body=body):
            return {
                "stream_id": stream_id,
                "method": head.method,
                "path": head.path,
                "headers": [list(pair) for pair in head.headers],
            }, body
        case ResponseHead(stream_id=stream_id, status=status, headers=headers):
            return {
                "stream_id": stream_id,
                "status": status,
                "headers": [list(pair) for pair in headers],
            }, b""
        case ResponseData(stream_id=stream_id, data=data):
            return {"stream_id": stream_id}, data
        case ResponseEnd(stream_id=stream_id) | Cancel(stream_id=stream_id):
            return {"stream_id": stream_id}, b""
        case ResponseError(stream_id=stream_id, message=text):
            return {"stream_id": stream_id, "message": text}, b""
        case Detach(reason=reason):
            return {"reason": reason}, b""


def encode(message: Message, *, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
    """Encode ``message`` as one frame.

    Error handling: raises ``ProtocolError`` (carrying ``message``) when the frame would be
    longer than ``max_frame_size``; split large bodies into several ``ResponseData``.
    """
    fields, payload = _split(message)
    header = json.dumps(fields, separators=(",", ":")).encode("ascii")
    length = _MIN_LENGTH + len(header) + len(payload)
    if length > max_frame_size:
        raise ProtocolError(
            f"a {type(message).__name__} frame of {length} bytes exceeds the "
            f"{max_frame_size}-byte limit",
            message,
        )
    return b"".join((_FRAME_HEAD.pack(length, _CODES[type(message)], len(header)), header, payload))


@attrs.define
class _Fields:
    """Typed access to a decoded JSON header; a missing or mistyped field is a ProtocolError."""

    _fields: dict[str, Any]
    _frame: bytes

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def _get(self, key: str) -> Any:
        try:
            return self._fields[key]
        except KeyError:
            raise ProtocolError(f"the frame's header lacks {key!r}", self._frame) from None

    def integer(self, key: str) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError(f"{key!r} must be an integer, not {value!r}", self._frame)
        return value

    def string(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str):
            raise ProtocolError(f"{key!r} must be a string, not {value!r}", self._frame)
        return value

    def headers(self, key: str) -> Headers:
        value = self._get(key)
        if not isinstance(value, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)
            for pair in value
        ):
            raise ProtocolError(f"{key!r} must be a list of [name, value] strings", self._frame)
        return tuple((name, text) for name, text in value)


def _build(cls: type[Message], fields: _Fields, payload: bytes) -> Message:
    if cls is Attach:
        return Attach(fields.string("worker_id"), fields.integer("max_inflight"))
    if cls is Heartbeat:
        inflight, available = fields.integer("inflight"), fields.integer("available_slots")
        decoding = fields.integer("decoding") if "decoding" in fields else 0
        return Heartbeat(inflight, fields.integer("max_inflight"), available, decoding)
    if cls is Claim:
        return Claim(fields.integer("count"))
    if cls is Assign:
        head = RequestHead(
            fields.string("method"), fields.string("path"), fields.headers("headers")
        )
        return Assign(fields.integer("stream_id"), head, payload)
    if cls is ResponseHead:
        status, headers = fields.integer("status"), fields.headers("headers")
        return ResponseHead(fields.integer("stream_id"), status, headers)
    if cls is ResponseData:
        return ResponseData(fields.integer("stream_id"), payload)
    if cls is ResponseEnd:
        return ResponseEnd(fields.integer("stream_id"))
    if cls is ResponseError:
        return ResponseError(fields.integer("stream_id"), fields.string("message"))
    if cls is Cancel:
        return Cancel(fields.integer("stream_id"))
    assert cls is Detach
    return Detach(fields.string("reason"))


def _decode_frame(frame: bytes) -> Message:
    """Decode one frame's body (everything after the length prefix)."""
    code = frame[0]
    (header_length,) = _PREFIX.unpack_from(frame, 1)
    if _MIN_LENGTH + header_length > len(frame):
        raise ProtocolError(
            f"the JSON header claims {header_length} bytes but the frame holds "
            f"{len(frame) - _MIN_LENGTH}",
            frame,
        )
    cls = _TYPES.get(code)
    if cls is None:
        raise ProtocolError(f"unknown message type {code}", frame)
    try:
        fields = json.loads(frame[_MIN_LENGTH : _MIN_LENGTH + header_length].decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ProtocolError(f"the frame's header is not JSON: {exc}", frame) from exc
    if not isinstance(fields, dict):
        raise ProtocolError("the frame's header is not a JSON object", frame)
    payload = frame[_MIN_LENGTH + header_length :]
    if payload and cls not in (Assign, ResponseData):
        raise ProtocolError(f"a {cls.__name__} frame carries no payload", frame)
    try:
        return _build(cls, _Fields(fields, frame), payload)
    except (TypeError, ValueError) as exc:  # a field out of range, caught by the message class
        raise ProtocolError(f"invalid {cls.__name__}: {exc}", frame) from exc


@attrs.define
class FrameDecoder:
    """Turns a byte stream into messages, whatever way the bytes were split.

    ``receive_data(b"")`` marks the end of the stream (as in h11); after that,
    ``next_message()`` returns the frames still buffered, then ``None``, or raises
    ``ProtocolError`` if the stream ended inside a frame.

    Error handling: a frame longer than ``max_frame_size`` raises ``ProtocolError`` as soon as
    its length prefix is in, before its bytes are buffered. After any ``ProtocolError`` the
    decoder is broken: every later ``next_message()`` raises again, since where the next frame
    starts is no longer known.
    """

    max_frame_size: int = MAX_FRAME_SIZE
    _buffer: bytearray = attrs.field(init=False, factory=bytearray)
    _start: int = attrs.field(init=False, default=0)  # where the next frame starts in _buffer
    _eof: bool = attrs.field(init=False, default=False)
    _error: ProtocolError | None = attrs.field(init=False, default=None)

    def receive_data(self, data: bytes) -> None:
        """Add bytes read from the transport; ``b""`` means the transport was closed."""
        if self._eof and data:
            raise ProtocolError("data received after the end of the stream")
        if data:
            del self._buffer[: self._start]  # drop decoded frames once per read, not per frame
            self._start = 0
            self._buffer += data
        else:
            self._eof = True

    def next_message(self) -> Message | None:
        """The next complete message, or ``None`` if more bytes are needed."""
        if self._error is not None:
            raise ProtocolError(
                f"the frame stream is broken by an earlier error: {self._error}",
                self._error.offending,
            )
        try:
            return self._next()
        except ProtocolError as exc:
            self._error = exc
            raise

    def _next(self) -> Message | None:
        buffer, start = self._buffer, self._start
        available = len(buffer) - start
        if available < _PREFIX.size:
            if self._eof and available:
                raise ProtocolError(
                    "the stream ended inside a frame's length", bytes(buffer[start:])
                )
            return None
        (length,) = _PREFIX.unpack_from(buffer, start)
        if length > self.max_frame_size:
            raise ProtocolError(
                f"a frame of {length} bytes exceeds the {self.max_frame_size}-byte limit",
                bytes(buffer[start : start + _PREFIX.size]),
            )
        if length < _MIN_LENGTH:
            raise ProtocolError(f"a frame of {length} bytes is too short", bytes(buffer[start:]))
        if available < _PREFIX.size + length:
            if self._eof:
                raise ProtocolError(
                    f"the stream ended {_PREFIX.size + length - available} bytes short of a "
                    f"frame's end",
                    bytes(buffer[start:]),
                )
            return None
        frame = bytes(buffer[start + _PREFIX.size : start + _PREFIX.size + length])
        self._start = start + _PREFIX.size + length
        return _decode_frame(frame)


# ---------------------------------------------------------------------------------------------
# The lane state machine
# ---------------------------------------------------------------------------------------------


class StreamState(enum.Enum):
    """Where a stream is in its life; see the drawing at the top of this module."""

    PARKED = "parked"
    ASSIGNED = "assigned"
    RESPONDING = "responding"
    ENDED = "ended"
    FAILED = "failed"
    CANCELLED = "cancelled"


@attrs.frozen
class ToWorker:
    """Effect: deliver ``message`` (an ``Assign`` or a ``Cancel``) to worker ``worker_id``."""

    worker_id: str
    message: Assign | Cancel


@attrs.frozen
class ToClient:
    """Effect: deliver ``message`` to the client waiting on stream ``stream_id``.

    A ``ResponseEnd`` or ``ResponseError`` is the stream's last effect: the core has already
    forgotten it.
    """

    stream_id: int
    message: ResponseMessage


Effect: TypeAlias = ToWorker | ToClient


@attrs.frozen
class WorkerStats:
    """One attached worker: its declared bound, what it waits for, what it holds."""

    worker_id: str
    max_inflight: int
    waiting_claims: int
    """Slots it has claimed that no stream has filled yet."""
    held: tuple[int, ...]
    """Stream ids it holds: assigned, responding, or cancelled and not yet acknowledged."""
    capacity: Heartbeat | None
    """Its last heartbeat, if any."""


@attrs.frozen
class RingStats:
    """A snapshot of the ring: stream counts by state and every attached worker."""

    max_streams: int
    parked: int
    assigned: int
    responding: int
    cancelling: int
    """Cancelled streams their worker has not acknowledged yet (not counted as open)."""
    workers: tuple[WorkerStats, ...]

    @property
    def serving(self) -> int:
        """Streams a worker holds and their client still waits for."""
        return self.assigned + self.responding

    @property
    def open(self) -> int:
        """Streams counted against ``max_streams``."""
        return self.parked + self.serving

    @property
    def tracked(self) -> int:
        """Every stream the core remembers; zero once all streams are finished."""
        return self.open + self.cancelling


@attrs.define
class _Stream:
    stream_id: int
    head: RequestHead
    body: bytes
    state: StreamState = StreamState.PARKED
    worker_id: str | None = None
    assignments: int = 0


@attrs.define
class _Worker:
    worker_id: str
    max_inflight: int
    credits: int = 0
    held: dict[int, None] = attrs.field(factory=dict)  # an ordered set of stream ids
    capacity: Heartbeat | None = None


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, not {value}")


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must not be negative, not {value}")


@attrs.define
class RingCore:
    """Every stream and worker of one ring, and the rules that move them.

    ``max_streams`` bounds the open streams (parked, assigned or responding). Parked streams
    are assigned in arrival order to workers that have claimed free slots; workers waiting
    for streams are served round-robin, one stream each in turn. When a worker detaches, a
    stream it held that had no response head yet is *requeued* at the front of the queue,
    unless it has already been assigned ``max_assignments`` times (a request that kills
    every worker it reaches must not kill them all): then it fails, as do the streams that
    were already responding. ``max_assignments=1`` turns requeueing off.

    Every method either raises (``RingFullError``, ``ProtocolError``) and changes nothing, or
    applies the event and returns the effects the caller must deliver, in order.
    """

    max_streams: int = attrs.field(validator=_positive)
    retry_after: float = attrs.field(default=1.0, validator=_non_negative)
    max_assignments: int = attrs.field(default=3, kw_only=True, validator=_positive)
    _streams: dict[int, _Stream] = attrs.field(init=False, factory=dict)
    _counts: Counter[StreamState] = attrs.field(init=False, factory=Counter)
    _fresh: dict[int, None] = attrs.field(init=False, factory=dict)  # parked, in arrival order
    _requeued: list[int] = attrs.field(init=False, factory=list)  # parked again, sorted, first
    _workers: dict[str, _Worker] = attrs.field(init=False, factory=dict)
    _claimants: dict[str, None] = attrs.field(init=False, factory=dict)  # round-robin order
    _next_id: int = attrs.field(init=False, default=1)

    # -- queries -------------------------------------------------------------------------------

    @property
    def open_streams(self) -> int:
        """Streams counted against ``max_streams``: parked, assigned or responding."""
        counts = self._counts
        return (
            counts[StreamState.PARKED]
            + counts[StreamState.ASSIGNED]
            + counts[StreamState.RESPONDING]
        )

    def state(self, stream_id: int) -> StreamState | None:
        """The state of a stream the core tracks; ``None`` once it is finished and forgotten."""
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.state

    def holder(self, stream_id: int) -> str | None:
        """The worker holding ``stream_id``, if any."""
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.worker_id

    def stats(self) -> RingStats:
        """A snapshot of stream counts and workers."""
        return RingStats(
            max_streams=self.max_streams,
            parked=self._counts[StreamState.PARKED],
            assigned=self._counts[StreamState.ASSIGNED],
            responding=self._counts[StreamState.RESPONDING],
            cancelling=self._counts[StreamState.CANCELLED],
            workers=tuple(
                WorkerStats(
                    worker_id=worker.worker_id,
                    max_inflight=worker.max_inflight,
                    waiting_claims=worker.credits,
                    held=tuple(worker.held),
                    capacity=worker.capacity,
                )
                for worker in self._workers.values()
            ),
        )

    # -- the client side -----------------------------------------------------------------------

    def park(self, head: RequestHead, body: bytes = b"") -> tuple[int, list[Effect]]:
        """Park a new request; returns its stream id and the effects (maybe its ``Assign``).

        Error handling: raises ``RingFullError`` when ``max_streams`` streams are open.
        """
        if self.open_streams >= self.max_streams:
            raise RingFullError(self.retry_after, self.max_streams)
        stream = _Stream(self._next_id, head, _to_bytes(body))
        self._next_id += 1
        self._streams[stream.stream_id] = stream
        self._counts[StreamState.PARKED] += 1
        self._fresh[stream.stream_id] = None
        return stream.stream_id, self._dispatch()

    def cancel(self, stream_id: int) -> list[Effect]:
        """The client went away. Idempotent; a finished or unknown stream is ignored.

        A parked stream is forgotten. An assigned or responding one becomes CANCELLED and the
        effects hold a ``Cancel`` for its worker: the one case the worker must be told.
        """
        stream = self._streams.get(stream_id)
        if stream is None or stream.state is StreamState.CANCELLED:
            return []
        if stream.state is StreamState.PARKED:
            self._unqueue(stream_id)
            self._forget(stream)
            return []
        assert stream.worker_id is not None
        self._set_state(stream, StreamState.CANCELLED)
        stream.body = b""  # nobody will read it again
        return [ToWorker(stream.worker_id, Cancel(stream_id))]

    # -- the worker side -----------------------------------------------------------------------

    def attach(self, message: Attach) -> None:
        """A worker arrives. Error handling: ``ProtocolError`` if its id is already attached."""
        if message.worker_id in self._workers:
            raise ProtocolError(f"worker {message.worker_id!r} is already attached", message)
        self._workers[message.worker_id] = _Worker(message.worker_id, message.max_inflight)

    def receive(self, worker_id: str, message: Message) -> list[Effect]:
        """Apply any message from attached worker ``worker_id`` (what a transport decodes).

        Error handling: ``ProtocolError`` for a message a worker may not send here
        (``Attach`` again, ``Assign``, ``Cancel``) or one illegal in the current state.
        """
        match message:
            case Heartbeat():
                self.heartbeat(worker_id, message)
                return []
            case Claim():
                return self.claim(worker_id, message)
            case ResponseHead() | ResponseData() | ResponseEnd() | ResponseError():
                return self.respond(worker_id, message)
            case Detach(reason=reason):
                return self.detach(worker_id, reason)
            case _:
                raise ProtocolError(
                    f"a worker may not send {type(message).__name__} after attaching", message
                )

    def heartbeat(self, worker_id: str, message: Heartbeat) -> None:
        """Store the worker's reported capacity (shown by ``stats``)."""
        self._worker(worker_id, message).capacity = message

    def claim(self, worker_id: str, message: Claim) -> list[Effect]:
        """The worker has ``message.count`` more free slots; returns the ``Assign`` effects.

        Error handling: ``ProtocolError`` when the worker would then hold or wait for more
        streams than the ``max_inflight`` it attached with.
        """
        worker = self._worker(worker_id, message)
        wanted = worker.credits + len(worker.held) + message.count
        if wanted > worker.max_inflight:
            raise ProtocolError(
                f"worker {worker_id!r} claims {message.count} more streams, holding "
                f"{len(worker.held)} and waiting for {worker.credits}, beyond its "
                f"max_inflight of {worker.max_inflight}",
                message,
            )
        worker.credits += message.count
        self._claimants.setdefault(worker_id, None)
        return self._dispatch()

    def withdraw(self, worker_id: str, count: int = 1) -> int:
        """Take back up to ``count`` unfilled claims; returns how many were still unfilled."""
        worker = self._worker(worker_id, None)
        taken = min(count, worker.credits)
        worker.credits -= taken
        if not worker.credits:
            self._claimants.pop(worker_id, None)
        return taken

    def release(self, worker_id: str, stream_id: int) -> list[Effect]:
        """The worker gives back a stream it was assigned but will not serve.

        An ASSIGNED stream is requeued at the front (this does not count as an assignment);
        a CANCELLED one is acknowledged and forgotten. Error handling: ``ProtocolError`` if the
        worker does not hold it or has already sent its response head.
        """
        stream = self._held(worker_id, stream_id, None)
        if stream.state is StreamState.CANCELLED:
            self._forget(stream)
            return []
        if stream.state is not StreamState.ASSIGNED:
            raise ProtocolError(
                f"stream {stream_id} cannot be released once its response has started"
            )
        stream.assignments -= 1
        self._requeue(stream)
        return self._dispatch()

    def respond(self, worker_id: str, message: ResponseMessage) -> list[Effect]:
        """A response message from the worker holding the stream.

        Returns the ``ToClient`` effect forwarding it, or nothing when the stream was cancelled
        (the message is dropped; ``ResponseEnd``/``ResponseError`` acknowledge the cancel and
        the stream is forgotten). After ``ResponseEnd``/``ResponseError`` the stream is
        forgotten. Error handling: ``ProtocolError`` when another worker holds the stream, the
        stream is unknown, or the message is out of order (data or end before the head, a
        second head).
        """
        stream = self._held(worker_id, message.stream_id, message)
        state = stream.state
        if state is StreamState.CANCELLED:
            if isinstance(message, ResponseEnd | ResponseError):
                self._forget(stream)
            return []
        allowed = (
            isinstance(message, ResponseHead | ResponseError)
            if state is StreamState.ASSIGNED
            else isinstance(message, ResponseData | ResponseEnd | ResponseError)
        )
        if not allowed:
            raise ProtocolError(
                f"{type(message).__name__} is illegal on stream {message.stream_id} in state "
                f"{state.name}",
                message,
            )
        if isinstance(message, ResponseHead):
            self._set_state(stream, StreamState.RESPONDING)
            stream.body = b""  # no requeue once responding
        elif isinstance(message, ResponseEnd | ResponseError):
            self._forget(stream)
        return [ToClient(message.stream_id, message)]

    def detach(self, worker_id: str, reason: str = "") -> list[Effect]:
        """The worker left or died. Returns what must happen to the streams it held.

        Streams without a response head are requeued (and may be assigned to another worker
        in the returned effects) until they have been assigned ``max_assignments`` times;
        the others get a ``ToClient`` ``ResponseError`` (the client sees WorkerFailedError).
        Cancelled streams it had not acknowledged are forgotten.
        """
        worker = self._worker(worker_id, Detach(reason))
        del self._workers[worker_id]
        self._claimants.pop(worker_id, None)
        because = f": {reason}" if reason else ""
        effects: list[Effect] = []
        for stream_id in worker.held:
            stream = self._streams[stream_id]
            stream.worker_id = None
            if stream.state is StreamState.CANCELLED:
                self._forget(stream)
            elif stream.state is StreamState.ASSIGNED and stream.assignments < self.max_assignments:
                self._requeue(stream)
            else:
                if stream.state is StreamState.RESPONDING:
                    text = f"worker {worker_id!r} detached mid-response{because}"
                else:
                    text = (
                        f"worker {worker_id!r} detached before responding{because} "
                        f"(the stream was assigned {stream.assignments} times)"
                    )
                self._forget(stream)
                effects.append(ToClient(stream_id, ResponseError(stream_id, text)))
        worker.held.clear()
        effects += self._dispatch()
        return effects

    # -- internals -----------------------------------------------------------------------------

    def _worker(self, worker_id: str, message: Message | None) -> _Worker:
        worker = self._workers.get(worker_id)
        if worker is None:
            raise ProtocolError(f"worker {worker_id!r} is not attached", message)
        return worker

    def _held(self, worker_id: str, stream_id: int, message: Message | None) -> _Stream:
        self._worker(worker_id, message)
        stream = self._streams.get(stream_id)
        if stream is None or stream.worker_id != worker_id:
            raise ProtocolError(f"worker {worker_id!r} does not hold stream {stream_id}", message)
        return stream

    def _set_state(self, stream: _Stream, state: StreamState) -> None:
        self._counts[stream.state] -= 1
        self._counts[state] += 1
        stream.state = state

    def _forget(self, stream: _Stream) -> None:
        self._counts[stream.state] -= 1
        del self._streams[stream.stream_id]
        if stream.worker_id is not None:
            self._workers[stream.worker_id].held.pop(stream.stream_id, None)

    def _unqueue(self, stream_id: int) -> None:
        if stream_id in self._fresh:
            del self._fresh[stream_id]
        else:
            self._requeued.remove(stream_id)

    def _requeue(self, stream: _Stream) -> None:
        if stream.worker_id is not None:
            self._workers[stream.worker_id].held.pop(stream.stream_id, None)
            stream.worker_id = None
        self._set_state(stream, StreamState.PARKED)
        # Stream ids grow with arrival and assignment is FIFO, so every requeued stream
        # arrived before every fresh one: keeping the requeued sorted keeps the queue FIFO.
        bisect.insort(self._requeued, stream.stream_id)

    def _dispatch(self) -> list[Effect]:
        """Assign parked streams, oldest first, to claimants in round-robin order."""
        effects: list[Effect] = []
        while self._claimants and (self._requeued or self._fresh):
            worker_id = next(iter(self._claimants))
            worker = self._workers[worker_id]
            if self._requeued:
                stream_id = self._requeued.pop(0)
            else:
                stream_id = next(iter(self._fresh))
                del self._fresh[stream_id]
            stream = self._streams[stream_id]
            self._set_state(stream, StreamState.ASSIGNED)
            stream.worker_id = worker_id
            stream.assignments += 1
            worker.credits -= 1
            worker.held[stream_id] = None
            del self._claimants[worker_id]
            if worker.credits:
                self._claimants[worker_id] = None  # to the back of the line
            effects.append(ToWorker(worker_id, Assign(stream_id, stream.head, stream.body)))
        return effects
