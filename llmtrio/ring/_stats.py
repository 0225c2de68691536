"""Snapshots of a ring for ``/health``, ``/metrics`` and tests: values, no state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from ._messages import CHAT_MODEL, Heartbeat

if TYPE_CHECKING:
    from ._routing import Worker

__all__ = ["ModelStats", "RingStats", "WorkerStats"]


@attrs.frozen
class WorkerStats:
    """One attached worker: its declared bound, what it waits for, what it holds."""

    worker_id: str
    max_inflight: int
    models: tuple[str, ...]
    """The models it serves, as it said when attaching."""
    waiting_claims: int
    """Slots it has claimed that no stream has filled yet."""
    held: tuple[int, ...]
    """Stream ids it holds: assigned, responding, or cancelled and not yet acknowledged."""
    capacity: Heartbeat | None
    """Its last heartbeat, if any."""
    last_heartbeat: float | None = None
    """When its last heartbeat came, on the clock the caller passed to ``heartbeat``."""
    kinds: tuple[str, ...] = ()
    """Each model's kind, in the order of ``models`` (empty: all chat), as it attached."""
    claims: tuple[tuple[str | None, int], ...] = ()
    """Its unfilled claims by the model they name (``None``: any model it listed)."""

    def kind(self, model: str) -> str:
        """The kind of ``model``, one of ``models``: ``"chat"`` unless ``kinds`` says else."""
        if self.kinds and model in self.models:
            return self.kinds[self.models.index(model)]
        return CHAT_MODEL


@attrs.frozen
class ModelStats:
    """One model the ring routes to: its name, its kind and how many workers serve it now."""

    name: str
    kind: str
    """``"chat"`` (chat and text completions) or ``"embedding"``."""
    workers: int
    state: str = "loaded"
    """``loaded`` on some worker, else ``loading`` on one, else ``unloaded`` (every worker
    listing it loads it on demand and none has it loaded)."""
    bytes: int = 0
    """The estimated memory of its loaded copies (0: not stated)."""
    unload_in_s: int = 0
    """Seconds until its last loaded copy unloads when idle: -1 never, 0 not stated."""
    vision: bool = False
    """Whether it takes images (as its first worker said)."""
    context_length: int = 0
    """The most tokens one request may use (prompt and output), the least its workers stated
    (0: not stated)."""
    audio: bool = False
    """Whether it takes audio (as its first worker said)."""
    parent: str | None = None
    """A LoRA adapter's base model (as its first worker said); ``None``: a model."""


@attrs.frozen
class RingStats:
    """A snapshot of the ring: stream counts by state and every attached worker."""

    max_streams: int
    parked: int
    assigned: int
    responding: int
    cancelling: int
    """Cancelled streams their worker has not acknowledged yet (not counted as open)."""
    workers: tuple[WorkerStats, ...]

    @property
    def serving(self) -> int:
        """Streams a worker holds and their client still waits for."""
        return self.assigned + self.responding

    @property
    def open(self) -> int:
        """Streams counted against ``max_streams``."""
        return self.parked + self.serving

    @property
    def tracked(self) -> int:
        """Every stream the core remembers; zero once all streams are finished."""
        return self.open + self.cancelling


def model_stats(workers: Iterable[Worker]) -> dict[str, ModelStats]:
    """Every model the ``workers`` listed, by name, in attach order, each worker's LoRA
    adapters after its models (with their base as ``parent``): its kind (as its first
    worker said), how many workers serve it, and its context length (the least its
    workers stated; an adapter's: its base's)."""
    models: dict[str, ModelStats] = {}
    order = ("unloaded", "loading", "loaded")
    for worker in workers:
        beat = worker.capacity
        own = (beat.model_state if beat else "") or "loaded"
        size = beat.model_bytes if beat and own == "loaded" else 0
        until = beat.unload_in_s if beat and own == "loaded" else 0
        for index, name in enumerate(worker.names):
            known = models.get(name)
            adapter = index >= len(worker.models)
            kind = worker.kinds[index] if worker.kinds and not adapter else CHAT_MODEL
            parent = worker.models[0] if adapter else None
            own_name = parent or name  # an adapter takes what its base takes
            vision, audio = own_name in worker.vision, own_name in worker.audio
            at = 0 if adapter else index
            context = worker.contexts[at] if worker.contexts else 0
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
                    parent=parent,
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
                parent=known.parent,
                # What every worker serving it takes: the least stated.
                context_length=min((n for n in (context, known.context_length) if n), default=0),
            )
    return models


def worker_stats(worker: Worker) -> WorkerStats:
    """A snapshot of one attached worker."""
    return WorkerStats(
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
