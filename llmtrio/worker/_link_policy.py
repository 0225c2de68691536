"""The policy the one link loop (``_link.serve_link``) is given for its model:
:class:`Hosting`, how the link holds the model (loaded or not, acquired and released around
each request, unloaded on ``POST /models/unload``, its LoRA adapters), the bookkeeping of the
link's claims (:class:`Claims`: when they must be withdrawn), and :class:`Pinned`, an engine
loaded for the link's whole life (``--model``). ``_on_demand.OnDemand`` is the other policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import attrs
import trio

from ..engine import EngineFailedError
from ..ring import ClaimedStream
from ._adapters import AdapterBook
from ._manage import pinned, respond_error
from ._shapes import ModelEngine

__all__ = ["Claims", "Hosting", "Lease", "ModelStatus", "Pinned"]


def _set_event() -> trio.Event:
    event = trio.Event()
    event.set()
    return event


@attrs.define(eq=False)
class Claims:
    """A model's ring links as its unloads see them: each link claims inside a scope of
    :meth:`claiming`, which an unload cancels; the unload frees the model once no link is
    inside one (each has withdrawn its claims). A pinned model's never begin to unload."""

    #: How many unloads have begun: a stream claimed before the latest began is handed back.
    unloads: int = 0
    #: Set while no unload is under way: a link claims only then.
    settled: trio.Event = attrs.field(factory=_set_event)
    _scopes: set[trio.CancelScope] = attrs.field(factory=set)
    _left: trio.Event = attrs.field(factory=trio.Event)

    @contextmanager
    def claiming(self) -> Iterator[trio.CancelScope]:
        """Register one link's claiming: claim inside the scope yielded (``with scope:``),
        which is cancelled when an unload begins (at once when one is under way); withdraw
        before leaving the block, which the unload waits for."""
        scope = trio.CancelScope()
        if not self.settled.is_set():
            scope.cancel()
        self._scopes.add(scope)
        try:
            yield scope
        finally:
            self._scopes.discard(scope)
            self._left.set()

    def begin_unload(self) -> None:
        """An unload begins: cancel every claim and hold new ones until :meth:`unloaded`."""
        self.unloads += 1
        if self.settled.is_set():
            self.settled = trio.Event()
        for scope in self._scopes:
            scope.cancel()

    async def withdrawn(self) -> None:
        """Return once no link claims (each withdrew its claims and left :meth:`claiming`)."""
        while self._scopes:
            self._left = trio.Event()
            await self._left.wait()

    def unloaded(self) -> None:
        self.settled.set()


@attrs.frozen
class ModelStatus:
    """What a link's heartbeat states of its model beside the engine's capacity (the
    ``Heartbeat`` fields of the same names): its ``state`` (``""``: not stated, a pinned
    model), its estimated ``bytes``, the seconds until it unloads when idle, the memory
    budget its worker still has free for a load (``free_bytes``), and the LoRA adapters it
    is served with (``adapters``)."""

    state: str = ""
    bytes: int = 0
    unload_in_s: int = 0
    free_bytes: int = 0
    adapters: tuple[str, ...] = ()


@attrs.frozen
class Lease:
    """A request's hold on the loaded model, from :meth:`Hosting.acquire` to
    :meth:`Hosting.release`: the engine, and the request's ``keep_alive`` (seconds; ``None``:
    the model's own)."""

    engine: ModelEngine
    keep_alive: float | None = None


@runtime_checkable
class Hosting(Protocol):
    """How a link's model is held, as :func:`serve_link` asks it (see the module)."""

    @property
    def model_name(self) -> str: ...

    @property
    def slots(self) -> int | None:
        """How many of the model's generations the link runs at once once it is loaded;
        ``None``: as many as the link holds."""

    @property
    def claims(self) -> Claims:
        """When the link's claims must be withdrawn (the model begins to unload)."""

    @property
    def adapters(self) -> AdapterBook:
        """The LoRA adapters the model is served with."""

    @property
    def on_demand(self) -> bool:
        """Whether the model loads and unloads as requests come and go: the ring then hears
        its state at once as each request ends (keep_alive 0 unloads it), not at the next
        beat."""

    def engine(self) -> ModelEngine | None:
        """The model's engine while it is loaded; ``None`` while it is not (loading,
        unloading, unloaded)."""

    def status(self) -> ModelStatus:
        """What the heartbeat states of the model now."""

    async def acquire(self, claimed: ClaimedStream) -> Lease:
        """The loaded model for ``claimed`` (loading it first if need be); it counts as in
        flight on the model until :meth:`release`.

        Error handling: :class:`ApiError` when the request cannot be served by it (the
        load failed or is backed off: 503; a ``keep_alive`` that is no duration: 400)."""

    def release(self, lease: Lease) -> None:
        """A request's work on the model ended."""

    async def unload(self, claimed: ClaimedStream) -> None:
        """Answer ``POST /models/unload`` for the model."""

    async def failed(self) -> EngineFailedError:
        """Return once the model's engine has failed and the link can serve no more (a
        pinned model's); never for a model on demand (its host unloads it instead)."""


def _book_of(pinned: Pinned) -> AdapterBook:
    engine = pinned.engine()
    return AdapterBook(engine.model_name, engine.config.lora)


@attrs.frozen
class Pinned:
    """A model loaded for the link's whole life (``--model``): always loaded, never
    unloaded; its link detaches when its engine fails. ``adapters``: its LoRA adapters'
    book (its worker's ``ModelHost.pin`` gives one within the budget; by default, the
    engine's own, none loaded at run time)."""

    _engine: ModelEngine
    _adapters: AdapterBook = attrs.field(
        default=attrs.Factory(_book_of, takes_self=True), kw_only=True
    )
    _claims: Claims = attrs.field(factory=Claims, init=False)

    @property
    def model_name(self) -> str:
        return self._engine.model_name

    @property
    def slots(self) -> int | None:
        return None

    @property
    def claims(self) -> Claims:
        return self._claims

    @property
    def adapters(self) -> AdapterBook:
        return self._adapters

    @property
    def on_demand(self) -> bool:
        return False

    def engine(self) -> ModelEngine:
        return self._engine

    def status(self) -> ModelStatus:
        return ModelStatus(adapters=self._adapters.names())

    async def acquire(self, claimed: ClaimedStream) -> Lease:
        return Lease(self._engine)

    def release(self, lease: Lease) -> None:
        pass

    async def unload(self, claimed: ClaimedStream) -> None:
        await respond_error(claimed, pinned(self.model_name))

    async def failed(self) -> EngineFailedError:
        return await self._engine.wait_failed()
