"""How often a sequence's drafts are right (:class:`Acceptance`): one per sequence, and one
per core that they all count into. Rates are kept by the length of the n-gram a draft was
found with, and apart while the sequence is on a run; they forget with every verified token
and drift back to the prior (the core's rates) while the sequence does not draft, so a
sequence whose drafts kept failing stops drafting for a while and then tries again.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ._ngram import AGREED_MATCH, CONTESTED_MATCH, POOL_MATCH

__all__ = ["Acceptance"]


#: Prior per-token acceptance by n-gram length (1, 2, 3, 4+), then where two continuations
#: a grammar takes agree (an :data:`AGREED_MATCH`: as a 4-gram's; most are a JSON key the
#: worked examples all write, whatever n-gram found them), then where the n-gram's last
#: two occurrences part at once (a :data:`CONTESTED_MATCH`: as a 3-gram's, low enough that
#: one stream does not draft on it before it has earned it: free chat's right ones put a
#: sequence on a run through its shadow drafts), then from the pool (a
#: :data:`POOL_MATCH`), then on a run (the last
#: draft was right to its end): the chance a draft token is right given that the ones before
#: it were, before anything was measured. Drafting is what measures them, so they sit at the
#: low end of what was measured on the benchmarks' workloads (per token: free chat 0.95,
#: rewrite 0.85-0.99, json_schema extraction 0.66-0.86): with gemma's costs on two cores
#: (:class:`StepCosts`) one stream's drafts pay from about 0.8, and a prior below that
#: would never draft, so never learn. A run's is the highest: on a run the drafts priced by
#: it are long (where a run's drafts are no likelier right, its bucket learns that within a
#: draft or two).
_PRIOR = (0.3, 0.5, 0.7, 0.85, 0.85, 0.7, 0.85, 0.9)
_NGRAM = 4  # buckets by n-gram length
_RUN = len(_PRIOR) - 1
_POOL = _RUN - 1
_CONTESTED = _POOL - 1
_AGREED = _CONTESTED - 1


@attrs.define
class Acceptance:
    """One sequence's per-token acceptance rate of drafts, by n-gram length, and apart from
    those while it is on a run.

    Each bucket is a success/trial count that decays by ``memory`` per verified token, so the
    rate follows the last few dozen tokens; a step without drafting moves every bucket
    ``relax`` of the way back to its prior (a sequence whose drafts failed stops drafting, and
    tries again some steps later).

    A run: the sequence's last draft was right to its end. Acceptance is not geometric on
    text the output copies (a rewrite, an edit, a quoted field): once a copy is on track the
    next token is far likelier right than a first draft token is, so drafts made on a run are
    counted in their own bucket, which on such text learns rates near 1 and lets the budget
    draft long (llama.cpp's n-gram modes draft 40-60 tokens there); the first wrong token or
    a step without drafts ends the run. A contested draft (:data:`CONTESTED_MATCH`) starts
    where the copied text forks, so it keeps its own bucket on a run too.

    ``shared``: the core's own :class:`Acceptance`, which every sequence's verifications
    also count into (bucket by bucket) and which stands in for the prior: a sequence starts
    from, and drifts back to, the rates the core's earlier sequences earned, so a fresh
    request on copy-like text drafts long from its first run instead of relearning it
    within a reply that may end first. The shared one drifts back to the fixed prior, once
    a step in which a sequence drafted nothing.
    """

    memory: float = 0.9
    relax: float = 0.05
    prior_weight: float = 2.0
    shared: Acceptance | None = None
    _hits: list[float] = attrs.field(init=False)
    _trials: list[float] = attrs.field(init=False)
    _run: bool = attrs.field(init=False, default=False)  # see :attr:`on_run`

    def __attrs_post_init__(self) -> None:
        self._hits = [p * self.prior_weight for p in self._priors()]
        self._trials = [self.prior_weight] * len(_PRIOR)

    def _priors(self) -> list[float]:
        if self.shared is None:
            return list(_PRIOR)
        return [self.shared._rate(b) for b in range(len(_PRIOR))]

    def _rate(self, b: int) -> float:
        return self._hits[b] / self._trials[b]

    def _count(self, b: int, drafted: int, accepted: int) -> None:
        for i in range(min(drafted, accepted + 1)):
            self._hits[b] = self._hits[b] * self.memory + (1.0 if i < accepted else 0.0)
            self._trials[b] = self._trials[b] * self.memory + 1.0

    def _relax(self, priors: Sequence[float]) -> None:
        for b, prior in enumerate(priors):
            rate = self._rate(b)
            rate += (prior - rate) * self.relax
            self._hits[b] = rate * self._trials[b]

    def _bucket(self, n: int) -> int:
        # A contested draft starts where the text it copies forks: a run does not carry
        # over it (on a run it was priced as a copy on track, and a record's value after
        # the key the examples also have was drafted 15 tokens long, and wrong).
        if n == CONTESTED_MATCH:
            return _CONTESTED
        if self._run:
            return _RUN
        if n == POOL_MATCH:
            return _POOL
        if n == AGREED_MATCH:
            return _AGREED
        return min(max(n, 1), _NGRAM) - 1

    @property
    def on_run(self) -> bool:
        """Whether the last draft was right to its end (and no step without drafts since)."""
        return self._run

    def rate(self, n: int) -> float:
        return self._rate(self._bucket(n))

    def verified(self, n: int, drafted: int, accepted: int) -> None:
        """``accepted`` of ``drafted`` tokens found with an ``n``-gram were right (the first
        wrong one ends the count: those after it say nothing)."""
        b = self._bucket(n)
        self._count(b, drafted, accepted)
        if self.shared is not None:
            self.shared._count(b, drafted, accepted)
        self._run = drafted > 0 and accepted >= drafted

    def back_on_track(self) -> None:
        """A draft the budget did not verify was right to its end, judged against what the
        sequence emitted (``DraftBudget``'s shadow drafts): a copy is on track again, the
        sequence is on a run. Its rates do not count it: tokens a draft's first few get
        right say little of the ones after them (a JSON key's quote and newline are right
        where the key after them is not), and rates raised by them drafted where drafts
        failed (extraction, measured: 0.95x against 1.2x the step without drafts)."""
        self._run = True

    def idle(self) -> None:
        """A step in which the sequence drafted nothing (the shared one drifts back once a
        step: its owner, the generating core's ``DraftBudget``, calls this on it)."""
        self._run = False
        self._relax(self._priors())
