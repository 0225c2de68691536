"""The ring's framing: ``encode(message) -> bytes`` and the incremental ``FrameDecoder``.

Frame format (all integers big-endian)::

    +-----------+---------+--------------+---------------------+--------------------+
    | length u32| type u8 | json_len u32 | JSON header (UTF-8) | payload (raw bytes)|
    +-----------+---------+--------------+---------------------+--------------------+
                 \\____________________ length bytes ___________________________/

``length`` counts everything after itself and is at most ``max_frame_size``. The JSON header
is an object holding the message's fields (unknown keys are ignored, so fields can be added
later). Only ``Assign`` (the request body) and ``ResponseData`` (the chunk) carry a payload;
for every other type it must be empty. A frame of an unknown type is skipped whole (a newer
peer may send messages this one does not know), never fatal. Over the control listener's
WebSocket, each binary WebSocket message holds one or more whole frames.
"""

from __future__ import annotations

import json
import logging
import struct
from typing import Any, Final

import attrs
import trio

from ._errors import ProtocolError
from ._messages import (
    CHAT_MODEL,
    Assign,
    Attach,
    Cancel,
    Claim,
    Credit,
    Detach,
    Headers,
    Heartbeat,
    Message,
    Outcome,
    Release,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    Withdraw,
    Withdrawn,
)

__all__ = ["MAX_FRAME_SIZE", "FrameDecoder", "encode", "encode_available"]

logger = logging.getLogger("llmtrio.ring")

MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
"""Default bound on a frame's ``length`` field (the bytes after the 4-byte prefix)."""

_PREFIX: Final = struct.Struct(">I")
_FRAME_HEAD: Final = struct.Struct(">IBI")  # length, type, json_len
_MIN_LENGTH: Final = 1 + 4  # type + json_len
#: A heartbeat's optional fields, sent only when not 0 (an older peer ignores them).
_OPTIONAL_BEAT_FIELDS: Final = (
    "cache_hits",
    "cached_tokens",
    "cache_bytes",
    "kv_used",
    "kv_total",
    "spec_drafted",
    "spec_accepted",
    "model_bytes",
    "unload_in_s",
    "free_bytes",
)

_OUTCOME_FIELDS: Final = tuple(field.name for field in attrs.fields(Outcome))

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
    Withdraw: 11,
    Withdrawn: 12,
    Release: 13,
    Credit: 14,
}
_TYPES: Final[dict[int, type[Message]]] = {code: cls for cls, code in _CODES.items()}


def _split(message: Message) -> tuple[dict[str, Any], bytes]:
    """The JSON header fields and the raw payload of ``message``."""
    match message:
        case Attach(worker_id=worker_id, max_inflight=max_inflight, models=models, version=v):
            attach: dict[str, Any] = {
                "version": v,
                "worker_id": worker_id,
                "max_inflight": max_inflight,
                "models": list(models),
            }
            if any(
                kind != CHAT_MODEL for kind in message.kinds
            ):  # all chat: as the previous version
                attach["kinds"] = list(message.kinds)
            if message.vision:  # none: as the previous version
                attach["vision"] = list(message.vision)
            if any(message.contexts):  # none stated: as the previous version
                attach["contexts"] = list(message.contexts)
            if message.audio:  # none: as the previous version
                attach["audio"] = list(message.audio)
            return attach, b""
        case Heartbeat(
            inflight=inflight,
            max_inflight=max_inflight,
            available_slots=available,
            decoding=decoding,
        ):
            beat: dict[str, Any] = {
                "inflight": inflight,
                "max_inflight": max_inflight,
                "available_slots": available,
                "decoding": decoding,
            }
            for name in _OPTIONAL_BEAT_FIELDS:
                if value := getattr(message, name):
                    beat[name] = value
            if message.model_state:
                beat["model_state"] = message.model_state
            if message.prefixes:  # none: as the previous version
                beat["prefixes"] = list(message.prefixes)
            return beat, b""
        case Claim(count=count, model=model) | Withdraw(count=count, model=model):
            # No model: byte for byte what a worker of the previous version writes.
            return {"count": count} | ({} if model is None else {"model": model}), b""
        case Withdrawn(count=count):
            return {"count": count}, b""
        case Credit(stream_id=stream_id, count=count):
            return {"stream_id": stream_id, "count": count}, b""
        case Assign(stream_id=stream_id, head=head, body=body, credits=credits):
            return {
                "stream_id": stream_id,
                "method": head.method,
                "path": head.path,
                "headers": [list(pair) for pair in head.headers],
                "credits": credits,
            }, body
        case ResponseHead(stream_id=stream_id, status=status, headers=headers):
            return {
                "stream_id": stream_id,
                "status": status,
                "headers": [list(pair) for pair in headers],
            }, b""
        case ResponseData(stream_id=stream_id, data=data):
            return {"stream_id": stream_id}, data
        case ResponseEnd(stream_id=stream_id, outcome=outcome):
            return {"stream_id": stream_id, **_outcome_field(outcome)}, b""
        case Cancel(stream_id=stream_id) | Release(stream_id=stream_id):
            return {"stream_id": stream_id}, b""
        case ResponseError(stream_id=stream_id, message=text, outcome=outcome):
            return {"stream_id": stream_id, "message": text, **_outcome_field(outcome)}, b""
        case Detach(reason=reason):
            return {"reason": reason}, b""


