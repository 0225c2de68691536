"""JSON and server-sent events, written one way for every route. Pure.

- :func:`dumps`: compact JSON in UTF-8, as every body and event carries it;
- :func:`json_string`: one string as a JSON literal (the chat stream's hand-built chunks);
- :func:`sse`: one server-sent event, ``event: NAME\n`` when named, then ``data: ...\n\n``;
  :data:`SSE_DONE` ends an OpenAI completion stream.

Text from a model or a client may hold a lone surrogate, which UTF-8 cannot carry: both
encoders write U+FFFD for it.
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring
from typing import Final

__all__ = ["SSE_DONE", "dumps", "json_string", "sse"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(literal: str) -> bytes:
    try:
        return literal.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", literal).encode()


def dumps(value: object) -> bytes:
    """Compact JSON in UTF-8; lone surrogates in strings become U+FFFD."""
    return _utf8(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False))


def json_string(text: str) -> bytes:
    """``text`` as a JSON string literal in UTF-8; lone surrogates become U+FFFD."""
    return _utf8(encode_basestring(text))


def sse(data: bytes, event: str | None = None) -> bytes:
    """One server-sent event carrying ``data`` (one line: compact JSON never holds a
    newline), named ``event`` when given."""
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    return head + b"data: " + data + b"\n\n"


#: The last event of an OpenAI completion stream.
SSE_DONE: Final = sse(b"[DONE]")
