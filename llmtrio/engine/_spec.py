"""Speculative decoding's policy: n-gram drafts (prompt lookup) and how many to verify.

Pure: token ids and measured step times in, draft tokens and draft lengths out; no llama.cpp.
The decode-step core (``_core.py``) carries it out: each decoding sequence's drafts go into
the one batched ``llama_decode`` of the step with logits on every position, and each
position's logits are sampled in turn, as they would be without speculation, until a sample
differs from the draft (vLLM's "prompt lookup", llama.cpp's ``ngram-simple``).

Three parts:

- :class:`NgramDrafter` (one per sequence): the tokens that followed the latest earlier
  occurrence of the sequence's last ``n`` tokens in its own prompt and output, for the longest
  ``n`` (up to ``max_n``) that occurred before.
- :class:`Acceptance` (one per sequence): how often its drafts were right, by the length of
  the n-gram they were found with; it forgets with every verified token, and drifts back to
  its prior while the sequence does not draft, so a sequence whose drafts kept failing stops
  drafting for a while and then tries again.
- :class:`StepCosts` and :func:`plan_drafts`: a step's cost, measured, as a function of the
  positions with logits in its batch, and the draft lengths that maximize the expected
  tokens per second of the whole step (never over ``target_step_ms`` when it is set).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs

__all__ = ["Acceptance", "Candidate", "NgramDrafter", "StepCosts", "plan_drafts", "verify"]


class NgramDrafter:
    """Prompt lookup over one sequence's tokens (its prompt, then every token it emits).

    For each ``n`` in ``min_n..max_n`` a table maps each n-gram to where the tokens that
    followed its latest occurrence start; :meth:`propose` looks the sequence's last ``n``
    tokens up, longest first. Building the table is one pass in C (``dict(zip(...))``);
    each token emitted later adds ``max_n - min_n + 1`` entries.
    """

    def __init__(self, tokens: Sequence[int], *, max_n: int = 4, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self._tokens = list(tokens)
        self._sizes = range(max_n, min_n - 1, -1)
        # n -> {n-gram: the index where what followed its latest occurrence starts}; the
        # n-gram that ends the sequence has no continuation yet, so it is not in the table.
        self._tables: dict[int, dict[tuple[int, ...], int]] = {}
        t = self._tokens
        end = len(t) - 1  # the last token: what follows it is not known yet
        for n in self._sizes:
            count = end - n + 1  # n-grams starting at 0 .. end - n
            if count <= 0:
                self._tables[n] = {}
                continue
            grams = zip(*(t[j : j + count] for j in range(n)), strict=True)
            self._tables[n] = dict(zip(grams, range(n, end + 1), strict=True))

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens the sequence emitted."""
        t = self._tokens
        for token in tokens:
            end = len(t)  # the n-grams ending here now get a continuation: ``token``
            t.append(token)
            for n in self._sizes:
                if end >= n:
                    self._tables[n][tuple(t[end - n : end])] = end

    def propose(self, limit: int) -> tuple[list[int], int]:
        """Up to ``limit`` tokens that may come next, and the length of the n-gram they
        were found with (0 and no tokens when the last tokens never occurred before)."""
        t = self._tokens
        if limit <= 0:
            return [], 0
        for n in self._sizes:
            if len(t) <= n:
                continue
            start = self._tables[n].get(tuple(t[-n:]))
            if start is not None:
                return t[start : start + limit], n
        return [], 0


#: Prior per-token acceptance by n-gram length (1, 2, 3, 4+): the chance a draft token is
#: right given that the ones before it were, before anything was measured.
_PRIOR = (0.3, 0.5, 0.6, 0.7)


