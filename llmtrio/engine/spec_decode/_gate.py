"""The draft gate (:class:`DraftGate`): whether a step may draft at all, judged by what
steps open to drafts and steps held from them realized in the same minutes (tokens emitted
per ms of step, measured, the drafts' proposing, pricing, verifying and rollback included),
not by what the step costs predicted.

The budget (:func:`plan_drafts`) prices a plan with :class:`StepCosts`, a fit of medians
measured at other moments on a machine whose speed moves; at several streams a plan's
predicted gain is a few percent, within what either prediction may be off by, so a budget
that seemed to gain ran below ``--no-spec`` (issue 36: 0.85x-1.06x at eight streams). The
gate closes the loop on the outcome itself, an A/B test run step by step: for each count of
decoding sequences it keeps the recent steps of both kinds, open (the budget proposes,
prices and drafts what pays, which may be nothing) and held (a step as without speculation:
nothing proposed or priced), and opens steps only while the open ones emitted more tokens
per ms. Both kinds keep being measured side by side: while steps are open, one in
``hold_every`` is held (one in four times that while the open ones lead by more than
``sure``); while they are held, one in ``probe_every`` is open. What that costs at most is a
``1 / hold_every`` share of speculation's gain, or a ``1 / probe_every`` share of its loss.
"""

from __future__ import annotations

from collections import deque

import attrs

__all__ = ["DraftGate"]


@attrs.define
class _Arm:
    """The recent decode-only steps of one kind: ``(tokens emitted, ms, started at s)``."""

    steps: deque[tuple[int, float, float]]

    def rate(self, now: float, max_age_s: float) -> float | None:
        """Tokens per ms over the steps not older than ``max_age_s`` (None without any)."""
        while self.steps and now - self.steps[0][2] > max_age_s:
            self.steps.popleft()
        ms = sum(step[1] for step in self.steps)
        return sum(step[0] for step in self.steps) / ms if ms > 0 else None


@attrs.define
class _Arms:
    held: _Arm
    open: _Arm
    #: Steps opened since a held step was measured, and steps held since an open one was.
    since_held: int = 0
    since_open: int = 0


@attrs.define
class DraftGate:
    """Whether a step of ``outputs`` decoding sequences may draft (:meth:`open`: the budget
    proposes and plans; else the step runs as without speculation, its Python too), from
    the steps measured open and held at the same count of sequences (:meth:`measured`).

    Each kind keeps its last ``window`` decode-only steps of the last ``max_age_s``
    seconds. Until it has ``least`` held steps at a count, a step there is held (the rate
    speculation must beat); until it has ``least`` open ones, it is open. Then steps are
    open while the open steps' tokens per ms exceed the held steps', one step in
    ``hold_every`` held to keep the held rate current (one in four times as many while
    they exceed it by more than ``sure``: a lead that large is not noise); else one step in
    ``probe_every`` is open (the text may have become one the drafts copy).
    """

    window: int = 24
    least: int = 6
    hold_every: int = 8
    probe_every: int = 16
    sure: float = 0.25
    max_age_s: float = 60.0
    _counts: dict[int, _Arms] = attrs.field(factory=dict)
    #: Steps the gate held (a counter for the stats).
    held: int = 0

    def _arms(self, outputs: int) -> _Arms:
        arms = self._counts.get(outputs)
        if arms is None:
            arms = _Arms(_Arm(deque(maxlen=self.window)), _Arm(deque(maxlen=self.window)))
            self._counts[outputs] = arms
        return arms

    def open(self, outputs: int, now: float) -> bool:
        """Whether a step of ``outputs`` decoding sequences, begun at ``now`` (seconds, a
        monotonic clock), may carry drafts (the budget then decides which)."""
        arms = self._arms(outputs)
        held = arms.held.rate(now, self.max_age_s)
        opened = arms.open.rate(now, self.max_age_s)
        if held is None or len(arms.held.steps) < self.least:
            verdict = False
        elif opened is None or len(arms.open.steps) < self.least:
            verdict = True
        elif opened > held:
            every = self.hold_every * (4 if opened > held * (1 + self.sure) else 1)
            verdict = arms.since_held + 1 < every
        else:
            verdict = arms.since_open + 1 >= self.probe_every
        if verdict:
            arms.since_held += 1
        else:
            arms.since_open += 1
            self.held += 1
        return verdict

    def measured(self, outputs: int, tokens: int, ms: float, *, opened: bool, at: float) -> None:
        """A decode-only step of ``outputs`` sequences that emitted ``tokens`` in ``ms``,
        begun at ``at``, open to drafts or held."""
        if outputs <= 0 or ms <= 0:
            return
        arms = self._arms(outputs)
        if opened:
            arms.open.steps.append((tokens, ms, at))
            arms.since_open = 0
        else:
            arms.held.steps.append((tokens, ms, at))
            arms.since_held = 0

    def rates(self, outputs: int, now: float) -> tuple[float | None, float | None]:
        """The held and open steps' tokens per ms at ``outputs`` sequences (None where none
        was measured)."""
        arms = self._arms(outputs)
        return arms.held.rate(now, self.max_age_s), arms.open.rate(now, self.max_age_s)
