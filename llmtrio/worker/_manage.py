"""``POST /models/load`` and ``/models/unload`` on a worker: the ingress has routed them by
their ``model``, a name the ring knows (never a path), to a worker that lists it. The answers
a link gives for its model (``_link``): its state, or a refusal."""

from __future__ import annotations

from ..api import ApiError, dumps, error_family, invalid_request
from ..ring import ClaimedStream
from ._pipeline import JSON_HEADERS

__all__ = ["path_of", "pinned", "respond_error", "respond_state"]


def path_of(claimed: ClaimedStream) -> str:
    return claimed.head.path.split("?", 1)[0]


async def respond_state(claimed: ClaimedStream, model: str, state: str) -> None:
    """200 with the model's state (llama.cpp's router answers ``{"success": true}``)."""
    body = dumps({"success": True, "model": model, "state": state})
    await claimed.respond(200, JSON_HEADERS, body)


async def respond_error(claimed: ClaimedStream, error: ApiError) -> None:
    """``error`` as the whole response, told as the claimed path's route tells its errors
    (``llmtrio.api.error_family``)."""
    await claimed.respond(*error_family(path_of(claimed)).response(error))


def pinned(model: str) -> ApiError:
    return invalid_request(
        f"The model {model!r} is pinned (--model, or keep_alive = -1): it is never unloaded.",
        param="model",
    )
