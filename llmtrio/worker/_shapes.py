"""The shapes an endpoint of the worker is made of (``_pipeline`` serves them): the
:class:`Endpoint` a route is, the :class:`Encoder` of its response's bytes, the
:class:`Events` its work yields (:class:`Finished` for work done before it is handed over),
and :func:`run_tokenizer`, where an endpoint's own tokenizer work runs (a completion's
prompt, embeddings' texts, ``/tokenize``): on the event loop when it is small, else in a
thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar, TypeVarTuple, runtime_checkable

import trio

from ..api import ApiError, RequestLimits
from ..engine import EmbeddingEngine, Engine, Event, Token
from ._encoding import Answer, ResponseMeta

__all__ = [
    "Encoder",
    "Endpoint",
    "Events",
    "Finished",
    "KeepsAlive",
    "ModelEngine",
    "TypedBody",
    "WorkEvent",
    "run_tokenizer",
]

Request = TypeVar("Request")
Result = TypeVar("Result")
#: What an encoder finishes a response with: the engine's ``Done``, or an ``Answer`` of a kind.
End = TypeVar("End", contravariant=True)
Args = TypeVarTuple("Args")
#: The engine a worker serves one model with: a generating one or an embedding one (a
#: ``RerankEngine`` too); ``.kind`` says which: ``"chat"``, ``"embedding"``, ``"rerank"``.
ModelEngine = Engine | EmbeddingEngine
#: One event of an endpoint's work: a generation's (the engine's ``Token``, ``Done``,
#: ``Failed``) or the one ``Answer`` of work that is not a generation.
WorkEvent = Event | Answer


class Events(Protocol):
    """What an endpoint's work yields: its events in order, the last one a ``Done``, an
    ``Answer`` or a ``Failed`` (a :class:`~llmtrio.engine.Generation` is one; so is
    :class:`Finished`). ``ended`` is set once the work has finished producing (the rest is
    buffered); :meth:`drain` takes the buffered rest."""

    ended: trio.Event

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's length once the work has started, when it is known then (a
        generation's); ``None`` otherwise."""

    def __aiter__(self) -> AsyncIterator[WorkEvent]: ...

    def drain(self) -> Sequence[WorkEvent]: ...


class Finished:
    """Work that finished before it was handed over (its one ``Answer``: the vectors of an
    embeddings request, a tokenizer's answer, a count): the ``Events`` shape, already
    ended."""

    def __init__(self, answer: Answer) -> None:
        self._events: list[WorkEvent] = [answer]
        self.prompt_tokens: int | None = None
        self.ended = trio.Event()
        self.ended.set()

    async def __aiter__(self) -> AsyncIterator[WorkEvent]:
        while self._events:
            yield self._events.pop(0)

    def drain(self) -> list[WorkEvent]:
        events, self._events = self._events, []
        return events


class Encoder(Protocol[End]):
    """One response's bytes: ``streaming`` says whether they are server-sent events (the
    head goes out with the first event) or one JSON body (written by :meth:`finish`)."""

    streaming: bool

    def start(self) -> bytes:
        """What goes before the first event's bytes (a chat stream's role chunk)."""

    def event(self, token: Token) -> bytes:
        """One event's bytes (nothing for a JSON body, which is written at the end)."""

    def finish(self, end: End) -> bytes:
        """The last bytes: a stream's finish, usage and ``[DONE]``; a JSON body whole."""

    def finish_reason(self, end: End) -> str:
        """OpenAI's ``finish_reason`` the response gave (``tool_calls`` when it made one)."""

    def failure(self, error: ApiError) -> bytes:
        """The last bytes of an event stream that fails after its head: chat's
        ``data: {"error": ...}``, the Responses API's ``response.failed`` event."""


@runtime_checkable
class KeepsAlive(Protocol):
    """An event stream's encoder that keeps a waiting client's connection alive: when the
    work's first event has not come within ``keepalive_s`` seconds (a long prompt being
    ingested), the head and :meth:`Encoder.start` go out at once, then :meth:`ping` every
    ``keepalive_s`` seconds until it comes (a failure from then on is an error event)."""

    keepalive_s: float

    def ping(self) -> bytes:
        """A keep-alive event's bytes."""


@runtime_checkable
class TypedBody(Protocol):
    """A whole body's encoder whose body is not JSON (a transcript's text, subtitles):
    ``content_type`` is the response's type."""

    content_type: str


class Endpoint(Protocol[Request]):
    """One route of the API, as the worker serves it (see the module's doc)."""

    @property
    def route(self) -> str:
        """The path it answers (``POST``)."""

    @property
    def model_kind(self) -> str | None:
        """The kind of model it needs: ``"chat"`` (a generating model), ``"embedding"`` or
        ``"rerank"``; another kind's engine answers a 400 naming the model and what it
        serves. ``None``: any model (what every engine can do: its tokenizer)."""

    @property
    def id_prefix(self) -> str:
        """The prefix of its response ids (``chatcmpl``, ``cmpl``)."""

    def parse(self, body: bytes, limits: RequestLimits) -> Request:
        """The request, parsed and validated. Error handling: :class:`ApiError`."""

    def run(self, engine: Any, request: Request) -> AbstractAsyncContextManager[Events]:
        """Start the work on ``engine`` (a :data:`ModelEngine` of :attr:`model_kind`);
        leaving the block ends it.

        Error handling: :class:`ApiError` or :class:`EngineError` when the work cannot
        start."""

    def encoder(self, request: Request, meta: ResponseMeta) -> Encoder[Any]:
        """The encoder of this request's response (of a ``Done`` for a generation's work,
        of its ``Answer`` for other work)."""


#: Tokenizer work on up to this many characters of text (or token ids) in all runs on the
#: event loop (a 93-character sentence takes 23 us, 1024 characters at most about 0.25 ms),
#: which costs less than the hand-off to a worker thread and back; longer work in a thread.
_INLINE_TOKENIZER_SIZE = 1024


async def run_tokenizer(size: int, work: Callable[[*Args], Result], *args: *Args) -> Result:
    """``work(*args)``, tokenizer work on ``size`` characters of text or token ids: on the
    event loop when that is small, else in a worker thread, never abandoned on cancel (the
    model must outlive the thread that reads it)."""
    if size <= _INLINE_TOKENIZER_SIZE:
        return work(*args)
    return await trio.to_thread.run_sync(work, *args)
