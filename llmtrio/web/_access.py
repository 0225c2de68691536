"""One request's record at the ingress: its id, what was answered, and the access-log line.

The ingress relays bytes; what a request ended with (status, finish reason, token counts,
error code) is read from the response as it goes out: the status from its head, the rest
from its JSON body or from the few server-sent events that carry it (the one with a
``finish_reason``, the ``usage`` chunk, an ``error`` event), so nothing else is parsed twice.

The access log is the ``llmtrio.access`` logger, one INFO line per request, in logfmt
(``key=value``); the same fields ride on the record as ``record.access`` (a dict) for a JSON
formatter.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

__all__ = ["Exchange", "ResponseObserver", "request_id"]

access_logger = logging.getLogger("llmtrio.access")

Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]

#: A client's own ``X-Request-Id`` is kept when it is this tame (UUIDs, ULIDs, base64).
_SANE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+/=@-]{0,127}")
_MAX_SCANNED_BODY = 4 << 20


def request_id(headers: Mapping[str, str]) -> str:
    """The client's ``X-Request-Id`` if it is short and plain (at most 128 characters of
    letters, digits and ``._:+/=@-``), else a new ``req-`` id."""
    given = headers.get("x-request-id", "")
    if _SANE_ID.fullmatch(given):
        return given
    return "req-" + secrets.token_hex(12)


@attrs.define
class ResponseObserver:
    """What a response says about how its request ended, fed the ASGI messages that send it.

    Pure: no I/O. ``finish_reason``, ``prompt_tokens``/``completion_tokens`` (when the body
    reports usage) and ``error_code`` (an error body's or error event's ``code``, else its
    ``type``) are filled in as the body goes by.
    """

    status: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error_code: str | None = None
    complete: bool = False
    _kind: str = ""  # "json", "sse" or "" (not looked into)
    _pending: bytearray = attrs.field(factory=bytearray)

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        content_type = b""
        for name, value in headers:
            if name.lower() == b"content-type":
                content_type = value
        if content_type.startswith(b"text/event-stream"):
            self._kind = "sse"
        elif content_type.startswith(b"application/json"):
            self._kind = "json"

    def body(self, chunk: bytes, more: bool) -> None:
        if self._kind == "json":
            if len(self._pending) + len(chunk) <= _MAX_SCANNED_BODY:
                self._pending += chunk
            if not more:
                self._read_json(bytes(self._pending))
                self._pending.clear()
        elif self._kind == "sse":
            self._pending += chunk
            *lines, rest = self._pending.split(b"\n")
            self._pending = bytearray(rest)
            for line in lines:
                if line.startswith(b"data: {") and (
                    b'"finish_reason":"' in line or b'"usage":{' in line or b'"error":' in line
                ):
                    self._read_json(bytes(line[6:]))
        if not more:
            self.complete = True

    def _read_json(self, raw: bytes) -> None:
        try:
            data = json.loads(raw)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        error = data.get("error")
        if isinstance(error, dict):
            code = error.get("code") or error.get("type")
            self.error_code = str(code) if code is not None else "error"
        choices = data.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                    self.finish_reason = choice["finish_reason"]
        usage = data.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                self.prompt_tokens, self.completion_tokens = prompt, completion


@attrs.define
class Exchange:
    """One HTTP request at the ingress, from its arrival to its last byte: ``watch(send)``
    records what goes out; ``worker`` is set by whoever knows which worker served it."""

    request_id: str
    method: str
    path: str
    client: str
    started: float
    worker: str | None = None
    first_byte: float | None = None
    observer: ResponseObserver = attrs.field(factory=ResponseObserver)

    def watch(
        self, send: Send, clock: Callable[[], float], on_last: Callable[[], None] | None = None
    ) -> Send:
        """``send``, recording the response it sends (``complete`` once its last body
        message is handed to the server); ``on_last`` runs just before that last message
        goes, so that what it counts is counted before the client can see the end."""
        observer = self.observer

        async def watched(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                self.first_byte = clock()
                observer.start(message["status"], message.get("headers", []))
            elif kind == "http.response.body":
                # Before the send: the server tells the app of the client's disconnect as
                # soon as the last body is out, which may cancel this very send.
                observer.body(message.get("body", b""), message.get("more_body", False))
                if not message.get("more_body", False):
                    if on_last is not None:
                        on_last()
                    # Shielded: that cancellation would also cut short the server's own work
                    # after the last body (hypercorn starts its keep-alive idle timer there,
                    # so a cancelled last send left the connection open forever). Bounded:
                    # the connection's writes give up after the send timeout.
                    with trio.CancelScope(shield=True):
                        await send(message)
                    return
            await send(message)

        return watched

    def ttfb(self) -> float | None:
        """Seconds from arrival to the response head, once it went out."""
        return None if self.first_byte is None else self.first_byte - self.started

    def fields(self, ended: float) -> dict[str, Any]:
        """The access-log fields: ``status`` 499 when the client left before any answer,
        ``complete`` false when the response was cut."""
        seen = self.observer
        return {
            "request_id": self.request_id,
            "worker": self.worker,
            "client": self.client,
            "method": self.method,
            "path": self.path,
            "status": seen.status if seen.status is not None else 499,
            "complete": seen.complete,
            "finish_reason": seen.finish_reason,
            "error": seen.error_code,
            "prompt_tokens": seen.prompt_tokens,
            "completion_tokens": seen.completion_tokens,
            "ttfb_s": _rounded(self.ttfb()),
            "total_s": round(ended - self.started, 6),
        }

    def log(self, ended: float) -> None:
        fields = self.fields(ended)
        if access_logger.isEnabledFor(logging.INFO):
            line = " ".join(f"{key}={_logfmt(value)}" for key, value in fields.items())
            access_logger.info(line, extra={"access": fields})


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


def _logfmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if not text or any(c in text for c in ' "=\\') or not text.isprintable():
        return json.dumps(text)
    return text
