"""The prompt-reuse policy, without a model: token ids in, decisions out.

A small simulation stands in for llama.cpp's memory (each slot holds a list of token ids;
a snapshot is a copy of one) and carries the decisions out the way the decode thread does;
the properties check that a sequence only ever starts on memory that holds exactly its
prompt's first ``keep`` tokens.
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

from llmtrio.engine.generate._prompt_cache import PromptCache, common_prefix
from llmtrio.engine.generate._scheduler import Prefill, Scheduler, Start

BYTES_PER_TOKEN = 10


@attrs.define
class Memory:
    """What llama.cpp would hold, driven by a PromptCache's decisions."""

    cache: PromptCache
    slots: dict[int, list[int]] = attrs.field(factory=dict)
    snapshots: dict[int, list[int]] = attrs.field(factory=dict)

    def run(
        self,
        prompt: list[int],
        *,
        generated: int = 0,
        hints: tuple[int, ...] = (),
        reuse: bool = True,
    ) -> int:
        """Start ``prompt`` on a slot, ingest it (snapshots included), generate ``generated``
        tokens and end; returns the tokens reused."""
        plan = self.cache.assign(prompt, hints=hints, reuse=reuse)
        held = self.slots.get(plan.seq, [])
        if plan.save is not None:
            assert list(plan.save) == held, "save names what the slot holds"
            self.store(list(plan.save))
        if plan.restore is not None:
            held = list(self.snapshots[plan.restore])
        if not self.cache.cut_anywhere:
            # Recurrent memory: all or nothing.
            assert plan.keep in (0, len(held))
        held = held[: plan.keep]
        assert held == prompt[: plan.keep], "reused memory must hold the prompt's prefix"
        assert plan.keep < len(prompt), "at least one token is ingested"
        for point in plan.snapshot_at:
            assert plan.keep < point < len(prompt)
            self.store(prompt[:point])
        held = prompt + [1000 + i for i in range(generated)]
        self.slots[plan.seq] = held
        self.cache.released(plan.seq, held)
        return plan.keep

    def store(self, tokens: list[int]) -> None:
        entry, evicted = self.cache.stored(tokens, BYTES_PER_TOKEN * len(tokens))
        for old in evicted:
            del self.snapshots[old]
        if entry is not None:
            self.snapshots[entry] = tokens
        assert self.cache.bytes_used <= self.cache.budget_bytes
        kept = sum(BYTES_PER_TOKEN * len(t) for t in self.snapshots.values())
        assert self.cache.bytes_used == kept


def attention(slots: int = 2, budget: int = 10_000, **kwargs: object) -> Memory:
    return Memory(PromptCache(slots, cut_anywhere=True, budget_bytes=budget, **kwargs))  # type: ignore[arg-type]


def recurrent(slots: int = 2, budget: int = 10_000, **kwargs: object) -> Memory:
    return Memory(PromptCache(slots, cut_anywhere=False, budget_bytes=budget, **kwargs))  # type: ignore[arg-type]


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_common_prefix() -> None:
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    assert common_prefix(a, np.array([1, 2, 9], dtype=np.int32)) == 2
    assert common_prefix(a, a[:2]) == 2
    assert common_prefix(a, np.array([], dtype=np.int32)) == 0
    assert common_prefix(a, np.array([7], dtype=np.int32)) == 0


def test_the_next_turn_reuses_the_previous_prompt_and_answer() -> None:
    memory = attention(slots=1)
    first = tokens(100)
    assert memory.run(first, generated=5) == 0
    second = [*first, 1000, 1001, 1002, *tokens(20, 500)]  # 3 tokens of the answer, then new
    assert memory.run(second) == 103
    assert memory.cache.hits == 1 and memory.cache.reused_tokens == 103


def test_one_differing_token_reuses_only_the_common_part() -> None:
    memory = attention(slots=1)
    first = tokens(100)
    memory.run(first)
    changed = list(first)
    changed[40] = 9999
    assert memory.run(changed) == 40
    # The cut-off rest was saved before the slot was cut: the original prompt is whole again.
    assert memory.run([*first, 5]) == 100


def test_the_same_prompt_again_ingests_its_last_token() -> None:
    memory = attention(slots=1)
    memory.run(tokens(50))
    assert memory.run(tokens(50)) == 49


