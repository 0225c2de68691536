"""A generation's reasoning budget (:class:`ThinkBudget`): how many tokens it may still write
inside its think block before the engine closes the block itself. Pure: token ids in, the
token to force out; the decode-step core carries it out (``_core.py``: the sampler takes the
forced token at its position, as if picked; ``_drafting.py``: a draft that would cross the
budget is cut at it, the marker put in its place).

llama.cpp's ``common/reasoning-budget.cpp`` is the same machine (idle, counting, waiting for a
whole character, forcing, done), kept as a sampler in the chain; here it is a value beside the
sampler, so that drafts can be cut by it. The two differ in two ways: the budget is one for
the whole generation (a second think block the model opens gets what the first left, so a
budget bounds all of the reasoning, as Anthropic's ``budget_tokens`` does; llama.cpp gives
each block a fresh budget), and the marker forced is the one ``</think>`` token, no message
before it.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

__all__ = ["ThinkBudget", "ThinkMarkers", "think_markers"]


@attrs.frozen
class ThinkMarkers:
    """The single tokens that open and close a think block (``<think>``, ``</think>``)."""

    open: int
    close: int


def think_markers(tokenize: Callable[[str], list[int]]) -> ThinkMarkers | None:
    """The model's think markers, where each tag is one token of its vocabulary (as the
    engine finds its think and tool-call tags); ``None`` for a model without them, whose
    generations' reasoning budgets are ignored."""
    opening, closing = tokenize("<think>"), tokenize("</think>")
    if len(opening) != 1 or len(closing) != 1:
        return None
    return ThinkMarkers(opening[0], closing[0])


@attrs.define
class ThinkBudget:
    """At most ``budget`` reasoning tokens for one generation.

    ``thinking``: the generation is inside a think block (it starts so when its prompt left
    one open). :meth:`feed` each token the generation emits, in order; :meth:`forced` says
    whether the next one must be the close marker. Once ``budget`` tokens were spent inside
    think blocks, the next token is the marker, unless the last one left a character
    unfinished (``unfinished(token)``: its text ends inside a UTF-8 sequence): then the
    tokens that finish it go first, as llama.cpp does, so the reasoning never ends in a
    broken character. A budget of 0 closes a block as soon as it opens.
    """

    budget: int
    markers: ThinkMarkers
    thinking: bool = False
    unfinished: Callable[[int], bool] = attrs.field(default=lambda token: False, repr=False)
    #: Reasoning tokens spent so far, in every block.
    spent: int = 0
    #: The last reasoning token left a character unfinished.
    _split: bool = False
    #: Times the marker was forced.
    forced_count: int = 0

    def forced(self) -> int | None:
        """The token the next position must take (the close marker), or ``None``."""
        if self.thinking and self.spent >= self.budget and not self._split:
            return self.markers.close
        return None

    def room(self) -> int | None:
        """How many tokens the generation may write freely before one is forced (``None``:
        no limit now; 0: the next one is forced)."""
        if not self.thinking:
            return None
        if self.spent >= self.budget and self._split:
            return None  # finishing a character: the count is over, its end unknown
        return max(0, self.budget - self.spent)

    def cut(self, draft: list[int]) -> list[int]:
        """``draft`` (the tokens guessed for the next positions) cut where it would cross
        the budget: at the first position whose token is forced and drafted otherwise, the
        forced marker there and nothing after it (every draft token up to it can still be
        accepted, the marker surely is)."""
        markers = self.markers
        if markers.open not in draft and markers.close not in draft:  # the common case
            if not self.thinking:
                return draft
            room = self.room()
            if room is not None and len(draft) <= room:
                return draft
            if room is not None and (room == 0 or not self.unfinished(draft[room - 1])):
                return [*draft[:room], markers.close]
        state = attrs.evolve(self)
        for at, token in enumerate(draft):
            forced = state.forced()
            if forced is not None and token != forced:
                return [*draft[:at], forced]
            state.feed(token)
        return draft

    def feed(self, token: int, *, forced: bool = False) -> None:
        """The generation emitted ``token`` (``forced``: the marker :meth:`forced` asked
        for)."""
        markers = self.markers
        if not self.thinking:
            self.thinking = token == markers.open
            return
        if token == markers.close:
            self.thinking = self._split = False
            self.forced_count += forced
            return
        self.spent += 1
        if self.spent >= self.budget:
            self._split = self.unfinished(token)
