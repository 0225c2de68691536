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

from collections.abc import Iterator
from decimal import Decimal
from typing import NamedTuple

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

        def moves(state: Reading) -> Iterator[tuple[CharSet, Reading]]:
            if isinstance(state, str):
                for n, (sign, magnitude) in enumerate(parts):
                    if sign:
                        yield _MINUS, (n, magnitude.start())
                    else:
                        for charset, inner in magnitude.moves(magnitude.start()):
                            yield charset, (n, inner)
                return
            assert not isinstance(state, str)
            n, inner = state
            for charset, after in parts[n][1].moves(inner):
                yield charset, (n, after)

        def accepting(state: Reading) -> bool:
            if isinstance(state, str):
                return False
            return parts[state[0]][1].accepting(state[1])

        start: Reading = "start"
        return explore(start, accepting, moves)


def _digits(value: Decimal) -> tuple[str, str]:
    """A non-negative decimal's integer digits and its fraction digits (no trailing zeros)."""
    whole, _, fraction = f"{value:f}".partition(".")
    return whole.lstrip("0") or "0", fraction.rstrip("0")


# Where a number being read stands against a bound B: -1 or 1 once settled (below, above),
# else (phase, n, c): equal to B's first n integer digits (phase 0) or fraction digits
# (phase 1), or, in phase 0 with c = -1/1, its first n integer digits compare so with B's
# (the length still decides).
Place = int | tuple[int, int, int]


class _Bound:
    def __init__(self, bound: Decimal) -> None:
        self.whole, self.fraction = _digits(bound)

    start: Place = (0, 0, 0)

    def digit(self, place: Place, digit: int) -> Place:
        if isinstance(place, int):
            return place
        phase, n, c = place
        if phase == 0:
            if n >= len(self.whole):
                return 1  # more integer digits than B: above
            if c == 0:
                c = (digit > int(self.whole[n])) - (digit < int(self.whole[n]))
            return (0, n + 1, c)
        b = int(self.fraction[n]) if n < len(self.fraction) else 0
        if digit != b:
            return 1 if digit > b else -1
        return (1, n + 1, 0)

    def point(self, place: Place) -> Place:
        if isinstance(place, int) or place[0] == 1:
            return place
        _, n, c = place
        if n < len(self.whole):
            return -1  # fewer integer digits than B: below
        return c if c else (1, 0, 0)

    def end(self, place: Place) -> int:
        """-1, 0 or 1: the whole number read, against B."""
        place = self.point(place)
        if isinstance(place, int):
            return place
        return -1 if self.fraction[place[1] :].strip("0") else 0


class _State(NamedTuple):
    """Reading a non-negative number: ``phase`` 0 in the integer part, 1 in the fraction,
    2 after a lone ``0``; digits read in each; places against the bounds; the remainder."""

    phase: int
    whole: int
    frac: int
    lo: Place
    hi: Place
    r: int


# The number automaton's states: the start, or which part (sign) and where in it.
Reading = str | tuple[int, _State]


class _Magnitude:
    """The texts of the non-negative numbers in a range."""

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
        if self.high is not None:
            self.max_whole = len(self.high.whole)
        else:
            self.max_whole = max(MAX_DIGITS, len(self.low.whole))

    def start(self) -> _State:
        return _State(0, 0, 0, self.low.start, self.high.start if self.high else 0, 0)

    def moves(self, state: _State) -> Iterator[tuple[CharSet, _State]]:
        if state.phase == 0 and state.whole < self.max_whole:
            for digit in range(1 if state.whole == 0 else 0, 10):
                yield _DIGITS[digit], self._digit(state, digit)
            if state.whole == 0:
                yield _DIGITS[0], self._digit(state, 0)._replace(phase=2)
        room = min(self.decimals, MAX_DIGITS - max(state.whole, 1)) - state.frac
        if room > 0 and (state.phase == 2 or (state.phase == 0 and state.whole > 0)):
            yield _POINT, self._point(state)
        if room > 0 and state.phase == 1:
            for digit in range(10):
                yield _DIGITS[digit], self._digit(state, digit)

    def _digit(self, state: _State, digit: int) -> _State:
        hi = self.high.digit(state.hi, digit) if self.high is not None else 0
        lo, r = self.low.digit(state.lo, digit), (state.r * 10 + digit) % self.d
        if state.phase == 1:
            return state._replace(frac=state.frac + 1, lo=lo, hi=hi, r=r)
        return state._replace(whole=state.whole + 1, lo=lo, hi=hi, r=r)

    def _point(self, state: _State) -> _State:
        hi = self.high.point(state.hi) if self.high is not None else 0
        return state._replace(phase=1, lo=self.low.point(state.lo), hi=hi)

    def accepting(self, state: _State) -> bool:
        if (state.phase == 0 and state.whole == 0) or (state.phase == 1 and state.frac == 0):
            return False
        if (state.r * 10 ** (self.k - state.frac)) % self.d:
            return False
        below = self.low.end(state.lo)
        if below < 0 or (below == 0 and self.low_exclusive):
            return False
        if self.high is None:
            return True
        above = self.high.end(state.hi)
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
