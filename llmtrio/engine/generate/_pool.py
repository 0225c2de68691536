"""The shared KV pool (``kv_unified``): every slot's memory in one pool of cells, and what
the decode thread does when it runs out. No Trio; called by the core on the decode thread.

- Admission (:meth:`SharedPool.fits`): a request comes in only when its prompt, beside the
  prompts of the running sequences and one more token for each, fits the pool; idle slots'
  cells count as free, since they are given up for it.
- Each step (:meth:`SharedPool.make_room`), when the batch needs more cells than are free:
  idle slots give up the cells they keep for prompt reuse first (least recently used
  first; snapshotted to host memory within the prompt cache's budget, so a later prompt can
  still restore them); then the step's drafts go; then the youngest running sequence is
  preempted, and the next youngest, until the step fits. The oldest always fits: a request
  may use at most the whole pool.
- Preemption swaps out (:meth:`SharedPool.preempt`): the sequence's memory is copied to host
  memory (``llama_state_seq_get_data``: its cells, or its recurrent state), pinned there
  (outside the prompt cache's budget, never evicted) until it is admitted again, first of
  all waiting requests, into whichever slot is free (:meth:`SharedPool.resume`). Its
  sampler (grammar position, penalties, random state), drafter and progress stay with it,
  so it goes on exactly where it stopped. Swapping rather than recomputing: a copy of a
  sequence's memory takes milliseconds on this hardware where re-ingesting it takes seconds
  (prefill runs at a few hundred tokens a second), re-ingesting could move the logits (batch
  shape), and a recurrent state cannot be recomputed part-way anyway; the cost is host
  memory, at most what the preempted sequences held in the pool.

Cells are counted here, not asked of llama.cpp: a running sequence holds ``job.pos`` cells,
an idle slot the tokens the prompt cache says it keeps. A prefix two requests share is held
once per sequence (each slot has its own copy of its cells).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt

from .._errors import DecodeError
from .._stats import EngineStats
from ..llama import LlamaModel
from ._jobs import Job, Part
from ._prompt_cache import PromptCache
from ._scheduler import Scheduler

__all__ = ["SharedPool"]


class SharedPool:
    """``cells`` shared by the sequences of ``jobs`` (the core's own mapping, read live).

    ``snapshot(seq, tokens, scope)`` saves a slot's memory (computed under ``scope``, its
    LoRA adapter set's key) into the prompt cache before it is given up.
    """

    def __init__(
        self,
        cells: int,
        *,
        model: LlamaModel,
        cache: PromptCache,
        scheduler: Scheduler,
        stats: EngineStats,
        jobs: Mapping[int, Job],
        snapshot: Callable[[int, npt.NDArray[np.int32], str], None],
    ) -> None:
        self.cells = cells
        self._model = model
        self._cache = cache
        self._scheduler = scheduler
        self._stats = stats
        self._jobs = jobs
        self._snapshot = snapshot
        stats.kv_pool_cells = cells

    def held(self) -> int:
        """Cells held by running sequences."""
        return sum(job.pos for job in self._jobs.values() if job.seq >= 0)

    def fits(self, key: int) -> bool:
        """Whether the pool has room to admit ``key`` now (for the scheduler)."""
        need = _committed(self._jobs[key]) + 1
        running = [job for job in self._jobs.values() if job.seq >= 0]
        return sum(_committed(job) + 1 for job in running) + need <= self.cells

    def make_room(self, parts: list[Part]) -> list[Part]:
        """Make the pool hold this step's tokens: idle slots' cells first, then the drafts,
        then the youngest running sequences are swapped out (their parts leave the step)."""
        need = sum(part.tokens for part in parts)
        free = self.room_for(need)
        if need > free:
            for part in parts:
                part.draft = []
            need = sum(part.tokens for part in parts)
        running = sorted(
            (job for job in self._jobs.values() if job.seq >= 0), key=lambda job: -job.order
        )
        for victim in running[:-1]:  # the oldest always fits: the pool holds any request
            if need <= free:
                break
            held = victim.pos
            if not self.preempt(victim):
                continue
            free += held
            need -= sum(part.tokens for part in parts if part.job is victim)
            parts = [part for part in parts if part.job is not victim]
        return parts

    def room_for(self, need: int) -> int:
        """Free idle slots' cells (least recently used first, snapshotted when worth it)
        until ``need`` cells are free, or none is left to free; the cells free now."""
        cache = self._cache
        free = self.cells - self.held() - cache.idle_cells()
        for seq in cache.evictable():
            if need <= free:
                break
            held = len(cache.resident(seq))
            tokens = cache.evict(seq)
            if tokens is not None:
                self._snapshot(seq, tokens, cache.scope(seq))
            self._model.forget(seq)
            self._stats.idle_evictions += 1
            free += held
        return free

    def preempt(self, job: Job) -> bool:
        """Swap ``job`` out: its memory to host memory, its slot freed; its sampler, drafts
        and progress stay, and it is first in line to come back. False when llama.cpp
        could not copy its state (it then keeps running)."""
        data: ctypes.Array[ctypes.c_uint8] | None = None
        if job.pos:
            data = self._model.save_state(job.seq)
            if data is None:
                return False
        self._model.forget(job.seq)
        self._cache.released(job.seq, ())
        job.seq = -1
        job.preempted = True
        job.swapped = data
        self._scheduler.preempt(job.key, prefilled=min(job.pos, len(job.prompt)))
        stats = self._stats
        stats.preemptions += 1
        stats.swapped += 1
        stats.swapped_bytes += len(data) if data is not None else 0
        return True

    def resume(self, job: Job) -> None:
        """Bring preempted ``job`` back into a free slot, its state restored.

        Error handling: :class:`DecodeError` when llama.cpp cannot restore it (admission
        made room for it, so this is not expected)."""
        plan = self._cache.assign(np.zeros(0, dtype=np.int32), scope=job.request.lora.key)
        if plan.save is not None:
            self._snapshot(plan.seq, plan.save, plan.save_scope)
        self._model.forget(plan.seq)
        self.room_for(job.pos)
        if job.swapped is not None and not self._model.restore_state(plan.seq, job.swapped):
            raise DecodeError("a preempted sequence's state could not be restored")
        job.seq = plan.seq
        self.unswap(job)

    def unswap(self, job: Job) -> None:
        """``job`` is back (or ended while preempted): its host copy goes."""
        stats = self._stats
        stats.swapped -= 1
        if job.swapped is not None:
            stats.swapped_bytes -= len(job.swapped)
        job.swapped = None
        job.preempted = False


def _committed(job: Job) -> int:
    """The cells a running (or preempted) job holds or will hold for its prompt."""
    return max(job.pos, len(job.prompt))
