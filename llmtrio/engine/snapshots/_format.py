"""A snapshot file: the state of one sequence after some tokens, with what it may be restored
into. Pure: bytes in, values out (the store does the I/O).

The layout (integers little-endian)::

    +-------------+------------+------------+-------------+-----------------+----------+---------+
    | magic (16)  | version u32| header u32 | header JSON | header xxh3 u64 | tokens   | payload |
    |             |            | (its bytes)|  (UTF-8)    |                 | int32 xN | P bytes |
    +-------------+------------+------------+-------------+-----------------+----------+---------+

The JSON header holds the :class:`SnapshotKey` (the model file's identity, the llama.cpp
build's state format, the context settings the state depends on), the token count ``N``, the
payload's length ``P`` and the XXH3-64 checksums of the tokens and of the payload (the bytes
``llama_state_seq_get_data`` wrote). A file is restored only when every part checks out: its
magic and version, its header's checksum, its key equal to the loading model's, its length
exactly that of its parts, and both checksums.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs
import numpy as np
import xxhash

from ._prefix import Tokens

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "PREAMBLE_BYTES",
    "Header",
    "SnapshotFormatError",
    "SnapshotKey",
    "checksum",
    "encode_header",
    "header_size",
    "parse_header",
    "parse_tokens",
]

MAGIC: Final = b"llmtrio snapshot"
FORMAT_VERSION: Final = 1
_PREAMBLE: Final = struct.Struct("<16sII")  # magic, version, header length
_CHECK: Final = struct.Struct("<Q")
#: The bytes :func:`header_size` reads.
PREAMBLE_BYTES: Final = _PREAMBLE.size
#: The longest JSON header read (a key is a few hundred bytes).
MAX_HEADER_BYTES: Final = 64 * 1024


class SnapshotFormatError(Exception):
    """A file that is no snapshot this process may restore; the message says why."""


def checksum(data: bytes | memoryview) -> int:
    """The XXH3-64 checksum the format uses."""
    return int(xxhash.xxh3_64_intdigest(data))


def _sorted_pairs(items: Iterable[tuple[object, object]]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(name), str(value)) for name, value in items))


@attrs.frozen
class SnapshotKey:
    """What a sequence's state depends on beside its tokens: the model file (``model``, its
    ``file_identity``), the llama.cpp build's state format (``build``) and the context's
    settings that change the state (``settings``: the KV cache types, flash attention, the
    window cache, one pool or a cache per slot, recurrent-state snapshots, a vision
    projector's identity; RoPE settings are the GGUF's own, inside ``model``)."""

    model: str
    build: str
    settings: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_sorted_pairs)

    @classmethod
    def of(cls, model: str, build: str, settings: Mapping[str, object]) -> SnapshotKey:
        return cls(model, build, tuple((k, str(v)) for k, v in settings.items()))

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "build": self.build, "settings": dict(self.settings)}

    @classmethod
    def from_json(cls, value: object) -> SnapshotKey:
        """Error handling: :class:`SnapshotFormatError` for anything but a key's shape."""
        if not isinstance(value, dict):
            raise SnapshotFormatError("its header holds no key")
        model, build, settings = value.get("model"), value.get("build"), value.get("settings")
        if not isinstance(model, str) or not isinstance(build, str):
            raise SnapshotFormatError("its key names no model or build")
        if not isinstance(settings, dict) or not all(isinstance(v, str) for v in settings.values()):
            raise SnapshotFormatError("its key's settings are not strings")
        return cls(model, build, tuple(settings.items()))

    def mismatch(self, other: SnapshotKey) -> str | None:
        """Why a snapshot keyed ``other`` may not be restored where this key holds (``None``:
        it may)."""
        if other.model != self.model:
            return "another model's snapshot"
        if other.build != self.build:
            return f"written by another llama.cpp build ({other.build})"
        if other.settings != self.settings:
            differ = sorted(set(dict(other.settings).items()).symmetric_difference(self.settings))
            names = ", ".join(dict.fromkeys(name for name, _ in differ))
            return f"written with other context settings ({names})"
        return None


