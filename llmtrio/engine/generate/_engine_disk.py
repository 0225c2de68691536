"""The engine's prompt cache on disk (:class:`DiskMethods`, a part of :class:`Engine`): the
files opened before the decode thread starts and written beside it until it has stopped
(``_disk_tier.DiskTier``), and the Trio side's looks at them for a request's prompt."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import trio

from .._config import EngineConfig
from .._errors import ModelLoadError
from .._stats import EngineStats
from .._types import GenerateRequest
from ..llama import LlamaModel
from ._core import EngineCore
from ._disk_tier import DiskTier
from ._step import Offered

__all__ = ["DiskMethods"]

logger = logging.getLogger("llmtrio.engine")


class DiskMethods:
    """The disk part of :class:`Engine` (which sets the attributes declared here); first
    among its bases, so its ``_aside`` and ``_after_loop`` are the decode loop's hooks."""

    config: EngineConfig
    model_path: Path
    stats: EngineStats
    _model: LlamaModel
    _disk: DiskTier | None
    _core: EngineCore | None

    if TYPE_CHECKING:

        def _post_soon(self, deliver: Callable[[Any], None], results: Any) -> None: ...

    async def _aside(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The prompt cache's files (``cache_dir``): opened (the folder scanned) before the
        decode thread starts, then written, until the decode thread has stopped and what it
        handed over is written (see ``_disk_tier``).

        Error handling: :class:`ModelLoadError` when the folder cannot be made or read."""
        config = self.config
        if config.cache_dir is None or not config.prompt_cache:
            task_status.started()
            return
        try:
            disk = await trio.to_thread.run_sync(
                DiskTier.open, config, self._model, self.model_path, self.stats, self._post_soon
            )
        except OSError as exc:
            raise ModelLoadError(
                f"cannot keep the prompt cache in {config.cache_dir}: {exc.strerror or exc}"
            ) from exc
        self._disk = disk
        logger.info(
            "prompt cache on disk: %s, %d files of %d MiB (budget %d MiB)",
            disk.store.folder,
            disk.store.entries,
            disk.store.bytes_used >> 20,
            config.cache_disk_mib,
        )
        task_status.started()
        await disk.write_until_closed()

    def _after_loop(self) -> None:
        if self._disk is not None:
            self._disk.close()

    def _on_disk(self, prompt: list[int]) -> int:
        """How many of ``prompt``'s tokens a file on disk serves (no I/O; 0 without files)."""
        disk = self._disk
        if disk is None:
            return 0
        found = disk.store.best(np.asarray(prompt, dtype=np.int32), len(prompt) - 1, room=disk.room)
        return found.keep if found is not None else 0

    async def _look_on_disk(
        self, prompt: npt.NDArray[np.int32], request: GenerateRequest
    ) -> Offered | None:
        """A snapshot of ``prompt``'s prefix read from disk, when the files serve more of it
        than memory does (as the decode thread last published); ``None`` otherwise."""
        disk, core = self._disk, self._core
        if disk is None or not request.cache_prompt:
            return None
        limit = len(prompt) - 1  # at least one token is ingested, for its logits
        memory = disk.memory_serves(core.held if core is not None else (), prompt, limit)
        return await disk.lookup(prompt, limit, memory)
