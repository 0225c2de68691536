"""The prompt cache's decisions carried out (:class:`PromptReuse`, a part of
:class:`EngineCore`): a sequence admitted into the slot the cache chose, its prefix kept or
restored (from host memory or a file read from disk), snapshots saved and spilled to the
disk tier, and what memory holds handed to disk as the engine closes."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import numpy.typing as npt

from .._stats import EngineStats
from ..llama import LlamaModel
from ._disk_tier import DiskTier
from ._jobs import Job
from ._pool import SharedPool
from ._prompt_cache import OFFERED, PromptCache
from ._scheduler import Start

__all__ = ["PromptReuse"]


class PromptReuse:
    """The prompt-reuse part of :class:`~._core.EngineCore` (which sets the attributes
    declared here)."""

    held: tuple[npt.NDArray[np.int32], ...]
    _model: LlamaModel
    _stats: EngineStats
    _cache: PromptCache
    _disk: DiskTier | None
    _pool: SharedPool | None
    _jobs: dict[int, Job]
    _admissions: int
    _snapshots: dict[int, tuple[npt.NDArray[np.int32], ctypes.Array[ctypes.c_uint8], str]]

    def _start(self, key: int) -> Start:
        """Carry out the prompt cache's decision for a sequence admitted now (or bring a
        preempted one back: its state restored into a free slot)."""
        job = self._jobs[key]
        model, cache = self._model, self._cache
        if job.preempted:
            assert self._pool is not None
            self._pool.resume(job)
            return Start(min(job.pos, len(job.prompt)))
        job.order = self._admissions
        self._admissions += 1
        offered = job.request.offered
        plan = cache.assign(
            job.prompt,
            hints=job.request.hints,
            reuse=job.request.request.cache_prompt,
            scope=job.request.lora.key,
            offered=offered.tokens if offered is not None and offered.data is not None else None,
        )
        seq = job.seq = plan.seq
        keep = plan.keep
        if plan.save is not None:
            self._snapshot(seq, plan.save, plan.save_scope)
        if plan.restore is not None:
            started = time.perf_counter()
            model.forget(seq)
            if self._pool:
                self._pool.room_for(keep)
            if plan.restore == OFFERED:
                assert offered is not None
                data = offered.take()
            else:
                data = self._snapshots[plan.restore][1]
            if data is None or not model.restore_state(seq, data):
                cache.restore_failed(seq)
                keep = 0
            elif plan.restore == OFFERED:
                assert offered is not None
                stats = self._stats
                stats.disk_hits += 1
                stats.disk_restored_tokens += keep
                stats.disk_restore_s += offered.seconds + time.perf_counter() - started
        if offered is not None:
            offered.take()  # not held while the request runs
        media = [(start, start + chunk.n_tokens, chunk) for start, chunk in job.request.media]
        for begin, end, _ in media:
            if begin < keep < end:  # a media chunk is in memory whole or not at all
                keep = begin
        # A non-causal chunk is ingested whole, in a chunk of its own; a causal one in
        # prompt chunks of its own, which end where it begins and ends.
        spans = tuple((begin, end) for begin, end, chunk in media if chunk.non_causal)
        bounds = tuple(
            b for begin, end, chunk in media if not chunk.non_causal for b in (begin, end)
        )
        if keep == 0 or not model.forget(seq, job.position(keep)):
            model.forget(seq)
            keep = 0
        job.pos = job.cached = keep
        job.snapshot_at = plan.snapshot_at
        self._count_cache()
        return Start(keep, (*plan.snapshot_at, *bounds), spans)

    def _snapshot(self, seq: int, tokens: npt.NDArray[np.int32], scope: str) -> None:
        """Save ``seq``'s memory, which holds ``tokens`` computed under ``scope``, as a
        snapshot in host memory; what that evicts (or a snapshot too large for it) goes to the
        disk tier, if any (the base model's only: the disk's files know no adapter set)."""
        data = self._model.save_state(seq)
        if data is None:
            return
        cache, disk = self._cache, self._disk
        entry, evicted = cache.stored(tokens, len(data), scope)
        for old in evicted:
            old_tokens, old_data, old_scope = self._snapshots.pop(old)
            if disk is not None and not old_scope:
                disk.spill(old_tokens, old_data)
        if entry is not None:
            self._snapshots[entry] = (tokens, data, scope)
        elif disk is not None and not scope and len(data) > cache.budget_bytes:
            disk.spill(tokens, data)
        self._count_cache()

    def flush(self) -> None:
        """Hand the disk tier what memory holds, as the engine closes: each idle slot's memory
        (copied out once), then every snapshot in host memory, unless a file (or, for a slot,
        a snapshot) already serves it."""
        disk, cache, model = self._disk, self._cache, self._model
        if disk is None:
            return
        for seq in cache.evictable():
            tokens = cache.resident(seq)
            if cache.scope(seq):
                continue  # memory under adapters: the disk's files know no adapter set
            if cache.worth_keeping(tokens) and not disk.covers(tokens):
                data = model.save_state(seq)
                if data is not None:
                    disk.spill(tokens, data, closing=True)
        for tokens, data, scope in self._snapshots.values():
            if not scope and not disk.covers(tokens):
                disk.spill(tokens, data, closing=True)

    def _count_cache(self) -> None:
        stats, cache = self._stats, self._cache
        self.held = cache.held()
        stats.prompt_cache_hits = cache.hits
        stats.prompt_cache_reused_tokens = cache.reused_tokens
        stats.prompt_cache_bytes = cache.bytes_used
        stats.prompt_cache_entries = cache.entries
        stats.prompt_cache_snapshots = cache.snapshots
        stats.prompt_cache_evictions = cache.evictions
