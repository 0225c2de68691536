"""Bounded integers and numbers as automata over their decimal text. Pure.

A bounded or ``multipleOf`` number is written ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?``: no exponent,
no leading zeros, at most 15 significant digits in all (an integer part longer than a bound's
is never needed; 15 digits survive a trip through a double, so a reader parsing floats sees
the same order as the exact decimal the grammar checked). An integer is written
``-?(0|[1-9][0-9]*)``, at most 15 digits or the bounds' own length. Bounds, exclusive or not,
are exact over this form; ``multipleOf`` ``m`` is exact for ``m = d / 10^k`` with an integer
``d`` up to :data:`MAX_DIVISOR` (the automaton tracks the remainder modulo ``d``, so it grows
with ``d``), and then a number has at most ``k`` decimals.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from decimal import Decimal

from ._automaton import Dfa, explore
from ._gbnf import CharSet, chars

__all__ = ["MAX_DIVISOR", "NumberRange", "divisor", "range_dfa"]

MAX_DIVISOR = 100
MAX_DIGITS = 15

_DIGITS = [chars(str(d)) for d in range(10)]
_POINT = chars(".")
_MINUS = chars("-")


def divisor(multiple: Decimal) -> tuple[int, int] | None:
    """``(d, k)`` with ``multiple == d / 10**k``, ``d`` a positive integer; ``None`` when
    ``d`` would be over :data:`MAX_DIVISOR`."""
    k = 0
    while multiple != multiple.to_integral_value():
        multiple *= 10
        k += 1
        if k > MAX_DIGITS:
            return None
    d = int(multiple)
    return (d, k) if 0 < d <= MAX_DIVISOR else None


class NumberRange:
    """``low <= x <= high`` (``<`` where exclusive; ``None``: unbounded), ``x`` a multiple of
    ``d / 10**k``; ``integer`` allows no fraction at all."""

    def __init__(
        self,
        *,
        low: Decimal | None = None,
        low_exclusive: bool = False,
        high: Decimal | None = None,
        high_exclusive: bool = False,
        multiple: tuple[int, int] = (1, MAX_DIGITS),
        integer: bool = False,
    ) -> None:
        self.low, self.low_exclusive = low, low_exclusive
        self.high, self.high_exclusive = high, high_exclusive
        self.d, self.k = multiple
        self.integer = integer

    def dfa(self) -> Dfa:
        """The decimal texts of the numbers in range (possibly none: check ``empty``)."""
        low, high = self.low, self.high
        positive = _Magnitude(
            low=max(low, Decimal(0)) if low is not None else Decimal(0),
            low_exclusive=self.low_exclusive if low is not None and low >= 0 else False,
            high=high,
            high_exclusive=self.high_exclusive,
            d=self.d,
            k=self.k,
            integer=self.integer,
        )
        parts: list[tuple[str, _Magnitude]] = []
        if high is None or high > 0 or (high == 0 and not self.high_exclusive):
            parts.append(("", positive))
        if low is None or low < 0:
            zero_allowed = high is not None and high < 0
            negative = _Magnitude(
                low=-high if high is not None and high < 0 else Decimal(0),
                low_exclusive=self.high_exclusive if zero_allowed else True,
                high=-low if low is not None else None,
                high_exclusive=self.low_exclusive,
                d=self.d,
                k=self.k,
                integer=self.integer,
            )
            parts.append(("-", negative))

        def moves(state: Hashable) -> Iterable[tuple[CharSet, Hashable]]:
            if state == "start":
                for sign, magnitude in parts:
                    if sign:
                        yield _MINUS, (1, magnitude.start())
                    else:
                        yield from ((cs, (0, s)) for cs, s in magnitude.moves(magnitude.start()))
                return
            which, inner = state  # type: ignore[misc]
            magnitude = parts[-1][1] if which else parts[0][1]
            yield from ((cs, (which, s)) for cs, s in magnitude.moves(inner))

        def accepting(state: Hashable) -> bool:
            if state == "start":
                return False
            which, inner = state  # type: ignore[misc]
            magnitude = parts[-1][1] if which else parts[0][1]
            return magnitude.accepting(inner)

        return explore("start", accepting, moves)


def _digits(value: Decimal) -> tuple[str, str]:
    """A non-negative decimal's integer digits and its fraction digits (no trailing zeros)."""
    text = f"{value:f}"
    whole, _, fraction = text.partition(".")
    return whole.lstrip("0") or "0", fraction.rstrip("0")