def test_a_request_that_asks_for_no_reuse_ingests_its_whole_prompt() -> None:
    """``cache_prompt: false``: nothing reused, but what the slot held is still saved for
    the requests that do reuse."""
    for memory in (attention(slots=1), recurrent(slots=1)):
        first = tokens(100)
        memory.run(first, generated=3)
        assert memory.run([*first, 1000, 1001, 1002, 7], reuse=False) == 0
        assert memory.cache.hits == 0
        assert memory.run([*first, 1000, 1001, 1002, 8]) == 103
        assert memory.cache.hits == 1


def test_an_unrelated_prompt_reuses_nothing() -> None:
    memory = attention(slots=1)
    memory.run(tokens(100))
    assert memory.run(tokens(100, start=200)) == 0
    assert memory.cache.hits == 0


def test_a_prompt_lands_on_the_slot_that_holds_its_prefix() -> None:
    memory = attention(slots=3, budget=0)
    memory.run(tokens(80, start=0))
    memory.cache.assign(tokens(80, start=500))  # busy: slot 1 now
    plan = memory.cache.assign([*tokens(80, start=0), 7])
    assert plan.seq == 0 and plan.keep == 80


def test_a_shared_prefix_is_restored_into_other_slots() -> None:
    memory = attention(slots=4)
    system = tokens(300)
    memory.run(system + tokens(10, 1000), generated=4)  # the warm request
    cache = memory.cache
    plans = []
    for i in range(4):  # all four running at once
        plan = cache.assign(system + tokens(10, 2000 + 100 * i))
        if plan.save is not None:
            memory.store(list(plan.save))
        plans.append(plan)
    assert [p.keep for p in plans] == [300] * 4
    assert plans[0].restore is None and plans[0].save is not None  # cut: saved first
    assert all(p.restore is not None for p in plans[1:])
    assert len({p.seq for p in plans}) == 4


def test_recurrent_memory_reuses_only_whole_states() -> None:
    memory = recurrent(slots=1)
    first = tokens(100)
    memory.run(first, generated=3)
    # Extends everything the slot holds: reused whole.
    assert memory.run([*first, 1000, 1001, 1002, 7, 8]) == 103
    # Shares only part of it, no snapshot there: nothing.
    changed = list(first)
    changed[50] = 9999
    assert memory.run(changed) == 0


def test_recurrent_memory_is_snapshotted_at_the_hints() -> None:
    memory = recurrent(slots=2)
    system = tokens(200)
    prompt = system + tokens(30, 1000)
    plan = memory.cache.assign(prompt, hints=(200, 230, 5, 400))
    # Inside the prompt, after what is reused, worth keeping.
    assert plan.snapshot_at == (200,)
    memory.cache.released(plan.seq, ())
    memory.run(prompt, hints=(200,))
    assert memory.run(system + tokens(30, 3000)) == 200
    # A prompt that differs inside the snapshot's prefix cannot use it.
    other = list(system)
    other[199] = 9999
    assert memory.run(other + tokens(30, 3000)) == 0


def test_a_snapshot_is_taken_once() -> None:
    memory = recurrent(slots=1)
    memory.run([*tokens(200), 1], hints=(200,))
    taken = memory.cache.snapshots
    plan = memory.cache.assign([*tokens(200), 2], hints=(200,))
    assert plan.keep == 200 and plan.snapshot_at == ()
    assert memory.cache.snapshots == taken


def test_a_short_prefix_holding_an_image_is_saved_and_restored() -> None:
    """Fewer tokens than ``min_snapshot`` and ``min_restore``, but an image among them (its
    placeholder ids are negative): saved when another prompt cuts the slot, restored after."""
    memory = attention(slots=1)
    image = [1, 2, *range(-10, -26, -1), 3, 4]
    conversation = [*image, *tokens(20, 100)]
    memory.run(conversation, generated=2)
    # another prompt sharing the first two tokens takes the slot: the conversation is saved
    memory.run([1, 2, *tokens(30, 500)])
    assert memory.cache.entries == 1
    assert memory.run([*conversation, 1000, 1001, 7]) == len(conversation) + 2
    # without an image, so few tokens are not worth a snapshot
    plain = attention(slots=1)
    plain.run([1, 2, *tokens(40, 100)], generated=2)
    plain.run([1, 2, *tokens(30, 500)])
    assert plain.cache.entries == 0


