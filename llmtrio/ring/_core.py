"""The ring's core: the state of every stream and worker, with no I/O at all (sans-IO).

``RingCore``'s event methods check each event against the current state (raising
``ProtocolError`` and changing nothing when it is illegal), update the state, and return the
*effects*: messages the caller must deliver, ``ToWorker`` (an ``Assign`` or ``Cancel`` for one
worker) or ``ToClient`` (a response message for one stream's client). The in-process ring's
router and the control listener for remote workers are routers of these effects; the core is
the single source of truth, and the only owner of routing (which worker gets which stream).

A stream's states and the legal transitions are drawn and tabled in ``_states``
(``StreamState``, ``TRANSITIONS``); the snapshots ``stats`` returns are in ``_stats``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

import attrs

from ._config import default
from ._errors import ProtocolError, RingFullError
from ._messages import (
    CHAT_MODEL,
    Assign,
    Attach,
    Cancel,
    Claim,
    Detach,
    Heartbeat,
    Message,
    Release,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    ResponseMessage,
    _to_bytes,
)
from ._routing import ANY_MODEL, Rank, Routes, Worker
from ._states import TRANSITIONS, StreamState
from ._stats import ModelStats, RingStats, WorkerStats

__all__ = ["Effect", "RingCore", "ToClient", "ToWorker"]


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


@attrs.define
class _Stream:
    stream_id: int
    head: RequestHead
    body: bytes
    key: str = ""  # the routing key (the request's model); "" for any worker
    #: What its prompt begins with: (digest, size) links of a chain (prefix affinity).
    prefixes: tuple[tuple[str, int], ...] = ()
    state: StreamState = StreamState.PARKED
    worker_id: str | None = None
    assignments: int = 0


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

    One load at a time (models on demand): a link whose last heartbeat states its model
    ``unloaded`` and which holds none of its streams is *cold* for that model. While some
    other link listing the model is not cold (loaded, loading, or asked to load: it holds one
    of its streams), the cold links' claims for it are held; while every link listing it is
    cold, only the claimant stating the most ``free_bytes`` (ties: by turn) is assigned one,
    which asks it to load the model, and the streams after it join that load. When the load
    ends (loaded, or failed and answered) the held claims are weighed again. A link asked to
    load a model that is cold again without having stated it loaded has failed to load it:
    the next load of it goes to a cold claimant that has not failed to (whichever states the
    most free budget), else to the one whose failure is the oldest, so a worker that cannot
    load a model is not asked again while another could (its own back-off answers those it
    is asked again).

    Prefix affinity: a stream may be parked with what its prompt begins with (a chain of
    digests, each with the size it covers), and a worker's heartbeat may state the digests of
    the prefixes it holds. When a stream is offered and several claimants may take it, the one
    holding the longest of its prefixes goes first, among the claimants holding no more than
    ``affinity_slack`` of the model's streams beyond the least busy one (the others after
    them), then round-robin as without. Only who takes a stream offered now changes: a claim
    still takes the oldest stream parked, and a stream still goes to a claimant at once, so
    nothing waits for the worker holding its prefix and no claimant is passed over while it
    is the only one.

    Every method either raises (``RingFullError``, ``ProtocolError``) and changes nothing, or
    applies the event and returns the effects the caller must deliver, in order.
    """

    max_streams: int = attrs.field(validator=_positive)
    retry_after: float = attrs.field(default=default("retry_after"), validator=_non_negative)
    max_assignments: int = attrs.field(
        default=default("max_assignments"), kw_only=True, validator=_positive
    )
    affinity_slack: int = attrs.field(default=2, kw_only=True, validator=_non_negative)
    _streams: dict[int, _Stream] = attrs.field(init=False, factory=dict)
    _counts: Counter[StreamState] = attrs.field(init=False, factory=Counter)
    _workers: dict[str, Worker] = attrs.field(init=False, factory=dict)
    _routes: Routes = attrs.field(init=False, factory=Routes)  # parked streams, waiting claims
    _next_id: int = attrs.field(init=False, default=1)
    _failed_loads: int = attrs.field(init=False, default=0)

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

    def held(self, worker_id: str) -> tuple[int, ...]:
        """The streams ``worker_id`` holds (none for a worker not attached)."""
        worker = self._workers.get(worker_id)
        return () if worker is None else tuple(worker.held)

    def key(self, stream_id: int) -> str | None:
        """The routing key ``stream_id`` was parked with; ``None`` once it is forgotten."""
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.key

    @property
    def takes_any_model(self) -> bool:
        """Whether an attached worker listed no model (its claims take a stream of any key)."""
        return any(not worker.models for worker in self._workers.values())

    def models(self) -> dict[str, ModelStats]:
        """Every model an attached worker listed, by name, in attach order: its kind (as its
        first worker said), how many workers serve it, and its context length (the least its
        workers stated)."""
        models: dict[str, ModelStats] = {}
        order = ("unloaded", "loading", "loaded")
        for worker in self._workers.values():
            beat = worker.capacity
            own = (beat.model_state if beat else "") or "loaded"
            size = beat.model_bytes if beat and own == "loaded" else 0
            until = beat.unload_in_s if beat and own == "loaded" else 0
            for index, name in enumerate(worker.models):
                known = models.get(name)
                kind = worker.kinds[index] if worker.kinds else CHAT_MODEL
                vision, audio = name in worker.vision, name in worker.audio
                context = worker.contexts[index] if worker.contexts else 0
                if known is None:
                    models[name] = ModelStats(
                        name,
                        kind,
                        1,
                        own,
                        size,
                        until,
                        vision=vision,
                        audio=audio,
                        context_length=context,
                    )
                    continue
                latest = -1 if -1 in (until, known.unload_in_s) else max(until, known.unload_in_s)
                models[name] = ModelStats(
                    name,
                    known.kind,
                    known.workers + 1,
                    max(own, known.state, key=order.index),
                    known.bytes + size,
                    latest,
                    vision=known.vision,
                    audio=known.audio,
                    # What every worker serving it takes: the least stated.
                    context_length=min(
                        (n for n in (context, known.context_length) if n), default=0
                    ),
                )
        return models

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
                    models=worker.models,
                    kinds=worker.kinds,
                    claims=tuple(worker.credits.items()),
                    waiting_claims=worker.waiting,
                    held=tuple(worker.held),
                    capacity=worker.capacity,
                    last_heartbeat=worker.last_heartbeat,
                )
                for worker in self._workers.values()
            ),
        )

    # -- the client side -----------------------------------------------------------------------

    def park(
        self,
        head: RequestHead,
        body: bytes = b"",
        *,
        key: str = "",
        prefixes: Sequence[tuple[str, int]] = (),
    ) -> tuple[int, list[Effect]]:
        """Park a new request; returns its stream id and the effects (maybe its ``Assign``).

        ``key`` is the request's routing key (the ingress passes its resolved ``model``): only
        a claim for that model, or a claim without a model from a worker that listed it (or
        listed none), takes the stream. An empty key is taken by any claim. ``prefixes``: what
        its prompt begins with, as ``(digest, size)`` pairs (see the class: prefix affinity).

        Error handling: raises ``RingFullError`` when ``max_streams`` streams are open.
        """
        if self.open_streams >= self.max_streams:
            raise RingFullError(self.retry_after, self.max_streams)
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, not {key!r}")
        stream = _Stream(self._next_id, head, _to_bytes(body), key, tuple(prefixes))
        self._next_id += 1
        self._streams[stream.stream_id] = stream
        self._counts[StreamState.PARKED] += 1
        return stream.stream_id, self._offer([stream], fresh=True)

    def cancel(self, stream_id: int) -> list[Effect]:
        """The client went away. Idempotent; a finished or unknown stream is ignored.

        A parked stream is forgotten. An assigned or responding one becomes CANCELLED and the
        effects hold a ``Cancel`` for its worker: the one case the worker must be told.
        """
        stream = self._streams.get(stream_id)
        if stream is None or stream.state is StreamState.CANCELLED:
            return []
        if stream.state is StreamState.PARKED:
            self._unqueue(stream)
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
        self._workers[message.worker_id] = Worker(
            message.worker_id,
            message.max_inflight,
            message.models,
            message.kinds,
            vision=message.vision,
            audio=message.audio,
            contexts=message.contexts,
        )

    def receive(self, worker_id: str, message: Message) -> list[Effect]:
        """Apply any message from attached worker ``worker_id`` (what a transport decodes).

        Error handling: ``ProtocolError`` for a message a worker may not send here
        (``Attach`` again, ``Assign``, ``Cancel``) or one illegal in the current state.
        """
        match message:
            case Heartbeat():
                return self.heartbeat(worker_id, message)
            case Claim():
                return self.claim(worker_id, message)
            case ResponseHead() | ResponseData() | ResponseEnd() | ResponseError():
                return self.respond(worker_id, message)
            case Release(stream_id=stream_id):
                return self.release(worker_id, stream_id)
            case Detach(reason=reason):
                return self.detach(worker_id, reason)
            case _:
                raise ProtocolError(
                    f"a worker may not send {type(message).__name__} after attaching", message
                )

    def heartbeat(
        self, worker_id: str, message: Heartbeat, at: float | None = None
    ) -> list[Effect]:
        """Store the worker's reported capacity and when it came (shown by ``stats``);
        returns the ``Assign`` effects of claims its model's new state frees (see the class)."""
        worker = self._worker(worker_id, message)
        if worker.capacity is None or worker.capacity.prefixes != message.prefixes:
            worker.prefixes = frozenset(message.prefixes)
        worker.capacity = message
        worker.last_heartbeat = at
        if message.model_state == "loaded":
            worker.asked.clear()
            worker.failed.clear()
        self._loads_ended(worker)
        return self._reoffer(worker.models)

    def claim(self, worker_id: str, message: Claim) -> list[Effect]:
        """The worker has ``message.count`` more free slots (for ``message.model``, or for any
        model it listed when the claim names none); returns the ``Assign`` effects: the oldest
        parked streams the claims may take, requeued ones first.

        Error handling: ``ProtocolError`` when the worker would then hold or wait for more
        streams than the ``max_inflight`` it attached with, or the claim names a model the
        worker did not list.
        """
        worker = self._worker(worker_id, message)
        model = message.model
        if model is not None and model not in worker.models:
            raise ProtocolError(
                f"worker {worker_id!r} claims for model {model!r}, which it did not list "
                f"(it serves {list(worker.models)})",
                message,
            )
        wanted = worker.waiting + len(worker.held) + message.count
        if wanted > worker.max_inflight:
            raise ProtocolError(
                f"worker {worker_id!r} claims {message.count} more streams, holding "
                f"{len(worker.held)} and waiting for {worker.waiting}, beyond its "
                f"max_inflight of {worker.max_inflight}",
                message,
            )
        worker.credits[model] = worker.credits.get(model, 0) + message.count
        effects: list[Effect] = []
        # Nobody else waits for these keys while streams are parked under them (streams go
        # to a waiting claimant at once), so the new claims take the oldest parked at once.
        self._routes.relist(worker, back=False)
        keys = tuple(
            key
            for key in self._routes.keys_for(worker, model)
            if not self._cold(worker, key) or self._claimant(key) == worker_id
        )
        for _ in range(message.count):
            stream_id = self._routes.take_oldest(keys)
            if stream_id is None:
                break
            effects.append(self._assign(self._streams[stream_id], worker))
        self._routes.relist(worker, back=False)
        return effects

    def withdraw(self, worker_id: str, count: int = 1, model: str | None = None) -> int:
        """Take back up to ``count`` unfilled claims (those for ``model`` when given, else
        claims without a model first, then any); returns how many were still unfilled."""
        worker = self._worker(worker_id, None)
        taken = 0
        for claim in (model,) if model is not None else (ANY_MODEL, *worker.credits):
            take = min(count - taken, worker.credits.get(claim, 0))
            if take:
                taken += take
                worker.credits[claim] -= take
                if not worker.credits[claim]:
                    del worker.credits[claim]
        self._routes.relist(worker, back=False)
        return taken

    def release(self, worker_id: str, stream_id: int) -> list[Effect]:
        """The worker gives back a stream it was assigned but will not serve.

        An ASSIGNED stream is requeued at the front (this does not count as an assignment);
        a CANCELLED one is acknowledged and forgotten. Error handling: ``ProtocolError`` if the
        worker does not hold it or has already sent its response head.
        """
        message = Release(stream_id)
        stream = self._held(worker_id, stream_id, message)
        if self._transition(stream, message) is not StreamState.PARKED:
            self._forget(stream)  # the acknowledgement of a Cancel
            return []
        stream.assignments -= 1
        self._requeue(stream)
        self._loads_ended(self._workers[worker_id])
        return self._offer([stream], fresh=False)

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
        cancelled = stream.state is StreamState.CANCELLED
        new = self._transition(stream, message)
        reoffered: list[Effect] = []
        if new in (StreamState.ENDED, StreamState.FAILED):
            self._forget(stream)
            self._loads_ended(self._workers[worker_id])
            if self._routes.parked(stream.key):  # a failed load's claims may be weighed again
                reoffered = self._reoffer((stream.key,))
        elif new is not stream.state:
            self._set_state(stream, new)
            stream.body = b""  # no requeue once responding
        return ([] if cancelled else [ToClient(message.stream_id, message)]) + reoffered

    def detach(self, worker_id: str, reason: str = "") -> list[Effect]:
        """The worker left or died. Returns what must happen to the streams it held.

        Streams without a response head are requeued (and may be assigned to another worker
        in the returned effects) until they have been assigned ``max_assignments`` times;
        the others get a ``ToClient`` ``ResponseError`` (the client sees WorkerFailedError).
        Cancelled streams it had not acknowledged are forgotten.
        """
        worker = self._worker(worker_id, Detach(reason))
        worker.credits.clear()
        self._routes.relist(worker, back=False)
        del self._workers[worker_id]
        because = f": {reason}" if reason else ""
        effects: list[Effect] = []
        requeued: list[_Stream] = []
        for stream_id in worker.held:
            stream = self._streams[stream_id]
            stream.worker_id = None
            if stream.state is StreamState.CANCELLED:
                self._forget(stream)
            elif stream.state is StreamState.ASSIGNED and stream.assignments < self.max_assignments:
                self._requeue(stream)
                requeued.append(stream)
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
        effects += self._offer(requeued, fresh=False)
        return effects + self._reoffer(worker.models)

    # -- internals -----------------------------------------------------------------------------

    def _worker(self, worker_id: str, message: Message | None) -> Worker:
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

    def _transition(self, stream: _Stream, message: ResponseMessage | Release) -> StreamState:
        """The state ``message`` moves ``stream`` to (``TRANSITIONS``); changes nothing.

        Error handling: ``ProtocolError`` when the message is illegal in the stream's state.
        """
        new = TRANSITIONS.get(stream.state, {}).get(type(message))
        if new is None:
            if isinstance(message, Release):
                raise ProtocolError(
                    f"stream {message.stream_id} cannot be released once its response has started",
                    message,
                )
            raise ProtocolError(
                f"{type(message).__name__} is illegal on stream {message.stream_id} in state "
                f"{stream.state.name}",
                message,
            )
        return new

    def _set_state(self, stream: _Stream, state: StreamState) -> None:
        self._counts[stream.state] -= 1
        self._counts[state] += 1
        stream.state = state

    def _forget(self, stream: _Stream) -> None:
        self._counts[stream.state] -= 1
        del self._streams[stream.stream_id]
        if stream.worker_id is not None:
            self._workers[stream.worker_id].held.pop(stream.stream_id, None)

    def _unqueue(self, stream: _Stream) -> None:
        self._routes.remove(stream.stream_id, stream.key)

    def _requeue(self, stream: _Stream) -> None:
        """Park ``stream`` again (``_offer`` then queues it at the front of its key's line)."""
        if stream.worker_id is not None:
            self._workers[stream.worker_id].held.pop(stream.stream_id, None)
            stream.worker_id = None
        self._set_state(stream, StreamState.PARKED)

    def _assign(self, stream: _Stream, worker: Worker) -> Effect:
        if self._cold(worker, stream.key):
            worker.asked.add(stream.key)  # asked to load it
        self._set_state(stream, StreamState.ASSIGNED)
        stream.worker_id = worker.worker_id
        stream.assignments += 1
        worker.spend(stream.key)
        worker.held[stream.stream_id] = None
        self._routes.relist(worker, back=True)  # to the back of the line
        return ToWorker(worker.worker_id, Assign(stream.stream_id, stream.head, stream.body))

    def _offer(self, streams: list[_Stream], *, fresh: bool) -> list[Effect]:
        """Give each parked stream (oldest first) to the claimant whose turn it is for its
        key, or queue it: fresh ones at the back, requeued ones before every fresh one."""
        effects: list[Effect] = []
        for stream in sorted(streams, key=lambda stream: stream.stream_id):
            worker_id = self._claimant(stream.key, stream.prefixes)
            if worker_id is not None:
                effects.append(self._assign(stream, self._workers[worker_id]))
            else:
                self._routes.enqueue(stream.stream_id, stream.key, fresh=fresh)
        return effects

    def _cold(self, worker: Worker, key: str) -> bool:
        """Whether ``worker`` states ``key`` unloaded and holds none of its streams."""
        beat = worker.capacity
        if not key or key not in worker.models or beat is None or beat.model_state != "unloaded":
            return False
        return not any(self._streams[stream_id].key == key for stream_id in worker.held)

    def _loads_ended(self, worker: Worker) -> None:
        """Note the loads ``worker`` was asked for that failed: it is cold again for the key
        without having stated it loaded (see the class)."""
        for key in [key for key in worker.asked if self._cold(worker, key)]:
            worker.asked.discard(key)
            self._failed_loads += 1
            worker.failed[key] = self._failed_loads

    def _claimant(self, key: str, prefixes: tuple[tuple[str, int], ...] = ()) -> str | None:
        """The claimant a stream of ``key`` (whose prompt begins with ``prefixes``) goes to
        now (see the class), if any."""
        listing = [worker for worker in self._workers.values() if key in worker.models]
        cold = {worker.worker_id for worker in listing if self._cold(worker, key)}
        if not cold:
            return self._routes.claimant(key, self._affinity(key, prefixes))
        warm = len(cold) < len(listing)

        def rank(worker_id: str) -> Rank | None:
            if worker_id not in cold:
                return (-math.inf, -math.inf)
            if warm:
                return None
            worker = self._workers[worker_id]
            free = worker.capacity.free_bytes if worker.capacity is not None else 0
            # Those that never failed to load it first (0), then the oldest failure; then
            # the most free budget (-1: no bound).
            return (worker.failed.get(key, 0), -math.inf if free < 0 else -free)

        return self._routes.claimant(key, rank)

    def _affinity(
        self, key: str, prefixes: tuple[tuple[str, int], ...]
    ) -> Callable[[str], Rank] | None:
        """How claimants rank for a stream whose prompt begins with ``prefixes`` (see the
        class: prefix affinity); ``None`` (round-robin) when no claimant holds any of them."""
        if not prefixes:
            return None
        claimants = self._routes.claimants(key)
        held = {worker_id: self._workers[worker_id].holds(prefixes) for worker_id in claimants}
        if not any(held.values()):
            return None
        busy = {worker_id: len(self._workers[worker_id].held) for worker_id in claimants}
        least = min(busy.values())

        def rank(worker_id: str) -> Rank:
            idle_enough = busy[worker_id] <= least + self.affinity_slack
            return (0.0 if idle_enough else 1.0, -float(held[worker_id]))

        return rank

    def _reoffer(self, keys: Iterable[str]) -> list[Effect]:
        """Assign the streams parked under ``keys`` that a held claim may now take."""
        effects: list[Effect] = []
        for key in keys:
            while self._routes.parked(key) and (worker_id := self._claimant(key)) is not None:
                stream_id = self._routes.take_oldest((key,))
                assert stream_id is not None
                effects.append(self._assign(self._streams[stream_id], self._workers[worker_id]))
        return effects
