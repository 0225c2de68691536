"""Kubernetes-style probes, answered the same way by an ingress (on its public port) and by a
worker (on its ``--metrics-port``): pure, no I/O.

- ``GET /livez``: 200 ``ok`` whenever the process's event loop answers at all (the probe is
  served by that loop, so a wedged loop fails it by not answering).
- ``GET /readyz``: 200 ``ok`` when the process should get work, else 503 ``not ready: WHY``.
  An ingress is ready while it listens and is not draining; a worker once its model is loaded
  and it is attached to at least one ingress, until it drains.

``/health`` (the ingress's JSON status page) is unchanged: it also answers 503 while no worker
is attached, which is no reason to take an ingress out of a load balancer.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

__all__ = ["LIVEZ_PATH", "PROBE_PATHS", "READYZ_PATH", "NotReady", "ProbeAnswer", "answer_probe"]

LIVEZ_PATH = "/livez"
READYZ_PATH = "/readyz"
PROBE_PATHS = frozenset({LIVEZ_PATH, READYZ_PATH})

#: Why the process is not ready now (``None``: ready); asked at each ``/readyz``.
NotReady = Callable[[], str | None]


@attrs.frozen
class ProbeAnswer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def answer_probe(path: str, not_ready: NotReady) -> ProbeAnswer:
    """The answer to ``GET path`` (one of :data:`PROBE_PATHS`)."""
    if path == LIVEZ_PATH:
        return ProbeAnswer(200, b"ok\n")
    if path != READYZ_PATH:
        raise ValueError(f"{path!r} is not a probe")
    why = not_ready()
    if why is None:
        return ProbeAnswer(200, b"ok\n")
    return ProbeAnswer(503, f"not ready: {why}\n".encode())
