"""The admission and chunking policy: which sequences run in the next step, and how many
prompt tokens each ingests. Pure: fed with slot state and measured step times, no llama.cpp.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs

__all__ = ["Prefill", "Scheduler", "Start", "StepPlan"]


@attrs.frozen
class Prefill:
    """Ingest ``count`` prompt tokens of ``key`` starting at prompt offset ``start``."""

    key: int
    start: int
    count: int


@attrs.frozen
class StepPlan:
    admitted: tuple[int, ...]
    decode: tuple[int, ...]
    prefill: tuple[Prefill, ...]

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


@attrs.frozen
class Start:
    """Where an admitted sequence's ingestion starts (``reused`` prompt tokens are already
    in its memory) and the prompt lengths at which a prefill chunk must end (``stops``: the
    engine snapshots the state there)."""

    reused: int = 0
    stops: tuple[int, ...] = ()
    #: Prompt ranges ``(start, end)`` ingested whole, in one chunk of their own (images).
    spans: tuple[tuple[int, int], ...] = ()


@attrs.define
class _Slot:
    prompt_len: int
    prefilled: int = 0
    stops: tuple[int, ...] = ()
    spans: tuple[tuple[int, int], ...] = ()


@attrs.define
class Scheduler:
    """Continuous-batching policy over ``max_inflight`` slots.

    - Waiting requests are admitted in arrival order while a slot is free. With
      ``target_step_ms > 0`` admission also pauses while the last measured decode step was
      slower than the target, and admits one request at a time: the next only once a decode
      step has been measured with the last one admitted in it (so every admission is judged
      by a measurement that includes its predecessor).
    - Each step decodes one token for every sequence past its prompt, and spends up to
      ``prefill_chunk`` prompt tokens on sequences still ingesting, oldest first. A chunk
      never runs past one of its sequence's ``stops``.
    - A span (an image) is ingested whole in a chunk of its own: a text chunk ends where
      a span begins, and a span's chunk may exceed the step's budget (it then uses it up).
    - A step may serve some sequences only (``serves``: those of the LoRA adapter set the
      step runs under, ``_adapter_turns``): the others keep their slots and progress, and
      neither decode nor ingest in it. Admission is the same for all.
    - A shared memory pool can refuse a request (``fits``): admission then waits, in
      arrival order, for room. A running sequence :meth:`preempt` ed for room goes back to
      the head of the queue with its progress kept, and is admitted again before any other.
    """

    max_inflight: int
    prefill_chunk: int
    target_step_ms: float = 0.0
    _waiting: deque[tuple[int, int]] = attrs.field(factory=deque)
    _slots: dict[int, _Slot] = attrs.field(factory=dict)
    #: Preempted sequences, by key, with their progress (also at the head of ``_waiting``).
    _paused: dict[int, _Slot] = attrs.field(factory=dict)
    _decode_step_ms: float | None = None
    _measured_since_admit: bool = True

    def add(self, key: int, prompt_len: int) -> None:
        self._waiting.append((key, prompt_len))

    def remove(self, key: int) -> None:
        """Forget ``key``, waiting or running (finished or cancelled)."""
        self._paused.pop(key, None)
        if self._slots.pop(key, None) is None:
            self._waiting = deque(item for item in self._waiting if item[0] != key)

    def preempt(self, key: int, *, prefilled: int) -> None:
        """Take running ``key`` out of the batch until it is admitted again (first of all
        waiting requests, preempted ones in the order they were preempted), with
        ``prefilled`` prompt tokens in its memory (a chunk planned for this step and not
        decoded is planned again)."""
        slot = self._slots.pop(key)
        slot.prefilled = prefilled
        self._paused[key] = slot
        paused = [item for item in self._waiting if item[0] in self._paused]
        rest = [item for item in self._waiting if item[0] not in self._paused]
        self._waiting = deque([*paused, (key, slot.prompt_len), *rest])

    def measured(self, step_ms: float, *, decode_only: bool) -> None:
        """Record a step's cost; only steps with no prompt ingestion steer admission."""
        if decode_only:
            self._decode_step_ms = step_ms
            self._measured_since_admit = True

    @property
    def running(self) -> int:
        return len(self._slots)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def first_waiting(self) -> int | None:
        """The request first in line for a slot (admitted before any other), if any."""
        return self._waiting[0][0] if self._waiting else None

    def schedule(
        self,
        start: Callable[[int], Start] | None = None,
        fits: Callable[[int], bool] | None = None,
        serves: Callable[[int], bool] | None = None,
    ) -> StepPlan:
        """Plan the next step; ``start(key)`` is asked, for each sequence admitted now, how
        much of its prompt is already in memory and where its chunks must end; ``fits(key)``
        whether the memory has room to admit it now; ``serves(key)`` whether the step runs
        that sequence (all, when not given)."""
        admitted = self._admit(start, fits)
        decode = tuple(
            key
            for key, slot in self._slots.items()
            if slot.prefilled >= slot.prompt_len and (serves is None or serves(key))
        )
        prefill: list[Prefill] = []
        budget = self.prefill_chunk
        for key, slot in self._slots.items():
            if budget == 0:
                break
            if serves is not None and not serves(key):
                continue
            left = slot.prompt_len - slot.prefilled
            if left > 0:
                count = min(left, budget)
                for stop in slot.stops:
                    if stop > slot.prefilled:
                        count = min(count, stop - slot.prefilled)
                        break
                for begin, end in slot.spans:
                    if begin == slot.prefilled:  # a span is one chunk, whatever the budget
                        count = end - begin
                        break
                    if begin > slot.prefilled:
                        count = min(count, begin - slot.prefilled)
                        break
                prefill.append(Prefill(key, slot.prefilled, count))
                slot.prefilled += count
                budget -= min(count, budget)
        return StepPlan(admitted, decode, tuple(prefill))

    def _admit(
        self, start: Callable[[int], Start] | None, fits: Callable[[int], bool] | None
    ) -> tuple[int, ...]:
        admitted: list[int] = []
        while self._waiting and len(self._slots) < self.max_inflight:
            key, prompt_len = self._waiting[0]
            resumed = self._paused.get(key)
            if self.target_step_ms > 0 and self._slots and resumed is None:
                over = (self._decode_step_ms or 0.0) > self.target_step_ms
                if admitted or not self._measured_since_admit or over:
                    break
            if fits is not None and not fits(key):
                break
            self._waiting.popleft()
            if resumed is not None:
                del self._paused[key]
                if start is not None:
                    start(key)
                self._slots[key] = resumed
                admitted.append(key)
                continue
            self._measured_since_admit = False
            slot = _Slot(prompt_len)
            if start is not None:
                begin = start(key)
                slot.prefilled = min(begin.reused, prompt_len - 1)
                slot.stops = tuple(sorted(begin.stops))
                slot.spans = tuple(sorted(begin.spans))
            self._slots[key] = slot
            admitted.append(key)
        return tuple(admitted)
