"""Snapshots of a ring for ``/health``, ``/metrics`` and tests: values, no state."""

from __future__ import annotations

import attrs

from ._messages import CHAT_MODEL, Heartbeat

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
