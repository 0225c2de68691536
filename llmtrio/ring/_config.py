"""The settings an ingress gives its ring: ``RingConfig``."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["RingConfig"]  # default() serves the ring room


@attrs.frozen
class RingConfig:
    """A ring's settings, and the one home of their defaults (``Ring`` and ``RingCore``
    read theirs from here).

    ``max_streams`` bounds the open streams (parked or being served); a request beyond it
    is refused at once (the ingress answers 503 with ``Retry-After: retry_after``).
    ``park_timeout`` is how many seconds a request may stay parked, claimed by no worker,
    before it is cancelled (503); ``None`` lets it wait as long as its client does (a
    ``Ring`` built directly waits so; an ingress gives 30 s). ``response_buffer`` is how many
    body chunks a worker in this process may write ahead of its client. ``max_assignments``
    is how many times a stream is handed to a worker that then detaches before its response
    head. ``Ring.from_config`` builds a ring with these settings.

    Error handling: ``ValueError`` naming the field for a value out of range.
    """

    max_streams: int = 64
    park_timeout: float | None = 30.0
    retry_after: float = 1.0
    response_buffer: int = 16
    max_assignments: int = 3

    def __attrs_post_init__(self) -> None:
        for name in ("max_streams", "response_buffer", "max_assignments"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.park_timeout is not None and not self.park_timeout > 0:
            raise ValueError(f"park_timeout must be more than 0, not {self.park_timeout}")
        if not self.retry_after >= 0:
            raise ValueError(f"retry_after must be 0 or more, not {self.retry_after}")


def default(name: str) -> Any:
    """``RingConfig``'s default for the field ``name``."""
    return attrs.fields_dict(RingConfig)[name].default
