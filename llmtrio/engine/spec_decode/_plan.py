"""The draft budget (:func:`plan_drafts`): the draft lengths that maximize the expected
tokens per second of the whole step, priced by :class:`~.StepCosts` (none when the step is
compute-bound; never over ``target_step_ms`` when it is set).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs

from ._costs import Shape, StepCosts

__all__ = ["Candidate", "plan_drafts"]


@attrs.frozen
class Candidate:
    """A decoding sequence's offer: ``tokens`` drafted, each right with ``rate`` given the
    ones before it were; its sampler takes ``sample_ms`` a position (a sampled request runs
    its whole chain at every position it verifies: 0.1 ms greedy on gemma's 262k
    vocabulary, 0.3 with top-k 40, 12 with top-p and no top-k, here)."""

    tokens: int
    rate: float
    sample_ms: float = 0.0


def plan_drafts(
    candidates: Sequence[Candidate],
    costs: StepCosts,
    *,
    outputs: int,
    prefill: int = 0,
    target_ms: float = 0.0,
    batches: Callable[[Sequence[int]], Sequence[int] | None] | None = None,
    sampling_ms: float = 0.0,
    margin: float | None = None,
) -> list[int]:
    """How many of each candidate's draft tokens to verify in the next step.

    The step already has ``outputs`` positions with logits (one per decoding sequence) and
    ``prefill`` prompt tokens; ``batches(counts)`` is the tokens of each micro-batch the step
    runs in with ``counts`` draft tokens per candidate (:func:`micro_batch_sizes`; by default
    one micro-batch of them all; None for a plan known to run in more micro-batches than the
    step without drafts, without counting them), and ``sampling_ms``
    what sampling one position of every decoding sequence takes (a draft position adds its
    candidate's ``sample_ms``; ``costs`` are measured without sampling). A sequence's ``j``-th
    draft token adds an expected ``rate ** j`` tokens (it counts only if all before it are
    right), and one position to the step. Two families of plans are priced with the fitted
    costs: the ``m`` draft tokens of most expected gain per ms (for every ``m``), and every
    candidate's worthwhile tokens up to a common length ``k`` (equal lengths keep per-slot
    memory in one micro-batch); the plan with the most expected tokens per predicted ms of
    decoding (the prompt tokens' cost left out: they are ingested either way) wins, so a
    compute-bound step, where a position costs about what a token is worth, drafts nothing.
    With ``target_ms`` set, no plan whose predicted step (prompt tokens included) exceeds it.
    A plan never runs in more micro-batches than the step without drafts (``batches``), and
    with several sequences decoding it must beat that step's rate by ``margin``: by default
    the measured spread of the step costs (:attr:`StepCosts.spread`), what the prediction of
    either step may be off by.
    """
    gains: list[tuple[float, int]] = []
    per: list[list[float]] = [[] for _ in candidates]
    for i, c in enumerate(candidates):
        g = 1.0
        for _ in range(c.tokens):
            g *= c.rate
            if g < 0.02:
                break
            gains.append((g, i))
            per[i].append(g)
    if not gains or not costs.known:
        return [0] * len(candidates)
    # Prompt tokens are ingested with or without drafts: the rate compared is decoding's
    # (a step mostly spent on a prompt chunk would make any draft look free beside it).
    extra = costs.predict(0, prefill)
    zero = [0] * len(candidates)

    def sizes_of(counts: Sequence[int]) -> Sequence[int] | None:
        if batches is None:
            return [outputs + sum(counts) + prefill]
        return batches(counts)

    def predict(counts: Sequence[int], sizes: Sequence[int]) -> float:
        return costs.predict(outputs + sum(counts), shape=Shape.of(sizes))

    zero_sizes = sizes_of(zero)
    assert zero_sizes is not None  # the plan without drafts is the one compared against
    base_ms = predict(zero, zero_sizes) + sampling_ms
    best, best_rate = zero, outputs / base_ms if base_ms > 0 else math.inf
    # With several sequences decoding, a plan with drafts must beat the step without by
    # ``margin``: a gain of a few percent is within what the two predictions may be off by
    # (each shape's median of steps measured at other moments on a machine whose speed
    # moves), and a plan that only seems to gain loses to --no-spec. A step with drafts costs
    # what its ``llama_decode`` costs, not more (``benchmarks/step_profile.py``: the core's
    # step against the same batch decoded raw, paired, at once). One stream's drafts of 4-5
    # tokens right 94% of the time gained the 1.15x the fit predicts (free chat), so one
    # stream has none.
    if margin is None:
        margin = costs.spread
    if outputs > 1:
        best_rate *= 1.0 + margin

    def consider(counts: list[int], tokens: float) -> None:
        nonlocal best, best_rate
        sizes = sizes_of(counts)
        if sizes is None or len(sizes) > len(zero_sizes):
            return
        ms = predict(counts, sizes) + sampling_ms
        ms += sum(c.sample_ms * n for c, n in zip(candidates, counts, strict=True))
        if target_ms > 0 and ms + extra > target_ms:
            return
        rate = tokens / ms if ms > 0 else math.inf
        if rate > best_rate:
            best, best_rate = counts, rate

    # Best first: expected tokens per ms the position adds (its sampler's time included).
    fixed, position = costs.coefficients

    def worth(item: tuple[float, int]) -> float:
        cost = position + candidates[item[1]].sample_ms
        return item[0] / cost if cost > 0 else math.inf

    gains.sort(key=worth, reverse=True)
    # No plan beats the step without drafts when even the best token adds fewer tokens per
    # ms than the step gives (a plan's added tokens over its added ms is at most its best
    # token's ratio while drafts add micro-batches, never remove them, and a micro-batch
    # costs at least a position whether it holds one token or more: true but where a
    # prompt chunk happens to match a drafting sequence's length; and while no micro-batch
    # of the step has a remainder that drafts could fill to a whole block, dropping a pass):
    # the compute-bound case, decided without pricing every plan (0.3 ms instead of 7 at
    # eight sequences).
    whole = Shape.of(zero_sizes).partial == 0 or costs.remainder == 0
    if whole and worth(gains[0]) <= best_rate and position <= costs.single <= fixed + position:
        return best
    counts = list(zero)
    tokens = float(outputs)
    for g, i in gains:
        counts[i] += 1
        tokens += g
        consider(list(counts), tokens)
    for k in range(1, max(len(p) for p in per) + 1):
        uniform = [min(k, len(p)) for p in per]
        consider(uniform, outputs + sum(sum(p[:n]) for p, n in zip(per, uniform, strict=True)))
    return best
