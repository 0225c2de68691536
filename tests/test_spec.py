"""Speculative decoding's pure policy: prompt-lookup drafts, acceptance estimates, the
measured step costs and the draft budget built on them. No model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmtrio.engine._spec import Acceptance, Candidate, NgramDrafter, StepCosts, plan_drafts


def brute_force(tokens: list[int], limit: int, max_n: int) -> tuple[list[int], int]:
    """The latest earlier occurrence of the longest suffix (up to ``max_n``), read slowly."""
    for n in range(max_n, 0, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - 1, n - 1, -1):  # never the suffix itself
            if tokens[start - n : start] == suffix:
                return tokens[start : start + limit], n
    return [], 0


def test_drafts_follow_the_latest_earlier_occurrence_of_the_longest_suffix() -> None:
    d = NgramDrafter([1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3], max_n=3)
    # "1 2 3" occurred at the start, followed by 4 9 2 ...
    assert d.propose(3) == ([4, 9, 2], 3)
    d.extend([7])
    # "3 7" never occurred; "7" neither: nothing to draft.
    assert d.propose(4) == ([], 0)
    d.extend([2, 3])
    # "7 2 3" no, "2 3" latest earlier at index 10 ... followed by 7.
    assert d.propose(2) == ([7, 2], 2)
    assert d.propose(0) == ([], 0)


def test_a_short_history_drafts_nothing() -> None:
    assert NgramDrafter([]).propose(4) == ([], 0)
    assert NgramDrafter([5]).propose(4) == ([], 0)
    d = NgramDrafter([5, 5])
    assert d.propose(4) == ([5], 1)


@given(
    st.lists(st.integers(0, 4), max_size=40),
    st.lists(st.integers(0, 4), max_size=10),
    st.integers(1, 6),
)
def test_drafts_agree_with_a_brute_force_search(
    prompt: list[int], emitted: list[int], limit: int
) -> None:
    d = NgramDrafter(prompt, max_n=3)
    d.extend(emitted)
    assert d.propose(limit) == brute_force(prompt + emitted, limit, 3)


def test_acceptance_learns_drops_and_recovers() -> None:
    a = Acceptance()
    prior = a.rate(3)
    for _ in range(20):
        a.verified(3, drafted=4, accepted=4)
    assert a.rate(3) > 0.9
    for _ in range(20):
        a.verified(3, drafted=4, accepted=0)
    assert a.rate(3) < 0.2
    # Buckets are apart: a 1-gram's record says nothing of 3-grams'.
    assert a.rate(1) == Acceptance().rate(1)
    for _ in range(200):
        a.idle()
    assert abs(a.rate(3) - prior) < 0.01


def test_only_tokens_up_to_the_first_wrong_one_count() -> None:
    a, b = Acceptance(), Acceptance()
    a.verified(2, drafted=8, accepted=1)  # 1 right, 1 wrong, 6 unknown
    b.verified(2, drafted=2, accepted=1)
    assert a.rate(2) == b.rate(2)


def costs(points: dict[int, float]) -> StepCosts:
    c = StepCosts()
    for outputs, ms in points.items():
        c.measured(ms, outputs=outputs)
    return c


def test_step_costs_are_measured_per_count_and_optimistic_between() -> None:
    c = costs({1: 20.0, 5: 40.0})
    assert c.predict(1) == 20.0 and c.predict(5) == 40.0
    # Not measured: as cheap as it could plausibly be, so that the budget tries it: the
    # count below plus a quarter of a position's cost a position, or the count above.
    assert c.predict(2) == 25.0
    assert c.predict(4) == 35.0
    assert c.predict(9) == 60.0  # 40 + 4 x 5 (a quarter of one position's 20 ms each)
    c.measured(30.0, outputs=0, prefill=10)
    assert c.predict(1, prefill=10) == 50.0
    assert not StepCosts().known and StepCosts().predict(4) == 0.0


def test_a_cheaper_count_above_bounds_the_ones_below_it() -> None:
    # llama.cpp multiplies 1-3 columns one by one and 4 or more as a matrix: 4 positions
    # cost about what 3 do. A count under a cheaper measured one is predicted no dearer.
    c = costs({1: 20.0, 2: 40.0, 4: 26.0})
    assert c.predict(3) == 26.0
    c.measured(60.0, outputs=3)
    assert c.predict(3) == 60.0 and c.predict(4) == 26.0


def test_one_measured_count_extrapolates_optimistically() -> None:
    c = costs({8: 80.0})
    # 10 ms a position at 8 outputs, a quarter of that for each one more.
    assert c.predict(12) == 90.0
    assert c.predict(4) == 40.0  # fewer sequences than measured: in proportion


def test_memory_bound_steps_draft_and_compute_bound_steps_do_not() -> None:
    # One sequence, memory-bound: 25 ms with one position, 30 with nine.
    cheap = costs({n: 25.0 + (n - 1) * 5 / 8 for n in range(1, 10)})
    assert plan_drafts([Candidate(8, 0.9)], cheap, outputs=1) == [8]
    # Eight sequences, compute-bound: every position costs what a token is worth.
    dear = costs({n: 10.0 * n for n in range(8, 80)})
    assert plan_drafts([Candidate(8, 0.9)] * 8, dear, outputs=8) == [0] * 8
    # A draft that is rarely right is not worth even a cheap position.
    assert plan_drafts([Candidate(8, 0.01)], cheap, outputs=1) == [0]


def test_an_unmeasured_length_is_tried_when_it_might_be_best() -> None:
    # Only one position measured: drafts are tried (optimistically cheap), never blindly
    # at the most, and once measured dear they stop.
    c = costs({8: 80.0})
    tried = plan_drafts([Candidate(8, 0.9)] * 8, c, outputs=8)
    assert sum(tried) > 0
    c.measured(10.0 * (8 + sum(tried)), outputs=8 + sum(tried))
    again = plan_drafts([Candidate(8, 0.9)] * 8, c, outputs=8)
    assert sum(again) < sum(tried)


def test_drafts_go_to_the_sequences_most_likely_to_be_right() -> None:
    c = costs({n: 28.0 + n for n in range(2, 19)})
    counts = plan_drafts([Candidate(8, 0.3), Candidate(8, 0.95)], c, outputs=2)
    assert counts[1] > counts[0]
    assert sum(counts) < 16


def test_target_step_ms_caps_the_drafts() -> None:
    c = costs({n: 19.0 + n for n in range(1, 18)})  # 1 ms a position
    free = plan_drafts([Candidate(16, 0.99)], c, outputs=1)
    capped = plan_drafts([Candidate(16, 0.99)], c, outputs=1, target_ms=25.0)
    assert free == [16]
    assert capped == [5]
    assert c.predict(1 + capped[0]) <= 25.0


def test_nothing_measured_nothing_drafted() -> None:
    assert plan_drafts([Candidate(4, 0.9)], StepCosts(), outputs=1) == [0]


def test_a_cost_not_measured_for_a_while_is_tried_again() -> None:
    # Drafts looked ruinous at every length (a busy moment).
    c = costs({n: 20.0 + 25.0 * (n - 1) for n in range(1, 10)})
    assert plan_drafts([Candidate(8, 0.9)], c, outputs=1) == [0]
    for _ in range(c.horizon + 1):
        c.measured(20.0, outputs=1)  # steps without drafts
    # The old figures are forgotten: drafts are tried, and measured again.
    assert plan_drafts([Candidate(8, 0.9)], c, outputs=1)[0] > 0
    c.measured(24.0, outputs=9)
    assert plan_drafts([Candidate(8, 0.9)], c, outputs=1) == [8]
