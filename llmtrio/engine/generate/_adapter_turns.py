"""Which adapter set a step serves. Pure: fed with the sets that have work, no llama.cpp.

llama.cpp applies LoRA adapters per context, not per sequence: one ``llama_decode`` runs
every sequence in it under one set of adapters. The core asks :class:`AdapterTurns` before the
scheduler plans a step which set the step serves; the scheduler then plans that set's
sequences only (``Scheduler.schedule``'s ``serves``), and the others wait in their slots.

The rule, *oldest waiting work first, in turns of up to* ``quantum`` *steps*:

- a set is *ready* while one of its sequences holds a slot (decoding, or ingesting its
  prompt); a ready set has waited since the step after it was last served, or since it
  became ready;
- the set served last is served again, up to ``quantum`` steps in a row, while it is ready;
  alone ready, it is served on;
- then the step goes to the ready set that has waited longest (ties: the one with the most
  sequences, then by key);
- when no set is ready, to ``first_waiting``: the set of the request first in line for a
  slot, which the scheduler admits first.

No set starves: a ready set is served within ``(k - 1) * quantum`` steps, ``k`` the number
of sets ready meanwhile, since every set served before it has waited longer than it has,
and is then served at most ``quantum`` steps before its turn passes (``test_lora_scheduling``
checks the bound on arbitrary arrivals). A set passed over loses nothing: its sequences keep
their slots, memory, samplers and progress, and go on from where they stopped when their
set is served again. Requests are admitted to slots in arrival order whatever their set.

``quantum`` 1 (the default) alternates sets step by step: a set's streams wait at most
``k - 1`` steps between their tokens. A larger quantum pays fewer switches
(``llama_set_adapters_lora`` makes llama.cpp reserve its graph again) for longer gaps; the
switch costs less than a step (PERFORMANCE.md, "LoRA adapters"), so 1 is kept.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["AdapterTurns"]


@attrs.define
class AdapterTurns:
    """The turns of adapter sets (by their keys) over the steps (see the module)."""

    quantum: int = 1
    _current: str | None = None
    _run: int = 0
    _since: dict[str, int] = attrs.field(factory=dict)
    _step: int = 0

    def __attrs_post_init__(self) -> None:
        if self.quantum < 1:
            raise ValueError("quantum must be at least 1")

    @property
    def current(self) -> str | None:
        """The set served last (``None``: none yet)."""
        return self._current

    def choose(self, ready: Mapping[str, int], first_waiting: str | None = None) -> str | None:
        """The set this step serves, given the ``ready`` sets (key: how many sequences hold
        a slot) and the set of the request first in line for a slot; ``None`` when there is
        neither."""
        step = self._step
        self._step += 1
        for key in [key for key in self._since if key not in ready]:
            del self._since[key]
        for key in ready:
            self._since.setdefault(key, step)
        current = self._current
        if not ready:
            chosen = first_waiting
        elif current in ready and (self._run < self.quantum or len(ready) == 1):
            chosen = current
        else:
            others = [key for key in ready if key != current]
            chosen = min(others, key=lambda key: (self._since[key], -ready[key], key))
        if chosen is None:
            return None
        self._run = self._run + 1 if chosen == current else 1
        self._current = chosen
        if chosen in self._since:
            self._since[chosen] = step + 1
        return chosen