@attrs.define
class Acceptance:
    """One sequence's per-token acceptance rate of drafts, by n-gram length.

    Each bucket is a success/trial count that decays by ``memory`` per verified token, so the
    rate follows the last few dozen tokens; a step without drafting moves every bucket
    ``relax`` of the way back to its prior (a sequence whose drafts failed stops drafting, and
    tries again some steps later).
    """

    memory: float = 0.9
    relax: float = 0.05
    prior_weight: float = 2.0
    _hits: list[float] = attrs.field(init=False)
    _trials: list[float] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._hits = [p * self.prior_weight for p in _PRIOR]
        self._trials = [self.prior_weight] * len(_PRIOR)

    @staticmethod
    def _bucket(n: int) -> int:
        return min(max(n, 1), len(_PRIOR)) - 1

    def rate(self, n: int) -> float:
        b = self._bucket(n)
        return self._hits[b] / self._trials[b]

    def verified(self, n: int, drafted: int, accepted: int) -> None:
        """``accepted`` of ``drafted`` tokens found with an ``n``-gram were right (the first
        wrong one ends the count: those after it say nothing)."""
        b = self._bucket(n)
        for i in range(min(drafted, accepted + 1)):
            self._hits[b] = self._hits[b] * self.memory + (1.0 if i < accepted else 0.0)
            self._trials[b] = self._trials[b] * self.memory + 1.0

    def idle(self) -> None:
        """A step in which the sequence drafted nothing."""
        for b, prior in enumerate(_PRIOR):
            rate = self._hits[b] / self._trials[b]
            rate += (prior - rate) * self.relax
            self._hits[b] = rate * self._trials[b]


@attrs.define
class StepCosts:
    """A decode step's measured cost in ms as a function of the positions with logits in
    its batch (``outputs``: one per decoding sequence, plus its drafts) and the prompt
    tokens ingested with them (``prefill``).

    The cost is not smooth: llama.cpp's CPU kernels multiply one to three columns as that
    many matrix-vector products (each reads all the weights) and four or more as a
    matrix-matrix product, so on gemma-3 two positions cost about twice one and four about
    as much as three. So it is measured per count: a table keeps, for each ``outputs``
    count seen, a moving average of decode-only steps. A count not measured is predicted
    optimistically, as cheap as it could plausibly be (the cheapest measured count below it
    plus ``prior_slope`` of a position's cost for each position more, or a measured count
    above it scaled down in proportion): the budget then tries it when it might be the
    best, and the step measured puts the truth in the table. Prompt tokens add
    ``prefill_ms`` each, a moving average of what steps with prefill cost beyond their
    outputs.

    A count not measured in the last ``horizon`` steps is forgotten: the machine's load
    changes, and a draft length ruled out on a busy moment is tried again.
    """

    weight: float = 0.25
    prior_slope: float = 0.25
    horizon: int = 200
    _table: dict[int, tuple[float, int]] = attrs.field(factory=dict)
    _prefill_ms: float | None = None
    _clock: int = 0

    def measured(self, ms: float, *, outputs: int, prefill: int = 0) -> None:
        if outputs <= 0 and prefill <= 0:
            return
        self._clock += 1
        if prefill:
            if outputs and outputs in self._fresh():
                per = max(0.0, ms - self.predict(outputs)) / prefill
            elif not outputs:
                per = ms / prefill
            else:
                return
            old = self._prefill_ms
            self._prefill_ms = per if old is None else old + (per - old) * self.weight
            return
        entry = self._table.get(outputs)
        if entry is not None and self._clock - entry[1] <= self.horizon:
            ms = entry[0] + (ms - entry[0]) * self.weight
        self._table[outputs] = (ms, self._clock)

    def _fresh(self) -> dict[int, float]:
        """The counts measured within the horizon, and their cost."""
        oldest = self._clock - self.horizon
        stale = [n for n, (_, at) in self._table.items() if at < oldest]
        for n in stale:
            del self._table[n]
        return {n: ms for n, (ms, _) in self._table.items()}

    @property
    def known(self) -> bool:
        return bool(self._fresh())

    def predict(self, outputs: int, prefill: int = 0) -> float:
        """The expected ms of a step with ``outputs`` positions with logits and ``prefill``
        prompt tokens (optimistic for a count not measured; 0 when nothing was)."""
        decode = self.table(outputs).get(outputs, 0.0) if outputs > 0 else 0.0
        return decode + prefill * (self._prefill_ms or 0.0)

    def table(self, up_to: int = 0) -> dict[int, float]:
        """The predicted ms of a decode-only step for every count from 1 to ``up_to`` (or
        the largest measured): measured, or else the optimistic bound (the cheaper of the
        cheapest count below plus ``prior_slope`` of a position's cost a position, and the
        cheapest count above; below every measured count, the smallest scaled down)."""
        fresh = self._fresh()
        if not fresh:
            return {}
        counts = sorted(fresh)
        smallest = counts[0]
        slope = self.prior_slope * fresh[smallest] / smallest
        # The cheapest measured count above each n: a suffix minimum, built backwards.
        above: dict[int, float] = {}
        cheapest = math.inf
        top = max(up_to, counts[-1])
        for n in range(top, 0, -1):
            above[n] = cheapest
            if n in fresh:
                cheapest = min(cheapest, fresh[n])
        out: dict[int, float] = {}
        below = math.inf  # the cheapest bound from counts measured below
        for n in range(1, top + 1):
            below += slope
            if n in fresh:
                out[n] = fresh[n]
                below = min(below, fresh[n])
            elif n < smallest:
                out[n] = fresh[smallest] * n / smallest
            else:
                out[n] = min(below, above[n])
        return out


