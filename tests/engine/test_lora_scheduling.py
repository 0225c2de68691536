"""Scheduling under LoRA adapters, without a model: whose turn it is among the adapter sets
(``AdapterTurns``: oldest waiting work first, in turns of up to a quantum, starving none), the
scheduler planning one set's sequences and keeping the others' places, and the prompt cache
filing memory by adapter set."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from llmtrio.engine.generate._adapter_turns import AdapterTurns
from llmtrio.engine.generate._prompt_cache import PromptCache
from llmtrio.engine.generate._scheduler import Prefill, Scheduler


def test_ready_sets_take_turns_step_by_step_oldest_first() -> None:
    turns = AdapterTurns()
    ready = {"a": 2, "b": 1, "c": 1}
    served = [turns.choose(ready) for _ in range(6)]
    # All three became ready at once: the most sequences first, then by key; then in turn.
    assert served == ["a", "b", "c", "a", "b", "c"]


def test_a_set_alone_is_served_on_and_a_newcomer_waits_its_turn() -> None:
    turns = AdapterTurns()
    assert [turns.choose({"a": 1}) for _ in range(3)] == ["a", "a", "a"]
    # "b" arrives: it has waited since now, "a" since its last step: "b" goes next.
    assert turns.choose({"a": 1, "b": 1}) == "b"
    assert turns.choose({"a": 1, "b": 1}) == "a"
    # "a" has no more work: "b" is served on alone.
    assert [turns.choose({"b": 1}) for _ in range(2)] == ["b", "b"]


def test_a_quantum_keeps_a_set_for_that_many_steps_in_a_row() -> None:
    turns = AdapterTurns(quantum=3)
    ready = {"a": 1, "b": 1}
    assert [turns.choose(ready) for _ in range(8)] == ["a", "a", "a", "b", "b", "b", "a", "a"]
    with pytest.raises(ValueError, match="quantum"):
        AdapterTurns(quantum=0)


def test_with_nothing_ready_the_set_first_in_line_for_a_slot_is_served() -> None:
    turns = AdapterTurns()
    assert turns.choose({}, "b") == "b"
    assert turns.choose({}, None) is None
    assert turns.current == "b"


@settings(max_examples=300, deadline=None)
@given(
    quantum=st.integers(1, 4),
    steps=st.lists(
        st.dictionaries(st.sampled_from("abcde"), st.integers(1, 4), min_size=1), max_size=60
    ),
)
def test_no_ready_set_waits_more_than_the_others_turns(
    quantum: int, steps: list[dict[str, int]]
) -> None:
    """Whatever sets come and go: a set ready for a stretch of steps without being served
    waits at most ``(k - 1) * quantum`` steps, ``k`` the sets ready during the stretch; and
    every step serves a ready set."""
    turns = AdapterTurns(quantum=quantum)
    waiting: dict[str, tuple[int, set[str]]] = {}  # set -> (since, the sets ready meanwhile)
    for step, ready in enumerate(steps):
        chosen = turns.choose(ready)
        assert chosen in ready
        for key in [key for key in waiting if key not in ready]:
            del waiting[key]  # its work ended: its wait ends
        for key in ready:
            since, seen = waiting.setdefault(key, (step, set()))
            seen.update(ready)
            if key == chosen:
                del waiting[key]
            waited = step - since + (key != chosen)
            assert waited <= (len(seen) - 1) * quantum + (key == chosen), (key, step, waiting)


def test_a_step_serves_one_set_and_the_others_keep_their_place() -> None:
    """Sequences 0 and 2 are of one set, 1 of another: a step serving the first set decodes
    and ingests its sequences only, and the other set's prompt goes on where it stopped."""
    sets = {0: "a", 1: "b", 2: "a"}
    s = Scheduler(max_inflight=4, prefill_chunk=8)
    s.add(0, 3)
    s.add(1, 12)
    s.add(2, 20)
    plan = s.schedule(serves=lambda key: sets[key] == "a")
    assert plan.admitted == (0, 1, 2)  # admission is the same for every set
    assert plan.prefill == (Prefill(0, 0, 3), Prefill(2, 0, 5))
    plan = s.schedule(serves=lambda key: sets[key] == "b")
    assert plan.decode == () and plan.prefill == (Prefill(1, 0, 8),)
    plan = s.schedule(serves=lambda key: sets[key] == "a")
    assert plan.decode == (0,) and plan.prefill == (Prefill(2, 5, 8),)
    plan = s.schedule(serves=lambda key: sets[key] == "b")
    assert plan.prefill == (Prefill(1, 8, 4),)
    assert s.first_waiting is None
    s.add(3, 4)
    s.add(4, 4)
    assert s.first_waiting == 3  # first in line for the one slot left
    plan = s.schedule(serves=lambda key: sets.get(key, "c") == "c")
    assert plan.admitted == (3,) and s.first_waiting == 4
    assert plan.decode == () and plan.prefill == (Prefill(3, 0, 4),)


@pytest.mark.parametrize("cut_anywhere", [True, False])
def test_memory_is_reused_only_under_the_adapter_set_it_was_computed_under(
    cut_anywhere: bool,
) -> None:
    prompt = np.arange(100, dtype=np.int32)
    cache = PromptCache(2, cut_anywhere=cut_anywhere, budget_bytes=10_000)
    first = cache.assign(prompt, scope="a")
    cache.released(first.seq, prompt)
    # Under another set the slot's memory is no use: nothing reused, the other slot taken.
    other = cache.assign(prompt, scope="b")
    assert other.keep == 0 and other.seq != first.seq
    cache.released(other.seq, prompt[:50])
    # Under its own set it is.
    again = cache.assign(np.concatenate([prompt, [7]]), scope="a")
    assert (again.seq, again.keep) == (first.seq, 100)
    assert cache.scope(again.seq) == "a"


def test_snapshots_are_filed_and_restored_under_their_adapter_set() -> None:
    prompt = np.arange(100, dtype=np.int32)
    cache = PromptCache(1, cut_anywhere=False, budget_bytes=10_000)
    entry, _ = cache.stored(prompt, 100, "a")
    assert entry is not None
    # The same tokens under another set are no copy of those: stored too.
    other, _ = cache.stored(prompt, 100, "b")
    assert other is not None and other != entry
    # The same tokens under the same set are: not stored twice.
    assert cache.stored(prompt, 100, "a") == (None, [])
    longer = np.concatenate([prompt, np.arange(5, dtype=np.int32)])
    plan = cache.assign(longer, scope="b")
    assert (plan.restore, plan.keep) == (other, 100)
    cache.released(plan.seq, ())
    plan = cache.assign(longer, scope="c")
    assert (plan.restore, plan.keep) == (None, 0)


def test_a_cut_slot_is_saved_under_the_set_it_was_computed_under() -> None:
    """A slot whose memory a prompt of another set drops is snapshotted first, filed under
    its own set (the assignment names it)."""
    prompt = np.arange(100, dtype=np.int32)
    cache = PromptCache(1, cut_anywhere=True, budget_bytes=10_000)
    first = cache.assign(prompt, scope="a")
    cache.released(first.seq, prompt)
    plan = cache.assign(prompt, scope="b")
    assert plan.save is not None and plan.save_scope == "a" and plan.keep == 0
    cache.stored(plan.save, 100, plan.save_scope)
    cache.released(plan.seq, ())
    plan = cache.assign(np.concatenate([prompt, [1]]), scope="a")
    assert plan.restore is not None and plan.keep == 100
    assert cache.scope(plan.seq) == "a"