def _outcome_field(outcome: Outcome | None) -> dict[str, Any]:
    """An end's optional ``outcome`` object, with only its stated keys; nothing without one
    (so an end without an outcome is the same frame an older peer writes)."""
    if outcome is None:
        return {}
    stated = {name: getattr(outcome, name) for name in _OUTCOME_FIELDS}
    return {"outcome": {name: value for name, value in stated.items() if value is not None}}


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

    def strings(self, key: str) -> tuple[str, ...]:
        value = self._get(key)
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ProtocolError(f"{key!r} must be a list of strings", self._frame)
        return tuple(value)

    def integers(self, key: str) -> tuple[int, ...]:
        value = self._get(key)
        if not isinstance(value, list) or not all(
            isinstance(item, int) and not isinstance(item, bool) for item in value
        ):
            raise ProtocolError(f"{key!r} must be a list of integers", self._frame)
        return tuple(value)

    def headers(self, key: str) -> Headers:
        value = self._get(key)
        if not isinstance(value, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)
            for pair in value
        ):
            raise ProtocolError(f"{key!r} must be a list of [name, value] strings", self._frame)
        return tuple((name, text) for name, text in value)

    def outcome(self, key: str) -> Outcome | None:
        """An optional ``Outcome`` object: its known keys (each may be null or absent; the
        values are checked by ``Outcome``), unknown keys ignored."""
        if key not in self._fields:
            return None
        value = self._fields[key]
        if not isinstance(value, dict):
            raise ProtocolError(f"{key!r} must be a JSON object, not {value!r}", self._frame)
        return Outcome(**{name: value[name] for name in _OUTCOME_FIELDS if name in value})


def _model(fields: _Fields) -> str | None:
    """A claim's optional ``model`` (absent, as from a worker of the previous version: None)."""
    return fields.string("model") if "model" in fields else None


def _build(cls: type[Message], fields: _Fields, payload: bytes) -> Message:
    if cls is Attach:
        return Attach(
            fields.string("worker_id"),
            fields.integer("max_inflight"),
            models=fields.strings("models") if "models" in fields else (),
            version=fields.integer("version") if "version" in fields else 0,
            kinds=fields.strings("kinds") if "kinds" in fields else (),
            vision=fields.strings("vision") if "vision" in fields else (),
            contexts=fields.integers("contexts") if "contexts" in fields else (),
            audio=fields.strings("audio") if "audio" in fields else (),
        )
    if cls is Heartbeat:
        inflight, available = fields.integer("inflight"), fields.integer("available_slots")
        decoding = fields.integer("decoding") if "decoding" in fields else 0
        extra: dict[str, Any] = {
            name: fields.integer(name) for name in _OPTIONAL_BEAT_FIELDS if name in fields
        }
        if "model_state" in fields:
            extra["model_state"] = fields.string("model_state")
        if "prefixes" in fields:
            extra["prefixes"] = fields.strings("prefixes")
        return Heartbeat(inflight, fields.integer("max_inflight"), available, decoding, **extra)
    if cls is Claim:
        return Claim(fields.integer("count"), model=_model(fields))
    if cls is Withdraw:
        return Withdraw(fields.integer("count"), model=_model(fields))
    if cls is Withdrawn:
        return Withdrawn(fields.integer("count"))
    if cls is Release:
        return Release(fields.integer("stream_id"))
    if cls is Credit:
        return Credit(fields.integer("stream_id"), fields.integer("count"))
    if cls is Assign:
        head = RequestHead(
            fields.string("method"), fields.string("path"), fields.headers("headers")
        )
        credits = fields.integer("credits") if "credits" in fields else 0
        return Assign(fields.integer("stream_id"), head, payload, credits=credits)
    if cls is ResponseHead:
        status, headers = fields.integer("status"), fields.headers("headers")
        return ResponseHead(fields.integer("stream_id"), status, headers)
    if cls is ResponseData:
        return ResponseData(fields.integer("stream_id"), payload)
    if cls is ResponseEnd:
        return ResponseEnd(fields.integer("stream_id"), outcome=fields.outcome("outcome"))
    if cls is ResponseError:
        return ResponseError(
            fields.integer("stream_id"),
            fields.string("message"),
            outcome=fields.outcome("outcome"),
        )
    if cls is Cancel:
        return Cancel(fields.integer("stream_id"))
    assert cls is Detach
    return Detach(fields.string("reason"))


def _decode_frame(frame: bytes) -> Message | None:
    """Decode one frame's body (everything after the length prefix); ``None`` for a frame of
    a type this side does not know (skipped)."""
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
        logger.debug("skipping a frame of unknown message type %d", code)
        return None
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

    Frames of unknown message types are skipped. ``receive_data(b"")`` marks the end of the
    stream (as in h11); after that,
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
        message = _decode_frame(frame)
        return self._next() if message is None else message


def encode_available(first: Message, more: trio.MemoryReceiveChannel[Message]) -> bytes:
    """``first`` and every message already waiting in ``more``, encoded back to back (one
    write for what piled up while the last one was being sent)."""
    frames = [encode(first)]
    while True:
        try:
            frames.append(encode(more.receive_nowait()))
        except (trio.WouldBlock, trio.EndOfChannel):
            return b"".join(frames)
