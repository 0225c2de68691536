"""How much a request may reason, in one place for every API: OpenAI's ``reasoning_effort``
(chat completions) and ``reasoning.effort`` (Responses), Anthropic's ``thinking`` and
``output_config.effort``, all become a :class:`Reasoning` (thinking on or off, and a budget of
reasoning tokens after which the engine closes the think block itself). Pure.
"""

from __future__ import annotations

from typing import Final

import attrs

__all__ = ["ADAPTIVE_EFFORT", "EFFORTS", "Reasoning", "for_effort"]


@attrs.frozen
class Reasoning:
    """``think``: the template's thinking switch (``None``: the template's default);
    ``budget``: at most this many reasoning tokens (``None``: unbounded)."""

    think: bool | None = None
    budget: int | None = None


#: Each effort's budget of reasoning tokens; ``none`` and ``minimal`` turn thinking off
#: (and, where a request turns it on all the same, close the block at once), ``max`` leaves
#: it unbounded.
EFFORTS: Final[dict[str, Reasoning]] = {
    "none": Reasoning(think=False, budget=0),
    "minimal": Reasoning(think=False, budget=0),
    "low": Reasoning(think=True, budget=1024),
    "medium": Reasoning(think=True, budget=4096),
    "high": Reasoning(think=True, budget=16384),
    "xhigh": Reasoning(think=True, budget=32768),
    "max": Reasoning(think=True),
}


def for_effort(effort: str) -> Reasoning:
    """The reasoning an effort level asks for (one of :data:`EFFORTS`; the caller checks the
    value against its API's own list)."""
    return EFFORTS[effort]


#: The effort of Anthropic's ``thinking: {"type": "adaptive"}`` (and ``between_tools``) when
#: the request names none in ``output_config.effort``: the model may think, within medium's
#: budget (Anthropic's own default effort, ``high``, is 16384 tokens: too many for a local
#: model's context).
ADAPTIVE_EFFORT: Final = "medium"