@attrs.frozen
class Header:
    """A snapshot file's header: its key, where its ``n_tokens`` tokens begin
    (``tokens_at``, the byte offset) and its payload's length, with both checksums."""

    key: SnapshotKey
    tokens_at: int
    n_tokens: int
    tokens_check: int
    payload_bytes: int
    payload_check: int

    @property
    def payload_at(self) -> int:
        return self.tokens_at + 4 * self.n_tokens

    @property
    def file_bytes(self) -> int:
        return self.payload_at + self.payload_bytes


def header_size(head: bytes) -> int:
    """How many bytes the file's preamble, header and its checksum take (the tokens follow),
    read from its first :data:`PREAMBLE_BYTES` bytes.

    Error handling: :class:`SnapshotFormatError` when they are no snapshot's."""
    if len(head) < _PREAMBLE.size:
        raise SnapshotFormatError("the file is truncated inside its preamble")
    magic, version, length = _PREAMBLE.unpack_from(head)
    if magic != MAGIC:
        raise SnapshotFormatError("not a snapshot file")
    if version != FORMAT_VERSION:
        raise SnapshotFormatError(f"snapshot format version {version}, not {FORMAT_VERSION}")
    if length > MAX_HEADER_BYTES:
        raise SnapshotFormatError(f"a header of {length} bytes (at most {MAX_HEADER_BYTES})")
    return int(_PREAMBLE.size + length + _CHECK.size)


def encode_header(key: SnapshotKey, tokens: Tokens, payload: bytes | memoryview) -> bytes:
    """Everything a snapshot file holds before ``payload``: preamble, header, tokens."""
    body = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    fields = {
        "key": key.as_json(),
        "n_tokens": len(tokens),
        "tokens_xxh3": checksum(body),
        "payload_bytes": len(payload),
        "payload_xxh3": checksum(payload),
    }
    text = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return (
        _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(text)) + text + _CHECK.pack(checksum(text)) + body
    )


def parse_header(head: bytes, file_bytes: int) -> Header:
    """The header of a file of ``file_bytes`` bytes whose first :func:`header_size` bytes are
    ``head``.

    Error handling: :class:`SnapshotFormatError` saying what is wrong (not a snapshot, another
    format version, a corrupt header, a file truncated or longer than its parts); never
    anything else, whatever the bytes."""
    size = header_size(head)
    if len(head) < size:
        raise SnapshotFormatError("the file is truncated inside its header")
    text = head[_PREAMBLE.size : size - _CHECK.size]
    (check,) = _CHECK.unpack_from(head, size - _CHECK.size)
    if checksum(text) != check:
        raise SnapshotFormatError("its header's checksum does not match (a corrupt file)")
    try:
        fields = json.loads(text)
    except ValueError:
        raise SnapshotFormatError("its header is not JSON") from None
    if not isinstance(fields, dict):
        raise SnapshotFormatError("its header is not a JSON object")
    key = SnapshotKey.from_json(fields.get("key"))
    names = ("n_tokens", "tokens_xxh3", "payload_bytes", "payload_xxh3")
    numbers = [fields.get(name) for name in names]
    counts = [n for n in numbers if isinstance(n, int) and not isinstance(n, bool) and n >= 0]
    if len(counts) != len(names):
        raise SnapshotFormatError("its header's counts are not counts")
    n_tokens, tokens_check, payload_bytes, payload_check = counts
    header = Header(key, size, n_tokens, tokens_check, payload_bytes, payload_check)
    if header.file_bytes != file_bytes:
        state = "truncated" if header.file_bytes > file_bytes else "longer than its parts"
        raise SnapshotFormatError(
            f"the file is {state}: {file_bytes} bytes, its parts {header.file_bytes}"
        )
    return header


def parse_tokens(header: Header, body: bytes) -> Tokens:
    """The tokens of a file with ``header``, from their ``body`` bytes.

    Error handling: :class:`SnapshotFormatError` when they are cut short or corrupt."""
    if len(body) != 4 * header.n_tokens:
        raise SnapshotFormatError("the file is truncated inside its tokens")
    if checksum(body) != header.tokens_check:
        raise SnapshotFormatError("its tokens' checksum does not match (a corrupt file)")
    return np.frombuffer(body, dtype="<i4").astype(np.int32)
