"""The ingress's probes, ``GET /livez`` and ``GET /readyz`` (``llmtrio.api._probes``), as routes
of the app: ready while listening and not draining; open without an API key."""

from __future__ import annotations

from quart import Response
from quart_trio import QuartTrio

from ..api import LIVEZ_PATH, READYZ_PATH, NotReady, ProbeAnswer, answer_probe

__all__ = ["add_probes"]


def _response(answer: ProbeAnswer) -> Response:
    return Response(answer.body, status=answer.status, content_type=answer.content_type)


def add_probes(app: QuartTrio, not_ready: NotReady) -> None:
    """Serve the probes on ``app``, asking ``not_ready`` at each ``/readyz``."""

    @app.get(LIVEZ_PATH)
    async def livez() -> Response:
        return _response(answer_probe(LIVEZ_PATH, not_ready))

    @app.get(READYZ_PATH)
    async def readyz() -> Response:
        return _response(answer_probe(READYZ_PATH, not_ready))