def test_the_budget_evicts_least_recently_used_first() -> None:
    memory = attention(slots=1, budget=BYTES_PER_TOKEN * 250)
    a, b, c = tokens(100, 0), tokens(100, 1000), tokens(100, 2000)
    memory.run(a)
    memory.run(b)  # a is saved: 100 tokens
    memory.run(c)  # b is saved: 200
    assert memory.run([*a, 1]) == 100  # a restored (c saved: over budget, so ...)
    # ... the least recently used, b, went; a was used last and stays.
    assert memory.cache.evictions == 1
    assert memory.run([*b, 1]) == 0
    assert memory.cache.bytes_used <= memory.cache.budget_bytes


def test_a_snapshot_larger_than_the_budget_is_not_kept() -> None:
    memory = attention(slots=1, budget=BYTES_PER_TOKEN * 50)
    memory.run(tokens(100))
    memory.run(tokens(100, 1000))
    assert memory.cache.entries == 0 and memory.cache.bytes_used == 0


def test_a_zero_budget_keeps_no_snapshots_but_slots_still_reuse() -> None:
    memory = recurrent(slots=1, budget=0)
    plan = memory.cache.assign(tokens(200), hints=(100,))
    assert plan.snapshot_at == () and plan.save is None
    memory.slots[plan.seq] = tokens(200)
    memory.cache.released(plan.seq, tokens(200))
    assert memory.run(tokens(210)) == 200
    assert memory.cache.entries == 0


def test_disabled_reuses_nothing_and_keeps_nothing() -> None:
    memory = attention(slots=2, enabled=False)
    memory.run(tokens(100))
    plan = memory.cache.assign(tokens(120))
    assert plan.keep == 0 and plan.save is None and plan.restore is None
    assert plan.seq == 0
    assert memory.cache.entries == 0


@settings(max_examples=200, deadline=None)
@given(
    cut_anywhere=st.booleans(),
    slots=st.integers(1, 3),
    budget_tokens=st.integers(0, 400),
    runs=st.lists(
        st.tuples(
            st.integers(0, 3),  # which base prompt
            st.integers(0, 60),  # where it is changed (or cut)
            st.integers(1, 40),  # how many new tokens follow
            st.integers(0, 5),  # tokens generated
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_reuse_only_ever_starts_on_the_prompts_own_prefix(
    cut_anywhere: bool,
    slots: int,
    budget_tokens: int,
    runs: list[tuple[int, int, int, int]],
) -> None:
    """Whatever the order of prompts, each reuses memory that holds exactly its first
    ``keep`` tokens (checked in Memory.run), and the snapshots fit the budget."""
    memory = Memory(
        PromptCache(
            slots,
            cut_anywhere=cut_anywhere,
            budget_bytes=BYTES_PER_TOKEN * budget_tokens,
            min_restore=1,
            min_snapshot=1,
        )
    )
    bases = [tokens(60, 100 * i) for i in range(4)]
    for base, cut, new, generated in runs:
        prompt = bases[base][:cut] + tokens(new, 5000 + 50 * len(memory.slots))
        memory.run(prompt, generated=generated, hints=(cut // 2, cut))


def test_the_scheduler_starts_after_the_reused_tokens_and_stops_at_snapshots() -> None:
    s = Scheduler(max_inflight=2, prefill_chunk=64)
    s.add(0, 300)
    starts = {0: Start(reused=100, stops=(120, 200))}
    plan = s.schedule(starts.__getitem__)
    assert plan.admitted == (0,)
    assert plan.prefill == (Prefill(0, 100, 20),)
    chunks = [s.schedule().prefill for _ in range(4)]
    assert chunks == [
        (Prefill(0, 120, 64),),
        (Prefill(0, 184, 16),),
        (Prefill(0, 200, 64),),
        (Prefill(0, 264, 36),),
    ]
    assert s.schedule().decode == (0,)


def test_the_save_before_a_restore_never_evicts_the_snapshot_restored() -> None:
    memory = attention(slots=1, budget=BYTES_PER_TOKEN * 150)
    a, b = tokens(100, 0), tokens(100, 1000)
    memory.run(a)
    memory.run(b)  # a is saved
    # a is restored into the slot that holds b: b is saved first, and there is room for
    # one of the two only; a, about to be restored, stays.
    assert memory.run([*a, 1]) == 100
    assert memory.cache.entries == 1
