"""``POST /models/load`` and ``/models/unload`` on a worker: the ingress has routed them by
their ``model``, a name the ring knows (never a path), to a worker that lists it."""

from __future__ import annotations

from typing import Final

from ..api import MODELS_LOAD_PATH, MODELS_UNLOAD_PATH, OpenAIError, dumps, invalid_request
from ..ring import ClaimedStream
from ._pipeline import JSON_HEADERS

__all__ = ["MANAGE_PATHS", "answer_pinned", "path_of", "respond_error", "respond_state"]

MANAGE_PATHS: Final = frozenset({MODELS_LOAD_PATH, MODELS_UNLOAD_PATH})


def path_of(claimed: ClaimedStream) -> str:
    return claimed.head.path.split("?", 1)[0]


async def respond_state(claimed: ClaimedStream, model: str, state: str) -> None:
    """200 with the model's state (llama.cpp's router answers ``{"success": true}``)."""
    body = dumps({"success": True, "model": model, "state": state})
    await claimed.respond(200, JSON_HEADERS, body)


async def respond_error(claimed: ClaimedStream, error: OpenAIError) -> None:
    await claimed.respond(error.status, (*JSON_HEADERS, *error.headers), error.body())


async def answer_pinned(claimed: ClaimedStream, model: str) -> None:
    """A load or unload of a model loaded at start (``--model``): loaded already; never
    unloaded."""
    if path_of(claimed) == MODELS_LOAD_PATH:
        await respond_state(claimed, model, "loaded")
        return
    await respond_error(claimed, pinned(model))


def pinned(model: str) -> OpenAIError:
    return invalid_request(
        f"The model {model!r} is pinned (--model, or keep_alive = -1): it is never unloaded.",
        param="model",
    )
