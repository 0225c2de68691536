"""The admission and chunking policy: which sequences run in the next step, and how many
prompt tokens each ingests. Pure: fed with slot state and measured step times, no llama.cpp.
"""

from __future__ import annotations

import math
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
    - ``prefill_share`` (finite) puts running streams first, two ways. While sequences
      decode, a step's prompt tokens may cost at most ``prefill_share`` times a decode-only
      step (the budget in tokens follows the measured step times: the last decode-only
      step of as many sequences over the measured cost of one prompt token, what the steps
      that carried prompt tokens took beyond a decode step of as many sequences over those
      tokens, recent steps weighing most; at least one token, so a prompt is
      never starved): a running stream's next token comes at most ``1 + prefill_share``
      decode steps after its last. Prompts being ingested count as the streams they are
      about to be: with more of them than streams decoding, the budget grows by their
      ratio (one stream must not hold seven prompts to a crawl). While none decodes, the
      prompts being ingested are one wave, ingested ``prefill_chunk`` tokens a step, whose
      first tokens all come in the same step (each prompt's last token waits for the
      others'), so they decode together and no prompt of the wave is ingested beside a
      stream of it; a wave of more than ``max_inflight`` chunks is not held (its prompts
      start as they are in, until what is left is that short). ``math.inf`` is prompts
      first: every step takes
      ``prefill_chunk`` prompt tokens, each prompt starts as soon as it is in (the lowest
      time to first token; every running stream waits for it).
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
    prefill_share: float = math.inf
    _waiting: deque[tuple[int, int]] = attrs.field(factory=deque)
    _slots: dict[int, _Slot] = attrs.field(factory=dict)
    #: Preempted sequences, by key, with their progress (also at the head of ``_waiting``).
    _paused: dict[int, _Slot] = attrs.field(factory=dict)
    _decode_step_ms: float | None = None
    _measured_since_admit: bool = True
    #: What prompt tokens added to the steps that carried them (ms) and how many they were,
    #: both decayed at each such step: their ratio prices a prompt token.
    _prompt_ms: float = 0.0
    _prompt_tokens: float = 0.0
    #: Sequences decoding in the last step planned.
    _decoding: int = 0
    #: The last decode-only step's time, by the sequences it decoded (ms).
    _decode_ms: dict[int, float] = attrs.field(factory=dict)

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

    def measured(self, step_ms: float, *, decode_only: bool, prompt_tokens: int = 0) -> None:
        """Record a step's cost (of the last step planned, carrying ``prompt_tokens``); only
        steps with no prompt ingestion steer admission; the others price a prompt token
        (what the step took beyond the last decode-only step, over its prompt tokens)."""
        if decode_only:
            self._decode_step_ms = step_ms
            self._measured_since_admit = True
            if self._decoding:
                self._decode_ms[self._decoding] = step_ms
        elif prompt_tokens > 0:
            # Beside n sequences decoding, what the step took beyond a decode-only step of n
            # (none measured yet: the step does not price the tokens; a decode step of
            # fewer sequences would put their difference on the prompt's account). Summed,
            # not averaged per step: a step with one prompt token prices it by the noise of
            # a whole step (a spike of 100 ms is then 100 ms a token, the budget shrinks to
            # a token a step, and every later step prices it the same way).
            base = self._decode_ms.get(self._decoding) if self._decoding else 0.0
            if base is None:
                return
            self._prompt_ms = 0.75 * self._prompt_ms + max(step_ms - base, 0.0)
            self._prompt_tokens = 0.75 * self._prompt_tokens + prompt_tokens

    @property
    def token_ms(self) -> float | None:
        """The measured cost of one prompt token in a step, ms (``None`` before any)."""
        return self._prompt_ms / self._prompt_tokens if self._prompt_tokens else None

    def prompt_budget(self, decoding: int, ingesting: int = 0) -> int:
        """The prompt tokens a step with ``decoding`` sequences decoding (and ``ingesting``
        prompts being ingested) may carry."""
        share, token_ms, known = self.prefill_share, self.token_ms, self._decode_ms
        if not decoding or math.isinf(share) or not known or not token_ms:
            return self.prefill_chunk
        # The decode step of this many sequences, or of the nearest count measured.
        decode_ms = known[min(known, key=lambda n: (abs(n - decoding), -n))]
        scale = max(1.0, ingesting / decoding)
        return max(1, min(self.prefill_chunk, int(share * scale * decode_ms / token_ms)))

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
        self._decoding = len(decode)
        served = [s for k, s in self._slots.items() if serves is None or serves(k)]
        ingesting = sum(1 for slot in served if slot.prefilled < slot.prompt_len)
        budget = self.prompt_budget(len(decode), ingesting)
        # A wave: nothing decodes, and its prompts do not all end in this step (nor are they
        # longer than a chunk a slot: then each starts as soon as it is in).
        left = sum(max(slot.prompt_len - slot.prefilled, 0) for slot in served)
        wave = (
            not decode
            and not math.isinf(self.prefill_share)
            and budget < left <= self.prefill_chunk * self.max_inflight
        )
        prefill = self._chunks(budget, serves, hold_last=wave)
        if wave and not prefill:  # every prompt is at its last token, more than fit: go on
            prefill = self._chunks(budget, serves, hold_last=False)
        return StepPlan(admitted, decode, tuple(prefill))

    def _chunks(
        self, budget: int, serves: Callable[[int], bool] | None, *, hold_last: bool
    ) -> list[Prefill]:
        """Spend ``budget`` prompt tokens on the sequences the step ``serves``, oldest first
        (``hold_last``: no prompt reaches its end)."""
        prefill: list[Prefill] = []
        for key, slot in self._slots.items():
            if budget == 0:
                break
            if serves is not None and not serves(key):
                continue
            left = slot.prompt_len - slot.prefilled - (1 if hold_last else 0)
            if left > 0:
                count = min(left, budget)
                for stop in slot.stops:
                    if stop > slot.prefilled:
                        count = min(count, stop - slot.prefilled)
                        break
                for begin, end in slot.spans:
                    if begin == slot.prefilled:  # a span is one chunk, whatever the budget
                        count = end - begin if end - slot.prefilled <= left else 0
                        break
                    if begin > slot.prefilled:
                        count = min(count, begin - slot.prefilled)
                        break
                if count == 0:
                    continue
                prefill.append(Prefill(key, slot.prefilled, count))
                slot.prefilled += count
                budget -= min(count, budget)
        return prefill

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
