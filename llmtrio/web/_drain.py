"""The ingress's graceful drain: what the server and the app share once a shutdown begins.

Three phases, each entered once and never left::

    serving ──start()──> draining ──cut()──> cut

- serving: requests are served.
- draining: new ring requests are refused at once (503 ``shutting_down`` with ``Retry-After``)
  and ``/health`` answers 503 ``draining``, so a load balancer sends traffic elsewhere; the
  requests already in (parked on the ring, being generated, being relayed) go on.
- cut: the graceful timeout passed; each request still running ends at once with an error in
  OpenAI's shape (a 503 if its response has not started, an error event if it is streaming).

The server waits on :meth:`Drain.wait_idle` between the phases; the app marks each ring
request with :meth:`Drain.track`, and hands the drain the request's cancel scope
(:meth:`Drain.cuts`), which :meth:`Drain.cut` cancels: no task per request watches the drain.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import trio

__all__ = ["Drain"]


@attrs.define(eq=False)
class Drain:
    """The drain state of one ingress (see the module's docstring)."""

    _active: int = attrs.field(init=False, default=0)
    _changed: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    _draining: bool = attrs.field(init=False, default=False)
    _cut: trio.Event = attrs.field(init=False, factory=trio.Event)
    _scopes: set[trio.CancelScope] = attrs.field(init=False, factory=set)

    @property
    def draining(self) -> bool:
        """Whether new requests are refused (true from :meth:`start` on)."""
        return self._draining

    @property
    def active(self) -> int:
        """Ring requests in the ingress now, from their first byte to their last."""
        return self._active

    @property
    def cut_called(self) -> trio.Event:
        """Set by :meth:`cut`: the requests still running must end now."""
        return self._cut

    def start(self) -> None:
        """Refuse new requests from now on."""
        self._draining = True
        self._changed.unpark_all()

    def cut(self) -> None:
        """End the requests still running (after :meth:`start`): cancel every scope handed
        to :meth:`cuts` that is still in its block."""
        self._draining = True
        self._cut.set()
        for scope in self._scopes:
            scope.cancel()

    @contextmanager
    def cuts(self, scope: trio.CancelScope) -> Iterator[None]:
        """:meth:`cut` cancels ``scope`` while the block runs (at once if the drain is cut
        already); a request tells it was cut by :attr:`cut_called`."""
        if self._cut.is_set():
            scope.cancel()
        self._scopes.add(scope)
        try:
            yield
        finally:
            self._scopes.discard(scope)

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count one request as active for the length of the block."""
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            self._changed.unpark_all()

    async def wait_idle(self) -> None:
        """Wait until no request is active."""
        while self._active:
            await self._changed.park()
