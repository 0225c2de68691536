"""One request's record at the ingress: its id, what was answered, and the access-log line.

The ingress relays bytes and never reads them: the status comes from the response head and
``complete`` from its last body message (:class:`ResponseObserver`, the ASGI messages'
framing only); what the request ended with (finish reason, prompt, cached and completion
tokens, error code) is the :class:`~llmtrio.ring.Outcome` its worker stated on the ring's
``ResponseEnd``/``ResponseError``, or the error the ingress answered or ended it with
itself (:meth:`Exchange.ended_with`). Where no end came:

- the client left before the answer: status 499, error ``client_closed``; after the head:
  the head's status, error ``client_closed``, ``complete`` false;
- past the request's deadline: error ``timeout`` (a 504, or an error event);
- the worker failed or went away: error ``worker_failed`` (a 502, or an error event);
- cut by the shutdown's graceful timeout: error ``shutting_down``;

and the token counts are unknown (``-``) but for those a worker stated before it failed.

The access log is the ``llmtrio.access`` logger, one INFO line per request, in logfmt
(``key=value``); the same fields ride on the record as ``record.access`` (a dict) for a JSON
formatter.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from ..ring import Outcome

__all__ = [
    "CLIENT_CLOSED",
    "Exchange",
    "ResponseObserver",
    "exchange_of",
    "request_id",
    "with_exchange",
]

access_logger = logging.getLogger("llmtrio.access")

Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]

#: The error of a request whose client left before its response ended (no body tells it).
CLIENT_CLOSED = "client_closed"
#: The key of a request's :class:`Exchange` in the ASGI scope's ``extensions`` (for the
#: pages app, which records the error it answers with there).
_EXCHANGE = "llmtrio.exchange"
#: A client's own ``X-Request-Id`` is kept when it is this tame (UUIDs, ULIDs, base64).
_SANE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+/=@-]{0,127}")


def request_id(headers: Mapping[str, str]) -> str:
    """The client's ``X-Request-Id`` if it is short and plain (at most 128 characters of
    letters, digits and ``._:+/=@-``), else a new ``req-`` id."""
    given = headers.get("x-request-id", "")
    if _SANE_ID.fullmatch(given):
        return given
    return "req-" + secrets.token_hex(12)


@attrs.define
class ResponseObserver:
    """What the ASGI messages sending a response say by their framing alone: its ``status``
    (from the head) and whether it is ``complete`` (its last body message went out). Pure:
    no I/O; the bodies are not looked into."""

    status: int | None = None
    complete: bool = False

    def observe(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.complete = True


@attrs.define
class Exchange:
    """One HTTP request at the ingress, from its arrival to its last byte: ``watch(send)``
    records what goes out; ``worker`` and ``outcome`` are set by whoever knows which worker
    served it and what it ended with (see the module's doc)."""

    request_id: str
    method: str
    path: str
    client: str
    started: float
    worker: str | None = None
    first_byte: float | None = None
    observer: ResponseObserver = attrs.field(factory=ResponseObserver)
    outcome: Outcome | None = None
    _shielded: bool = attrs.field(init=False, default=False)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Shield the sends in the block from cancellation (a response head and its whole
        body, sent whole or not at all); the last body's send then needs no shield of its
        own (see :meth:`watch`)."""
        self._shielded = True
        try:
            with trio.CancelScope(shield=True):
                yield
        finally:
            self._shielded = False

    def ended_with(self, error_code: str) -> None:
        """The request ended with ``error_code`` (an error the ingress answered or ended it
        with, or ``client_closed``); the token counts its worker stated, if any, stay."""
        self.outcome = attrs.evolve(self.outcome or Outcome(), error_code=error_code)

    def watch(
        self, send: Send, clock: Callable[[], float], on_last: Callable[[], None] | None = None
    ) -> Send:
        """``send``, recording the response it sends (``complete`` once its last body
        message is handed to the server); ``on_last`` runs just before that last message
        goes, so that what it counts is counted before the client can see the end."""
        observer = self.observer

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.first_byte = clock()
            # Before the send: the server tells the app of the client's disconnect as soon
            # as the last body is out, which may cancel this very send.
            observer.observe(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                if on_last is not None:
                    on_last()
                # Shielded: that cancellation would also cut short the server's own work
                # after the last body (hypercorn starts its keep-alive idle timer there, so a
                # cancelled last send left the connection open forever). Bounded: the
                # connection's writes give up after the send timeout.
                if self._shielded:  # already, by ``shielded``
                    await send(message)
                    return
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
        ``complete`` false when the response was cut; the rest from ``outcome``."""
        seen, outcome = self.observer, self.outcome or Outcome()
        return {
            "request_id": self.request_id,
            "worker": self.worker,
            "client": self.client,
            "method": self.method,
            "path": self.path,
            "status": seen.status if seen.status is not None else 499,
            "complete": seen.complete,
            "finish_reason": outcome.finish_reason,
            "error": outcome.error_code,
            "prompt_tokens": outcome.prompt_tokens,
            "cached_tokens": outcome.cached_tokens,
            "completion_tokens": outcome.completion_tokens,
            "ttfb_s": _rounded(self.ttfb()),
            "total_s": round(ended - self.started, 6),
        }

    def log(self, ended: float) -> None:
        fields = self.fields(ended)
        if access_logger.isEnabledFor(logging.INFO):
            line = " ".join(f"{key}={_logfmt(value)}" for key, value in fields.items())
            access_logger.info(line, extra={"access": fields})


def with_exchange(scope: Message, exchange: Exchange) -> Message:
    """``scope`` carrying ``exchange`` in its ``extensions``, for an app behind the ingress."""
    extensions = {**(scope.get("extensions") or {}), _EXCHANGE: exchange}
    return {**scope, "extensions": extensions}


def exchange_of(scope: Mapping[str, Any]) -> Exchange | None:
    """The :class:`Exchange` that :func:`with_exchange` put in ``scope``, if any."""
    exchange = (scope.get("extensions") or {}).get(_EXCHANGE)
    return exchange if isinstance(exchange, Exchange) else None


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
