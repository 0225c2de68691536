"""The prompt cache's disk tier, as one engine uses it (``EngineConfig.cache_dir``).

Three sides, one object (:class:`DiskTier`):

- the frontend (Trio), before a request goes to the decode thread: when the files on disk
  serve more of its prompt than host memory does (the slots and snapshots the decode thread
  last published), the file is read and checked in a worker thread and handed to the decode
  thread with the request (:class:`Offered`), which restores it into the slot instead of
  ingesting the prefix (the prompt cache's policy picks it: ``OFFERED``);
- the decode thread: a snapshot the prompt cache evicts from host memory (or cannot keep
  there) is handed over as it is, and when the engine closes (a model unloaded, a server
  drained) each idle slot's memory is copied out once and every snapshot in host memory is
  handed over, unless a file already serves it; the thread never writes a file;
- the writer task (Trio, beside the decode thread, in the engine's nursery): writes what it
  is handed, one file at a time in a worker thread. While it is more than ``max_pending``
  bytes behind, what the prompt cache evicts is dropped (counted) rather than queued; what
  the engine hands over as it closes is always written, within ``DRAIN_S`` even when the
  engine's owner is cancelled.

So a step waits at most for one snapshot's copy (``llama_state_seq_get_data``), never for
the disk.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import trio

from .._config import EngineConfig
from .._stats import EngineStats
from ..llama import STATE_FORMAT, LlamaModel
from ..models import file_identity
from ..snapshots import SnapshotKey, SnapshotStore, Tokens, reusable
from ._drafting import cut_anywhere
from ._step import Buffer, Offered

__all__ = ["DRAIN_S", "DiskTier", "snapshot_key"]

logger = logging.getLogger("llmtrio.engine")

#: The longest the writer goes on writing what the engine handed over as it closed, once its
#: owner is cancelled.
DRAIN_S: Final = 60.0


def snapshot_key(config: EngineConfig, model: LlamaModel, model_path: Path) -> SnapshotKey:
    """What a snapshot of ``model``'s state depends on beside its tokens (see
    ``SnapshotKey``). Reads the model file's header and samples (and the projector's).

    Error handling: ``OSError`` when a file cannot be read."""
    projector = model.projector.path if model.projector is not None else None
    settings: dict[str, object] = {
        "type_k": config.cache_type_k,
        "type_v": config.cache_type_v,
        "flash_attn": config.flash_attn,
        "swa_full": model.swa_full,
        "kv_unified": model.kv_unified,
        "n_rs_seq": model.n_rs_seq,
        "projector": file_identity(projector) if projector is not None else "",
    }
    return SnapshotKey.of(file_identity(model_path), STATE_FORMAT, settings)


class DiskTier:
    """One engine's snapshot files and their writer (see the module).

    ``post(fn, value)`` runs ``fn(value)`` on the Trio side, soon (the engine's
    ``_post_soon``): how the decode thread hands snapshots over.
    """

    def __init__(
        self,
        store: SnapshotStore,
        stats: EngineStats,
        post: Callable[[Callable[[Any], None], Any], None],
        *,
        max_pending: int,
        room: int | None = None,
    ) -> None:
        self.store = store
        #: A slot's context: a file of more tokens is not restored.
        self.room = room
        self._stats = stats
        self._post = post
        self._max_pending = max_pending
        self._pending = 0
        self._send, self._receive = trio.open_memory_channel[tuple[Tokens, Buffer]](math.inf)
        self._count()

    @classmethod
    def open(
        cls,
        config: EngineConfig,
        model: LlamaModel,
        model_path: Path,
        stats: EngineStats,
        post: Callable[[Callable[[Any], None], Any], None],
    ) -> DiskTier:
        """The tier of ``config.cache_dir`` for ``model``, its folder scanned (files that are
        not this model's to restore are removed). Blocking: run it in a thread.

        Error handling: ``OSError`` when the folder cannot be made or read."""
        assert config.cache_dir is not None
        store = SnapshotStore(
            config.cache_dir,
            snapshot_key(config, model, model_path),
            config.cache_disk_mib * 2**20,
            cut_anywhere=cut_anywhere(model),
        )
        store.scan()
        return cls(
            store,
            stats,
            post,
            max_pending=max(config.cache_ram_mib, 1024) * 2**20,
            room=config.request_ctx,
        )

    # -- the frontend ------------------------------------------------------------------------

    def memory_serves(self, held: tuple[Tokens, ...], prompt: Tokens, limit: int) -> int:
        """How much of ``prompt`` (at most ``limit``) memory holding each of ``held`` serves."""
        cut = self.store.cut_anywhere
        return max((reusable(h, prompt, limit, cut_anywhere=cut) for h in held), default=0)

    async def lookup(self, prompt: Tokens, limit: int, memory: int) -> Offered | None:
        """The file serving most of ``prompt`` (at most ``limit`` tokens), read and checked
        in a worker thread, when it serves more than the ``memory`` tokens host memory does;
        ``None`` when none does (a miss), or its file is gone or refused."""
        if limit <= memory:
            return None
        store = self.store
        if store.changed():  # another process wrote or removed a file
            try:
                await trio.to_thread.run_sync(store.scan)
            except OSError as exc:
                logger.warning("prompt cache: cannot scan %s: %s", store.folder, exc)
        found = store.best(prompt, limit, longer_than=memory, room=self.room)
        loaded = None if found is None else await trio.to_thread.run_sync(store.read, found)
        self._count()
        if loaded is None:
            self._stats.disk_misses += 1
            return None
        return Offered(loaded.tokens, loaded.data, loaded.seconds)

    # -- the decode thread ---------------------------------------------------------------------

    def covers(self, tokens: Tokens) -> bool:
        """Whether a file already serves every prefix a snapshot after ``tokens`` would."""
        return self.store.covers(tokens)

    def spill(self, tokens: Tokens, data: Buffer, *, closing: bool = False) -> None:
        """Hand a snapshot over to the writer (from the decode thread): written unless a
        file serves it already; dropped, unless ``closing``, while the writer is behind."""
        self._post(self._queue, (tokens, data, closing))

    # -- the writer ------------------------------------------------------------------------

    def _queue(self, item: tuple[Tokens, Buffer, bool]) -> None:
        tokens, data, closing = item
        if not closing and self._pending + len(data) > self._max_pending:
            self._stats.disk_dropped += 1
            return
        self._pending += len(data)
        try:
            self._send.send_nowait((tokens, data))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._pending -= len(data)
            self._stats.disk_dropped += 1

    def close(self) -> None:
        """No more snapshots come (the decode thread has stopped): the writer ends once it
        has written what it was handed."""
        self._send.close()

    async def write_until_closed(self) -> None:
        """Write what is handed over, until :meth:`close`. Resource handling: cancelled, it
        still writes what was handed over (and what comes until :meth:`close`), shielded, for
        at most ``DRAIN_S``."""
        try:
            async for tokens, data in self._receive:
                await self._write(tokens, data)
        finally:
            with trio.move_on_after(DRAIN_S, shield=True):
                async for tokens, data in self._receive:
                    await self._write(tokens, data)

    async def _write(self, tokens: Tokens, data: Buffer) -> None:
        """Write one snapshot; a fault is logged and costs that snapshot only (the engine
        goes on serving)."""
        try:
            await trio.to_thread.run_sync(self.store.write, tokens, data)
        except Exception:
            logger.exception("prompt cache: a snapshot of %d tokens not written", len(tokens))
        finally:
            self._pending -= len(data)
            self._count()

    def _count(self) -> None:
        stats, store = self._stats, self.store.stats
        stats.disk_writes = store.written
        stats.disk_written_bytes = store.written_bytes
        stats.disk_evictions = store.evicted
        stats.disk_refused = store.refused
        stats.disk_bytes = self.store.bytes_used
        stats.disk_entries = self.store.entries
