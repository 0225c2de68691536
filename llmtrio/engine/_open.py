"""Opening whichever engine a model needs (:func:`open_engine`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ._config import EngineConfig
from .embed import EmbeddingEngine
from .generate import Engine
from .models import model_kind_of, resolve_model

__all__ = ["open_engine"]


@asynccontextmanager
async def open_engine(config: EngineConfig) -> AsyncIterator[Engine | EmbeddingEngine]:
    """The engine ``config``'s model needs, opened: an :class:`EmbeddingEngine` for a model
    whose GGUF names a sentence pooling, an :class:`Engine` for any other (``.kind`` says
    which).

    Error handling and resource handling: as the engine's ``open``."""
    resolved = await trio.to_thread.run_sync(resolve_model, config, abandon_on_cancel=True)
    if await trio.to_thread.run_sync(model_kind_of, resolved.path) == "embedding":
        async with EmbeddingEngine.open(config) as embedding:
            yield embedding
    else:
        async with Engine.open(config) as engine:
            yield engine
