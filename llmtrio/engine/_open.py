"""Opening whichever engine a model needs (:func:`open_engine`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ._config import EngineConfig
from .embed import EmbeddingEngine, RerankEngine
from .generate import Engine
from .models import model_kind_of, resolve_model

__all__ = ["open_engine"]


@asynccontextmanager
async def open_engine(config: EngineConfig) -> AsyncIterator[Engine | EmbeddingEngine]:
    """The engine ``config``'s model needs, opened: an :class:`EmbeddingEngine` for a model
    whose GGUF names a sentence pooling, a :class:`RerankEngine` (an embedding engine too)
    for one that names rank pooling, an :class:`Engine` for any other (``.kind`` says
    which).

    Error handling and resource handling: as the engine's ``open``."""
    resolved = await trio.to_thread.run_sync(resolve_model, config, abandon_on_cancel=True)
    kind = await trio.to_thread.run_sync(model_kind_of, resolved.path)
    if kind == "embedding":
        async with EmbeddingEngine.open(config) as embedding:
            yield embedding
    elif kind == "rerank":
        async with RerankEngine.open(config) as rerank:
            yield rerank
    else:
        async with Engine.open(config) as engine:
            yield engine
