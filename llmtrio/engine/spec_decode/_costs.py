"""A step's cost (:class:`StepCosts`), fitted to measured steps by weighted least squares as a
fixed cost per micro-batch llama.cpp splits the batch into plus a cost per position with
logits (a micro-batch of one token priced apart: llama.cpp runs it with other kernels).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import attrs

from ._batches import BLOCK

__all__ = ["Shape", "StepCosts"]


def _median(times: Sequence[float]) -> float:
    """The middle of ``times`` (the upper one of an even count)."""
    ordered = sorted(times)
    return ordered[len(ordered) // 2]


@attrs.frozen
class Shape:
    """A step's micro-batches as :class:`StepCosts` prices them: how many, how many of one
    token (``singles``), of two or three (``short``, holding ``short_tokens``: too few for a
    matrix-product pass, each token a matrix-vector pass of its own), and of :data:`BLOCK`
    tokens or more whose tokens are not a whole number of blocks (``partial``: a
    matrix-vector pass over the remainder)."""

    batches: int = 1
    singles: int = 0
    short: int = 0
    short_tokens: int = 0
    partial: int = 0

    @classmethod
    def of(cls, sizes: Sequence[int]) -> Shape:
        """The shape of micro-batches of ``sizes`` tokens (at least one micro-batch)."""
        return _shape_of(tuple(sizes))

    @classmethod
    def _of(cls, sizes: Sequence[int]) -> Shape:
        sizes = [size for size in sizes if size > 0] or [1]
        short = [size for size in sizes if 1 < size < BLOCK]
        return cls(
            len(sizes),
            sum(1 for size in sizes if size == 1),
            len(short),
            sum(short),
            sum(1 for size in sizes if size >= BLOCK and size % BLOCK),
        )

    @property
    def long(self) -> int:
        """Micro-batches of :data:`BLOCK` tokens or more."""
        return self.batches - self.singles - self.short


@functools.lru_cache(maxsize=4096)
def _shape_of(sizes: tuple[int, ...]) -> Shape:
    return Shape._of(sizes)


@attrs.frozen
class _Fit:
    base: float  # each micro-batch of BLOCK tokens or more
    gemv: float  # each of those with a remainder (``Shape.partial``)
    position: float  # each position with logits in them
    single: float | None  # a micro-batch of one token (None: no step of those only yet)


def _solve(rows: list[tuple[list[float], float, float]]) -> list[float] | None:
    """The weighted least-squares coefficients of ``(features, value, weight)`` rows, or
    None where the rows cannot tell every feature apart."""
    n = len(rows[0][0])
    a = [[sum(w * x[i] * x[j] for x, _, w in rows) for j in range(n)] for i in range(n)]
    b = [sum(w * x[i] * y for x, y, w in rows) for i in range(n)]
    scale = [math.sqrt(a[i][i]) or 1.0 for i in range(n)]
    m = [[a[i][j] / (scale[i] * scale[j]) for j in range(n)] + [b[i] / scale[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-6:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [v - f * p for v, p in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] / scale[i] for i in range(n)]


@attrs.define
class StepCosts:
    """A decode step's cost in ms, fitted to measured steps: ``single`` per micro-batch of
    one token, and per token of a micro-batch of two or three; per micro-batch of
    :data:`BLOCK` tokens or more ``base``, plus ``gemv`` where its tokens are not a whole
    number of blocks, plus ``position`` per position with logits in it; ``prefill_ms`` per
    prompt token ingested with them.

    On a CPU every micro-batch reads all the weights (what makes one sequence memory-bound)
    and every position multiplies them (gemma-3's 262k-token output layer makes it dear, and
    the samplers' time per position is in it too). How a micro-batch reads them depends on
    its size: llama.cpp multiplies its repacked weights (most of a Q4 model) four tokens at a
    time with matrix products, and runs the tokens past the last four, or all of them in a
    micro-batch of fewer than four, as matrix-vector products, a pass each. Measured here
    (gemma-3-270m, 2 threads, per slot, ``benchmarks/step_shapes.py --scan 24``): one token
    17 ms; 2, 3, 4 tokens 34, 40, 45; 7, 8, 9 78, 59, 82; 15, 16, 17 107, 86, 113; from 4
    tokens on, 29 ms + 22 with a remainder + 3.6 a position (3.6 ms rms), so one stream's
    draft of 15 tokens costs 5x its plain step and one of 16 costs 6.8x: the plans take
    lengths that fill the blocks. A step of eight sequences' equal drafts holds 8 x (1 +
    draft) tokens, whole blocks. When ``position * outputs`` dwarfs the rest the step is
    compute-bound, a draft position costs about what a token is worth, and the budget
    drafts nothing; one sequence, or a machine with bandwidth to spare, drafts.

    Measured per shape (:class:`Shape` and ``outputs``): each shape keeps the median of its
    last ``samples`` steps, so a step stalled by another process (seconds, on a shared
    machine) moves nothing, and a shape not seen in ``horizon`` steps is forgotten (the load
    changes). ``single`` is the mean over the shapes made of single-token micro-batches
    only; the rest is the least-squares fit over the other shapes (what their single-token
    and short micro-batches cost taken off), over the medians of the shapes seen ``settled``
    times or more, weighted by their samples. Where the shapes seen cannot tell ``gemv``
    apart (none with a remainder, or none without), the fit leaves it out, over the shapes
    without a remainder where there are some (a remainder never seen is not priced: such a
    plan is tried, and measured); where they cannot tell ``base`` from ``position`` either
    (one shape, or shapes all with the same positions per micro-batch), or tell them apart
    as something no machine does (a negative cost: noise), it assumes a micro-batch's fixed
    cost is ``prior_ratio`` positions' (measured here: about 9; on a step of one token only,
    that splits ``single`` alike, which prices a first draft cheap: it is tried, and
    measured).

    ``remainder_prior``: where the shapes cannot tell ``gemv`` apart, it is taken to be
    that many one-token steps (``single``) instead of nothing, and the rest fitted over
    every shape with it taken off. The core sets it to 1 for weights llama.cpp's CPU
    kernels repack (:func:`repacked`; measured here 22 ms against a one-token step's 17):
    one stream's plans otherwise keep to the one long shape they first settled on, the
    dearest of its neighbours (17 positions for a draft of 16: 113 ms, against 86 for 16),
    and never measure a whole-block one beside it often enough to learn what it saves.
    """

    horizon: int = 200
    samples: int = 9
    settled: int = 3
    prior_ratio: float = 9.0
    remainder_prior: float = 0.0
    weight: float = 0.25
    gap_s: float = 5.0
    _shapes: dict[tuple[Shape, int], tuple[list[float], int]] = attrs.field(factory=dict)
    _prefill_ms: float | None = None
    _clock: int = 0
    _fit: _Fit | None = None
    _last_at: float | None = None
    #: After a gap: each shape's median before it, and a shape's times since (see measured).
    _before_gap: dict[tuple[Shape, int], float] = attrs.field(factory=dict)
    _since_gap: dict[tuple[Shape, int], list[float]] = attrs.field(factory=dict)

    def measured(
        self,
        ms: float,
        *,
        outputs: int,
        prefill: int = 0,
        batches: int = 1,
        singles: int = 0,
        shape: Shape | None = None,
        at: float | None = None,
    ) -> None:
        """A step of ``ms`` with ``outputs`` positions with logits and ``prefill`` prompt
        tokens, in micro-batches of ``shape`` (or ``batches``, ``singles`` of one token),
        begun at ``at`` (seconds, a monotonic clock; see :meth:`_after_gap`)."""
        if outputs <= 0 and prefill <= 0:
            return
        shape = self._shape(outputs, batches, singles, shape)
        self._clock += 1
        if at is not None:
            if self._last_at is not None and at - self._last_at > self.gap_s:
                self._before_gap = {
                    key: _median(recent) for key, (recent, _) in self._shapes.items()
                }
                self._since_gap = {}
            self._last_at = at
        if prefill:
            fit = self._coefficients()
            if outputs and fit is not None:
                per = max(0.0, ms - self.predict(outputs, shape=shape)) / prefill
            elif not outputs:
                per = ms / prefill
            else:
                return
            old = self._prefill_ms
            self._prefill_ms = per if old is None else old + (per - old) * self.weight
            return
        key = (shape, outputs)
        entry = self._shapes.get(key)
        recent = entry[0] if entry is not None else []
        recent.append(ms)
        del recent[: -self.samples]
        self._shapes[key] = (recent, self._clock)
        self._fit = None
        if key in self._before_gap:
            self._after_gap(key, ms)

    def _after_gap(self, key: tuple[Shape, int], ms: float) -> None:
        """After ``gap_s`` without steps (an idle engine) the machine's speed may have moved
        (other processes came or went), and the shapes measured before the gap would be
        fitted against shapes measured after it: a budget that stopped drafting while its
        plain steps got faster found drafts dearer than they were, and drafted less for a
        whole batch. So the first shape from before the gap measured ``settled`` times
        after it sets the speed: every other shape from before the gap is scaled by how
        much its median moved, and it keeps only its times since."""
        since = self._since_gap.setdefault(key, [])
        since.append(ms)
        if len(since) < self.settled:
            return
        ratio = _median(since) / self._before_gap[key] if self._before_gap[key] > 0 else 1.0
        for other in self._before_gap:
            entry = self._shapes.get(other)
            if entry is None:
                continue
            recent, at = entry
            if other == key:
                self._shapes[other] = (list(since), at)
            else:
                self._shapes[other] = ([t * ratio for t in recent], at)
        if self._prefill_ms is not None:
            self._prefill_ms *= ratio
        self._before_gap, self._since_gap = {}, {}

    @staticmethod
    def _shape(outputs: int, batches: int, singles: int, shape: Shape | None) -> Shape:
        if shape is None:
            batches = max(1, batches)
            shape = Shape(batches, min(max(0, singles), batches, outputs))
        return shape

    def _coefficients(self) -> _Fit | None:
        """The fit to the shapes measured within the horizon (None while there are none)."""
        oldest = self._clock - self.horizon
        stale = [key for key, (_, at) in self._shapes.items() if at < oldest]
        for key in stale:
            del self._shapes[key]
            self._fit = None
        if self._fit is not None or not self._shapes:
            return self._fit
        rows = []
        for (shape, outputs), (recent, _) in self._shapes.items():
            rows.append((shape, float(outputs), _median(recent), float(len(recent))))
        # A shape seen once or twice may be a stalled step: it takes part once it has a
        # median of three (unless nothing has yet).
        settled = [row for row in rows if row[3] >= self.settled]
        rows = settled or rows
        only = [(s, m, w) for s, _, m, w in rows if s.singles == s.batches]
        single = (
            sum(w * m for _, m, w in only) / sum(w * s.singles for s, _, w in only)
            if only
            else None
        )
        # The other shapes' micro-batches of BLOCK tokens or more, what the others cost
        # taken off (every micro-batch, while ``single`` is not known).
        lines: list[tuple[list[float], float, float]] = []
        for s, p, m, w in rows:
            if single is None:
                lines.append(([float(s.batches), float(s.partial), p], m, w))
            elif s.long:
                ones = s.singles + s.short_tokens
                lines.append(
                    ([float(s.long), float(s.partial), max(0.0, p - ones)], m - single * ones, w)
                )
        gemv = self.remainder_prior * single if single is not None else 0.0
        fit = self._terms(lines, single, gemv) if lines else None
        if fit is None:
            # One line through them, split by the prior (with only steps of one token
            # measured, through those), the prior remainder taken off.
            split = [(x[0], x[2], y - gemv * x[1], w) for x, y, w in lines] or [
                (float(s.batches), p, m, w) for s, p, m, w in rows
            ]
            base, position = self._split(split)
            fit = _Fit(base, gemv, position, single)
        self._fit = fit
        return fit

    @staticmethod
    def _terms(
        lines: list[tuple[list[float], float, float]], single: float | None, gemv: float = 0.0
    ) -> _Fit | None:
        """``base``, ``gemv`` and ``position`` where the rows tell them apart with no
        negative term and a positive cost a position; else, with a prior ``gemv``, ``base``
        and ``position`` over all the rows with it taken off; without one, over the rows
        without a remainder (all of them where none is without)."""
        solved = _solve(lines)
        if solved is not None and min(solved) >= 0 and solved[2] > 0:
            return _Fit(solved[0], solved[1], solved[2], single)
        if gemv > 0:
            rows = [([x[0], x[2]], y - gemv * x[1], w) for x, y, w in lines]
        else:
            whole = [row for row in lines if row[0][1] == 0] or lines
            rows = [([x[0], x[2]], y, w) for x, y, w in whole]
        solved = _solve(rows)
        if solved is not None and min(solved) >= 0 and solved[1] > 0:
            return _Fit(solved[0], gemv, solved[1], single)
        return None

    def _split(self, rows: list[tuple[float, float, float, float]]) -> tuple[float, float]:
        """One line through ``(micro-batches, positions, ms, weight)`` rows, its cost split
        by the prior."""
        r = self.prior_ratio
        num = sum(w * (r * u + p) * m for u, p, m, w in rows)
        den = sum(w * (r * u + p) ** 2 for u, p, _, w in rows)
        position = max(0.0, num / den) if den > 0 else 0.0
        return r * position, position

    @property
    def spread(self) -> float:
        """How far apart the steps of one shape come out: each settled shape's
        interquartile range of its recent times over their median, averaged over the shapes
        weighted by their samples (0 while none is settled). On a quiet machine a few
        percent; where other processes come and go, tens (measured: ``benchmarks/
        step_profile.py`` prints a step's interquartile range beside its median). A
        prediction made from these medians is off by about as much, which is what a plan's
        gain must clear (:func:`plan_drafts`' margin)."""
        total = weight = 0.0
        for recent, _ in self._shapes.values():
            if len(recent) < self.settled:
                continue
            ordered = sorted(recent)
            n = len(ordered)
            middle = ordered[n // 2]
            if middle <= 0:
                continue
            total += len(ordered) * (ordered[(3 * n) // 4] - ordered[n // 4]) / middle
            weight += len(ordered)
        return total / weight if weight else 0.0

    @property
    def known(self) -> bool:
        return self._coefficients() is not None

    @property
    def coefficients(self) -> tuple[float, float]:
        """The fitted ``(fixed, position)`` ms, ``fixed`` a micro-batch of whole blocks
        (zeros while nothing was measured)."""
        fit = self._coefficients()
        return (fit.base, fit.position) if fit is not None else (0.0, 0.0)

    @property
    def remainder(self) -> float:
        """The fitted ms a micro-batch's remainder past whole blocks adds (``gemv``)."""
        fit = self._coefficients()
        return fit.gemv if fit is not None else 0.0

    @property
    def single(self) -> float:
        """The fitted ms of a micro-batch of one token (``fixed + position`` while no step
        of those only was measured; zero while nothing was)."""
        fit = self._coefficients()
        if fit is None:
            return 0.0
        return fit.single if fit.single is not None else fit.base + fit.position

    def predict(
        self,
        outputs: int,
        prefill: int = 0,
        batches: int = 1,
        singles: int = 0,
        *,
        shape: Shape | None = None,
    ) -> float:
        """The expected ms of a step with ``outputs`` positions with logits in micro-batches
        of ``shape`` (or ``batches``, ``singles`` of them of one token), and ``prefill``
        prompt tokens (0 when nothing was measured)."""
        fit = self._coefficients()
        if fit is None:
            return 0.0
        decode = 0.0
        if outputs > 0:
            s = self._shape(outputs, batches, singles, shape)
            if fit.single is None:
                decode = fit.base * s.batches + fit.gemv * s.partial + fit.position * outputs
            else:
                ones = s.singles + s.short_tokens
                decode = fit.single * ones + fit.base * s.long + fit.gemv * s.partial
                decode += fit.position * max(0, outputs - ones)
        return decode + prefill * (self._prefill_ms or 0.0)