@attrs.frozen
class Candidate:
    """A decoding sequence's offer: ``tokens`` drafted, each right with ``rate`` given the
    ones before it were."""

    tokens: int
    rate: float


def plan_drafts(
    candidates: Sequence[Candidate],
    costs: StepCosts,
    *,
    outputs: int,
    prefill: int = 0,
    target_ms: float = 0.0,
) -> list[int]:
    """How many of each candidate's draft tokens to verify in the next step.

    The step already has ``outputs`` positions with logits (one per decoding sequence) and
    ``prefill`` prompt tokens. A sequence's ``j``-th draft token adds an expected
    ``rate ** j`` tokens (it counts only if all before it are right), and one position to the
    step. Draft tokens are taken by expected gain, best first, and the count kept is the one
    with the most expected tokens per predicted ms; with ``target_ms`` set, no count whose
    predicted step exceeds it (unless no drafts already exceed it).
    """
    gains: list[tuple[float, int]] = []
    for i, c in enumerate(candidates):
        g = 1.0
        for _ in range(c.tokens):
            g *= c.rate
            if g < 0.02:
                break
            gains.append((g, i))
    if not gains or not costs.known:
        return [0] * len(candidates)
    gains.sort(key=lambda item: -item[0])
    table = costs.table(outputs + len(gains))
    extra = costs.predict(0, prefill)
    base = table[outputs] + extra
    tokens = float(outputs)
    best_m, best_rate = 0, tokens / base if base > 0 else math.inf
    for m, (g, _) in enumerate(gains, start=1):
        tokens += g
        ms = table[outputs + m] + extra
        if target_ms > 0 and ms > target_ms:
            break
        rate = tokens / ms if ms > 0 else math.inf
        if rate > best_rate:
            best_m, best_rate = m, rate
    counts = [0] * len(candidates)
    for _, i in gains[:best_m]:
        counts[i] += 1
    return counts


def verify(
    sample: Callable[[int], int], first: int, draft: Sequence[int], ends: Callable[[int], bool]
) -> list[int]:
    """Sample the positions ``first, first + 1, ...`` in turn (the last token's, then each
    draft token's) and stop after the first sample that differs from the draft, or ends the
    generation: the tokens to emit. All but the last equal the draft."""
    out: list[int] = []
    for j in range(len(draft) + 1):
        token = sample(first + j)
        out.append(token)
        if j == len(draft) or token != draft[j] or ends(token):
            break
    return out
