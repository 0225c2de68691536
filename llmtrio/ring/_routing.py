"""The ring's routing table (sans-IO, used by ``RingCore`` alone): the parked streams of each
routing key, oldest first, and the line of waiting claimants of each key, round-robin.

A claim names a model, or none (``ANY_MODEL``: a worker of the previous version, or one listing
several models on one link): a claim for a model takes streams parked under that key (or under
no key); a claim for none takes any model its worker listed (any at all when it listed none).
A worker stands in the line of every key its unfilled claims may take, with the turn it took
its place at, so that the lines of two keys (a key and ``ANY_LINE``) merge in one order.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._messages import Heartbeat

__all__ = ["ANY_LINE", "ANY_MODEL", "Queue", "Rank", "Routes", "Worker"]

#: A claimant's rank among those a stream may go to: the lowest goes first (then by turn).
Rank = tuple[float, float]
_FIRST: Final[Rank] = (0.0, 0.0)

ANY_MODEL: Final = None
"""A claim's model when it names none (a worker of the previous version): any model the
worker listed, or any at all when it listed none."""


@attrs.define
class Worker:
    worker_id: str
    max_inflight: int
    models: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    vision: tuple[str, ...] = ()  # the models that take images
    contexts: tuple[int, ...] = ()  # each model's context length (0 or empty: not stated)
    audio: tuple[str, ...] = ()  # the models that take audio
    credits: dict[str | None, int] = attrs.field(factory=dict)  # claim model -> unfilled claims
    standing: tuple[str, ...] = ()  # the lines of claimants it stands in
    held: dict[int, None] = attrs.field(factory=dict)  # an ordered set of stream ids
    capacity: Heartbeat | None = None  # its last heartbeat
    last_heartbeat: float | None = None
    # Models on demand: the keys it was asked to load (assigned one of their streams while
    # it stated them unloaded) and has not stated loaded since; and, by key, the ring's
    # count of failed loads when its own last load of that key failed.
    asked: set[str] = attrs.field(factory=set)
    failed: dict[str, int] = attrs.field(factory=dict)
    #: The prefix digests its last heartbeat stated (prefix affinity).
    prefixes: frozenset[str] = frozenset()

    @property
    def waiting(self) -> int:
        return sum(self.credits.values())

    def serves(self, key: str) -> bool:
        """Whether a claim without a model may take a stream parked under ``key``."""
        return not key or not self.models or key in self.models

    def holds(self, prefixes: tuple[tuple[str, int], ...]) -> int:
        """The size of the longest of ``prefixes`` (``(digest, size)`` pairs) it holds; 0:
        none."""
        held = self.prefixes
        return max((size for digest, size in prefixes if digest in held), default=0)

    def spend(self, key: str) -> None:
        """Fill one claim with a stream parked under ``key``: one for ``key`` itself first,
        then one without a model, then (for a stream with no key) any."""
        for model in (key or ANY_MODEL, ANY_MODEL, *self.credits):
            if self.credits.get(model, 0) and (model is ANY_MODEL or not key or model == key):
                self.credits[model] -= 1
                if not self.credits[model]:
                    del self.credits[model]
                return
        raise AssertionError(f"worker {self.worker_id!r} has no claim for {key!r}")

    def lines(self) -> tuple[str, ...]:
        """The routing keys whose line of claimants this worker stands in."""
        keys = dict.fromkeys(model for model in self.credits if model is not ANY_MODEL)
        if self.credits.get(ANY_MODEL):
            keys.update(dict.fromkeys(self.models or (ANY_LINE,)))
        return tuple(keys)


ANY_LINE: Final = ""
"""The line of the claimants that take any key: workers that listed no model."""


@attrs.define
class Queue:
    """The streams parked under one routing key: requeued ones (sorted) before fresh ones
    (in arrival order). Stream ids grow with arrival, so both are oldest first."""

    fresh: dict[int, None] = attrs.field(factory=dict)
    requeued: list[int] = attrs.field(factory=list)

    def __bool__(self) -> bool:
        return bool(self.fresh or self.requeued)

    def head(self) -> tuple[bool, int]:
        """(fresh?, stream id) of the stream to go first: sorts requeued before fresh."""
        if self.requeued:
            return False, self.requeued[0]
        return True, next(iter(self.fresh))

    def pop(self) -> int:
        if self.requeued:
            return self.requeued.pop(0)
        stream_id = next(iter(self.fresh))
        del self.fresh[stream_id]
        return stream_id

    def remove(self, stream_id: int) -> None:
        if stream_id in self.fresh:
            del self.fresh[stream_id]
        else:
            self.requeued.remove(stream_id)


@attrs.define
class Routes:
    """Parked streams by routing key and waiting claimants by routing key; see the module."""

    _queues: dict[str, Queue] = attrs.field(factory=dict)  # routing key -> parked streams
    # Routing key -> the workers whose claims a stream of that key may fill, in round-robin
    # order, each with the turn it took its place at (to merge two lines in one order).
    _lines: dict[str, dict[str, int]] = attrs.field(factory=dict)
    _turn: int = 0

    def enqueue(self, stream_id: int, key: str, *, fresh: bool) -> None:
        """Park ``stream_id`` under ``key``: a fresh stream at the back; a requeued one before
        every fresh one (stream ids grow with arrival and assignment is FIFO, so every
        requeued stream arrived before every fresh one: keeping them sorted keeps it FIFO)."""
        queue = self._queues.setdefault(key, Queue())
        if fresh:
            queue.fresh[stream_id] = None
        else:
            bisect.insort(queue.requeued, stream_id)

    def remove(self, stream_id: int, key: str) -> None:
        self._queues[key].remove(stream_id)
        if not self._queues[key]:
            del self._queues[key]

    def take_oldest(self, keys: tuple[str, ...]) -> int | None:
        """Unpark the oldest stream under any of ``keys`` (requeued ones first), if any."""
        found = [(queue.head(), key) for key in keys if (queue := self._queues.get(key))]
        if not found:
            return None
        _, key = min(found)
        stream_id = self._queues[key].pop()
        if not self._queues[key]:
            del self._queues[key]
        return stream_id

    def keys_for(self, worker: Worker, model: str | None) -> tuple[str, ...]:
        """The routing keys whose parked streams a claim of ``worker`` for ``model`` takes."""
        if model is not None:
            return (model, "")
        if worker.models:
            return (*worker.models, "")
        return tuple(self._queues)

    def claimant(self, key: str, rank: Callable[[str], Rank | None] | None = None) -> str | None:
        """The worker whose turn it is among those with a claim a stream of ``key`` fills;
        with ``rank``, the one of the lowest rank (``None``: passed over), then by turn."""
        lines = (self._lines.get(key), self._lines.get(ANY_LINE)) if key else self._lines.values()
        first: tuple[Rank, int, str] | None = None
        for line in lines:
            for worker_id, turn in line.items() if line else ():
                order = _FIRST if rank is None else rank(worker_id)
                if order is not None and (first is None or (order, turn) < first[:2]):
                    first = (order, turn, worker_id)
                if rank is None:
                    break  # a line is in turn order: its first is its best
        return None if first is None else first[2]

    def claimants(self, key: str) -> list[str]:
        """Every worker with a claim a stream of ``key`` fills (no order)."""
        lines = (self._lines.get(key), self._lines.get(ANY_LINE)) if key else self._lines.values()
        return list(dict.fromkeys(worker_id for line in lines if line for worker_id in line))

    def parked(self, key: str) -> bool:
        """Whether a stream is parked under ``key``."""
        return key in self._queues

    def relist(self, worker: Worker, *, back: bool) -> None:
        """Put ``worker`` in the lines its claims now stand in (``back``: at their backs,
        after it took a stream; else it keeps its place where it already stood)."""
        wanted = worker.lines()
        for key in worker.standing:
            if back or key not in wanted:
                line = self._lines[key]
                del line[worker.worker_id]
                if not line:
                    del self._lines[key]
        turn = self._turn
        self._turn += 1
        for key in wanted:
            self._lines.setdefault(key, {}).setdefault(worker.worker_id, turn)
        worker.standing = wanted
