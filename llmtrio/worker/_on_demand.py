"""A model on demand as its ring link holds it: :class:`OnDemand`, the policy the one link
loop (``_link.serve_link``) is given for a model of a ``ModelHost``.

Each catalog model has its own ring link, attached from the start whether loaded or not, so
that the ingress routes the model's requests to this worker and parks them while none has
claimed them. While the model is not loaded the link claims every stream parked for it (no
slot bound: they are waiting on the load, not on a slot), and the first one claimed starts the
load; every other request for the model joins that load, up to ``LOAD_WAITERS`` of them. Once
loaded, the link claims only while one of the model's ``max_inflight`` slots is free, as any
worker does.

How the timeouts combine: a request parked at the ingress is subject to the ingress's park
timeout until a worker claims it; a worker claims the requests of a model it is loading at
once (up to ``LOAD_WAITERS``), so from then on only ``load_timeout`` (the load's own) and
the request's own deadline (``--request-timeout``) apply: such a request is never refused
by the park timeout while its model loads. Requests beyond ``LOAD_WAITERS`` stay parked and
the park timeout applies to them as to any request waiting for a slot.
"""

from __future__ import annotations

import attrs
import trio

from ..api import invalid_request, read_keep_alive
from ..engine import EngineFailedError
from ..ring import ClaimedStream
from ._host import ModelHost
from ._hosted import ModelLoadFailed
from ._link import Claims, Lease, ModelStatus
from ._manage import pinned, respond_error, respond_state
from ._shapes import ModelEngine

__all__ = ["LOAD_WAITERS", "OnDemand"]

#: The requests one worker holds waiting on a model's load (its link's bound in the ring):
#: more wait parked at the ingress, subject to its park timeout.
LOAD_WAITERS = 64


@attrs.frozen
class OnDemand:
    """The model ``name`` of ``host``, loaded by the first request claimed for it and
    unloaded when idle (see the module); serve its link with ``serve_link(OnDemand(host,
    name), link)``, the host's :meth:`~ModelHost.run` running beside it.

    Error handling: a request whose model cannot be loaded (or is within its back-off after a
    failed load) is refused 503 ``model_load_failed`` naming the model and the reason, with a
    ``Retry-After`` in the back-off; a ``keep_alive`` that is no duration 400, before
    anything loads."""

    host: ModelHost
    name: str

    @property
    def model_name(self) -> str:
        return self.name

    @property
    def slots(self) -> int:
        return self.host.models[self.name].config.max_inflight

    @property
    def claims(self) -> Claims:
        return self.host.claims(self.name)

    @property
    def on_demand(self) -> bool:
        return True

    def engine(self) -> ModelEngine | None:
        return self.host.engine(self.name)

    def status(self) -> ModelStatus:
        host, name = self.host, self.name
        if host.engine(name) is None:
            state = "loading" if host.state(name) == "loading" else "unloaded"
            return ModelStatus(state, free_bytes=host.free_bytes())
        return ModelStatus(
            "loaded", host.models[name].cost.total, host.unload_in(name), host.free_bytes()
        )

    async def acquire(self, claimed: ClaimedStream) -> Lease:
        keep_alive = read_keep_alive(claimed.body)
        try:
            engine = await self.host.acquire(self.name)
        except ModelLoadFailed as failure:
            raise failure.error() from None
        return Lease(engine, keep_alive)

    def release(self, lease: Lease) -> None:
        self.host.release(self.name, lease.keep_alive)

    async def unload(self, claimed: ClaimedStream) -> None:
        """``POST /models/unload``: an idle loaded model unloads now; a pinned one, one with
        requests in flight or one loading is refused (400, naming why)."""
        host, name = self.host, self.name
        state = host.state(name)
        if state is None:
            await respond_state(claimed, name, "unloaded")
        elif host.unload(name) or state == "unloading":
            await respond_state(claimed, name, "unloading")
        elif host.models[name].pinned:
            await respond_error(claimed, pinned(name))
        else:
            why = "is loading" if state == "loading" else "has requests in flight"
            await respond_error(
                claimed,
                invalid_request(f"The model {name!r} {why}: it is not unloaded.", param="model"),
            )

    async def failed(self) -> EngineFailedError:
        """Never: the host unloads a model whose engine failed, and loads it again later."""
        await trio.sleep_forever()