class _Bound:
    """Where a number being read stands against one bound ``B``: a state is ``-1``/``1``
    (settled: below/above ``B``) or ``(phase, n, 0)``: equal to ``B``'s first ``n`` digits of
    the integer part (phase 0) or of the fraction (phase 1); ``(0, n, c)`` with ``c`` -1/1
    means the first ``n`` integer digits compare so with ``B``'s (the length decides)."""

    def __init__(self, bound: Decimal) -> None:
        self.whole, self.fraction = _digits(bound)

    start: Hashable = (0, 0, 0)

    def digit(self, state: Hashable, digit: int) -> Hashable:
        if state in (-1, 1):
            return state
        phase, n, c = state  # type: ignore[misc]
        if phase == 0:
            if n >= len(self.whole):
                return 1  # longer than B's integer part: above
            if c == 0:
                c = (digit > int(self.whole[n])) - (digit < int(self.whole[n]))
            return (0, n + 1, c)
        b = int(self.fraction[n]) if n < len(self.fraction) else 0
        if digit != b:
            return 1 if digit > b else -1
        return (1, n + 1, 0)

    def point(self, state: Hashable) -> Hashable:
        if state in (-1, 1):
            return state
        _, n, c = state  # type: ignore[misc]
        if n < len(self.whole):
            return -1
        return c if c else (1, 0, 0)

    def end(self, state: Hashable) -> int:
        """-1, 0 or 1: the whole number read against ``B``."""
        state = self.point(state) if state not in (-1, 1) and state[0] == 0 else state  # type: ignore[index]
        if state in (-1, 1):
            return state  # type: ignore[return-value]
        _, n, _ = state  # type: ignore[misc]
        return -1 if self.fraction[n:].strip("0") else 0


class _Magnitude:
    """The text of a non-negative number in a range: states ``(phase, digits, frac, lo, hi,
    remainder)``; phase 0 reads the integer part, 1 the fraction, 2 is after a lone ``0``."""

    def __init__(
        self,
        *,
        low: Decimal,
        low_exclusive: bool,
        high: Decimal | None,
        high_exclusive: bool,
        d: int,
        k: int,
        integer: bool,
    ) -> None:
        self.low, self.high = _Bound(low), (_Bound(high) if high is not None else None)
        self.low_exclusive, self.high_exclusive = low_exclusive, high_exclusive
        self.d, self.k = d, k
        self.decimals = 0 if integer else k
        whole = len(self.high.whole) if self.high is not None else MAX_DIGITS
        self.max_whole = max(whole, len(self.low.whole)) if self.high is None else whole

    def start(self) -> Hashable:
        high = self.high.start if self.high is not None else None
        return (0, 0, 0, self.low.start, high, 0)

    def moves(self, state: Hashable) -> Iterable[tuple[CharSet, Hashable]]:
        phase, whole, frac, lo, hi, r = state  # type: ignore[misc]
        if phase == 0 and whole < self.max_whole:
            for digit in range(1 if whole == 0 else 0, 10):
                yield _DIGITS[digit], self._digit(state, digit)
            if whole == 0:
                zero = self._digit(state, 0)
                yield _DIGITS[0], (2, *zero[1:])  # type: ignore[index]
        room = min(self.decimals, MAX_DIGITS - max(whole, 1)) - frac
        if (phase == 2 or (phase == 0 and whole > 0)) and room > 0:
            yield _POINT, self._point(state)
        if phase == 1 and room > 0:
            for digit in range(10):
                yield _DIGITS[digit], self._digit(state, digit)

    def _digit(self, state: Hashable, digit: int) -> Hashable:
        phase, whole, frac, lo, hi, r = state  # type: ignore[misc]
        lo = self.low.digit(lo, digit)
        hi = self.high.digit(hi, digit) if self.high is not None else None
        r = (r * 10 + digit) % self.d
        return (phase, whole + 1, frac, lo, hi, r) if phase == 0 else (1, whole, frac + 1, lo, hi, r)

    def _point(self, state: Hashable) -> Hashable:
        _, whole, frac, lo, hi, r = state  # type: ignore[misc]
        hi = self.high.point(hi) if self.high is not None else None
        return (1, whole, frac, self.low.point(lo), hi, r)

    def accepting(self, state: Hashable) -> bool:
        phase, whole, frac, lo, hi, r = state  # type: ignore[misc]
        if phase == 0 and whole == 0:
            return False
        if phase == 1 and frac == 0:
            return False
        if (r * 10 ** (self.k - frac)) % self.d:
            return False
        below = self.low.end(lo)
        if below < 0 or (below == 0 and self.low_exclusive):
            return False
        if self.high is None:
            return True
        above = self.high.end(hi)
        return above < 0 or (above == 0 and not self.high_exclusive)


def range_dfa(
    *,
    low: Decimal | None,
    low_exclusive: bool,
    high: Decimal | None,
    high_exclusive: bool,
    multiple: tuple[int, int] | None,
    integer: bool,
) -> Dfa:
    """The decimal texts of the numbers in the range (see the module's notes)."""
    return NumberRange(
        low=low,
        low_exclusive=low_exclusive,
        high=high,
        high_exclusive=high_exclusive,
        multiple=multiple or (1, MAX_DIGITS),
        integer=integer,
    ).dfa()
