"""The draft gate (:class:`DraftGate`): whether a step drafts at all, judged by what steps
with and without drafts realized in the same minutes (tokens emitted per ms of step,
measured), not by what the step costs predicted.

The budget (:func:`plan_drafts`) prices a plan with :class:`StepCosts`, a fit of medians
measured at other moments on a machine whose speed moves; at several streams a plan's
predicted gain is a few percent, within what either prediction may be off by, so a budget
that seemed to gain ran below ``--no-spec`` (issue 36: 0.85x-1.06x at eight streams). The
gate closes the loop on the outcome itself: for each count of decoding sequences it keeps
the recent steps of both kinds, and lets the budget draft only while the drafting steps
emitted more tokens per ms than the plain ones. Both kinds keep being measured side by side:
while steps draft, one in ``hold_every`` runs plain (one in four times that while drafting
leads by more than ``sure``); while they are held, one in ``probe_every`` runs the budget.
What that costs at most is a ``1 / hold_every`` share of speculation's gain, or a
``1 / probe_every`` share of its loss. A held step runs as without speculation: no draft
is proposed or priced.
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
    plain: _Arm
    drafted: _Arm
    #: Steps open to drafts since a plain step was measured, and steps held since a
    #: drafting one was.
    since_plain: int = 0
    since_drafted: int = 0


@attrs.define
class DraftGate:
    """Whether a step of ``outputs`` decoding sequences drafts at all (:meth:`open`: the
    budget proposes and plans; else the step runs as without speculation, its Python
    too), from the steps measured with and without drafts at the same count of sequences
    (:meth:`measured`).

    Each kind keeps its last ``window`` decode-only steps of the last ``max_age_s``
    seconds. Until it has ``least`` plain steps at a count, a step there runs plain (the
    rate drafts must beat); until it has ``least`` drafting ones, it drafts. Then steps
    draft while the drafting steps' tokens per ms exceed the plain steps', one step in
    ``hold_every`` running plain to keep the plain rate current (one in four times as many
    while they exceed it by more than ``sure``: a lead that large is not noise); else one
    step in ``probe_every`` drafts (the text may have become one the drafts copy), and the
    steps after it until one did.
    """

    window: int = 24
    least: int = 6
    hold_every: int = 8
    probe_every: int = 16
    sure: float = 0.25
    max_age_s: float = 60.0
    _counts: dict[int, _Arms] = attrs.field(factory=dict)
    #: Steps run without drafts because the gate held them (a counter for the stats).
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
        plain = arms.plain.rate(now, self.max_age_s)
        drafted = arms.drafted.rate(now, self.max_age_s)
        if plain is None or len(arms.plain.steps) < self.least:
            verdict = False
        elif drafted is None or len(arms.drafted.steps) < self.least:
            verdict = True
        elif drafted > plain:
            every = self.hold_every * (4 if drafted > plain * (1 + self.sure) else 1)
            verdict = arms.since_plain + 1 < every
        else:
            verdict = arms.since_drafted + 1 >= self.probe_every
        if verdict:
            arms.since_plain += 1
        else:
            arms.since_drafted += 1
            self.held += 1
        return verdict

    def measured(self, outputs: int, tokens: int, ms: float, *, drafted: bool, at: float) -> None:
        """A decode-only step of ``outputs`` sequences that emitted ``tokens`` in ``ms``,
        begun at ``at``, with drafts verified or not."""
        if outputs <= 0 or ms <= 0:
            return
        arms = self._arms(outputs)
        if drafted:
            arms.drafted.steps.append((tokens, ms, at))
            arms.since_drafted = 0
        else:
            arms.plain.steps.append((tokens, ms, at))
            arms.since_plain = 0

    def rates(self, outputs: int, now: float) -> tuple[float | None, float | None]:
        """The plain and drafting steps' tokens per ms at ``outputs`` sequences (None where
        none was measured)."""
        arms = self._arms(outputs)
        return arms.plain.rate(now, self.max_age_s), arms.drafted.rate(now, self.max_age_s)
