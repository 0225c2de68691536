"""Speculative decoding's pure policy: prompt-lookup drafts, acceptance estimates, the
measured step costs and the draft budget built on them. No model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmtrio.engine._config import EngineConfig
from llmtrio.engine.generate._drafting import DraftBudget, _runs, judge_shadow
from llmtrio.engine.generate._jobs import Job, Part
from llmtrio.engine.spec_decode import (
    Acceptance,
    Candidate,
    NgramDrafter,
    NgramPool,
    PooledDrafter,
    Shape,
    StepCosts,
    micro_batch_sizes,
    plan_drafts,
    repacked,
)
from llmtrio.engine.spec_decode._batches import micro_batches
from llmtrio.engine.spec_decode._ngram import AGREED_MATCH, CONTESTED_MATCH, POOL_MATCH

from .._core_helpers import core_request


def brute_force(tokens: list[int], limit: int, max_n: int) -> tuple[list[int], int]:
    """What followed the latest earlier occurrence of the longest suffix (up to ``max_n``),
    as far as what followed the occurrence before it agrees (all of it, contested, where
    they part at once), read slowly."""
    for n in range(max_n, 0, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        starts = [
            start
            for start in range(len(tokens) - 1, n - 1, -1)  # never the suffix itself
            if tokens[start - n : start] == suffix
        ]
        if not starts:
            continue
        draft = tokens[starts[0] : starts[0] + limit]
        if len(starts) > 1:
            other = tokens[starts[1] : starts[1] + limit]
            agreed = 0
            while agreed < min(len(draft), len(other)) and draft[agreed] == other[agreed]:
                agreed += 1
            if not agreed:
                return draft, CONTESTED_MATCH
            draft = draft[:agreed]
        return draft, n
    return [], 0


def test_drafts_follow_the_latest_earlier_occurrence_of_the_longest_suffix() -> None:
    d = NgramDrafter([1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3], max_n=3)
    # "1 2 3" occurred once before, at the start, followed by 4 9 2 ...
    assert d.propose(3) == ([4, 9, 2], 3)
    d.extend([7])
    # "3 7" never occurred; "7" neither: nothing to draft.
    assert d.propose(4) == ([], 0)
    d.extend([2, 3])
    # "7 2 3" no; "2 3" occurred three times: followed by 7 2 3 the latest time (index 10),
    # by 5 6 the time before: they part at once, so the latest is offered as contested.
    assert d.propose(2) == ([7, 2], CONTESTED_MATCH)
    assert d.propose(0) == ([], 0)


def test_a_recurring_ngram_drafts_only_as_far_as_its_occurrences_agree() -> None:
    # A key in a list of records: '"name": "' then each record's own value.
    key, colon = 10, 11
    d = NgramDrafter([key, colon, 1, 2, 3, 20, key, colon, 1, 2, 4, 21, key], max_n=2)
    # After "key": colon 1 2 both times, then 3 or 4: the draft stops where they part.
    assert d.propose(8) == ([colon, 1, 2], 1)
    # Text that occurred once drafts in full, as far as the limit.
    d = NgramDrafter([5, 6, 7, 8, 9, 10, 5], max_n=2)
    assert d.propose(4) == ([6, 7, 8, 9], 1)
    # Where the last two occurrences part at once, the latest is offered, as contested:
    # its rate is its own, apart from the 1-gram's.
    d = NgramDrafter([key, 1, 2, key, 3, 4, key], max_n=2)
    assert d.propose(8) == ([3, 4, key], CONTESTED_MATCH)
    a = Acceptance()
    for _ in range(10):
        a.verified(CONTESTED_MATCH, drafted=4, accepted=0)
    assert a.rate(CONTESTED_MATCH) < 0.2 and a.rate(1) == Acceptance().rate(1)


def test_a_short_history_drafts_nothing() -> None:
    assert NgramDrafter([]).propose(4) == ([], 0)
    assert NgramDrafter([5]).propose(4) == ([], 0)
    d = NgramDrafter([5, 5])
    assert d.propose(4) == ([5], 1)


@pytest.mark.parametrize("grammar", [False, True], ids=["plain", "grammar-takes-all"])
@given(
    st.lists(st.integers(0, 4), max_size=40),
    st.lists(st.integers(0, 4), max_size=10),
    st.integers(1, 6),
)
def test_drafts_agree_with_a_brute_force_search(
    grammar: bool, prompt: list[int], emitted: list[int], limit: int
) -> None:
    # A grammar that takes everything chooses nothing, so it drafts as prompt lookup does
    # and reports nothing as its choice.
    fits = (lambda draft: len(draft)) if grammar else None
    d = NgramDrafter(prompt, max_n=3, fits=fits)
    d.extend(emitted)
    assert d.propose(limit) == brute_force(prompt + emitted, limit, 3)


# A JSON object's pieces as tokens: '",' closes a value, ' "' opens a key, '":' ends one.
CLOSE, OPEN, COLON = 1, 2, 3
NAME, CITY, YEAR = 10, 11, 12


def record_json(values: Sequence[int]) -> list[int]:
    """``{"name": v0, "city": v1, "year": v2}`` as tokens (each value one token)."""
    out: list[int] = []
    for key, value in zip((NAME, CITY, YEAR), values, strict=True):
        out += [OPEN, key, COLON, OPEN, value, CLOSE]
    return out


def schema_fits(emitted: Sequence[int]) -> Callable[[Sequence[int]], int]:
    """How many of a draft's tokens a grammar for ``record_json``'s shape takes after
    ``emitted`` (tokens of the object so far): keys in order, any value (tokens >= 100)."""

    def fits(draft: Sequence[int]) -> int:
        want = record_json([100, 100, 100])
        at = len(emitted)
        for i, token in enumerate(draft):
            if at + i >= len(want):
                return i
            expected = want[at + i]
            if token != expected and not (expected == 100 and token >= 100):
                return i
        return len(draft)

    return fits


def test_a_grammar_chooses_among_an_ngrams_occurrences() -> None:
    # Two worked examples, then the object so far: its name, closed.
    examples = record_json([101, 102, 103]) + record_json([201, 202, 203])
    emitted = [OPEN, NAME, COLON, OPEN, 301, CLOSE]
    tokens = examples + emitted
    # Prompt lookup alone: '",' was last followed by the second example's end and the
    # object's "name" key, the time before by the second example's "year": they agree on
    # ' "' only.
    assert NgramDrafter(tokens).propose(8) == ([OPEN], 1)
    # Held to the grammar: of the five times '",' was followed by something, the two that
    # lead into "city" (the key it wants) are taken whole, the rest cut after ' "'; the two
    # agree as far as the value after the key.
    d = NgramDrafter(tokens, fits=schema_fits(emitted))
    assert d.propose(8) == ([OPEN, CITY, COLON, OPEN], AGREED_MATCH)
    # Once the model writes a value no example has, nothing after it occurred before.
    d.extend([OPEN, CITY, COLON, OPEN, 302])
    assert d.propose(8) == ([], 0)
    # A value seen once (in the record the prompt quotes, say) drafts in full, as an
    # n-gram's match: one occurrence the grammar takes, nothing to agree with.
    d = NgramDrafter([7, 302, 8, 9, *tokens], fits=lambda draft: len(draft))
    d.extend([OPEN, CITY, COLON, OPEN, 302])
    assert d.propose(3) == ([8, 9, OPEN], 1)


def test_an_ngram_whose_continuations_the_grammar_refuses_gives_way_to_a_shorter_one() -> None:
    # "5 6" was followed by 7 (refused), "6" also by 8 (taken).
    tokens = [5, 6, 7, 0, 6, 8, 9, 0, 5, 6]
    d = NgramDrafter(tokens, max_n=2, fits=lambda draft: 0 if draft[0] == 7 else len(draft))
    assert d.propose(2) == ([8, 9], 1)
    refuse_all = NgramDrafter(tokens, max_n=2, fits=lambda draft: 0)
    assert refuse_all.propose(2) == ([], 0)


def test_a_contested_draft_on_a_run_is_priced_as_contested() -> None:
    a = Acceptance()
    for _ in range(10):
        a.verified(CONTESTED_MATCH, drafted=4, accepted=0)
    contested = a.rate(CONTESTED_MATCH)
    a.verified(3, drafted=4, accepted=4)
    assert a.on_run and a.rate(3) > contested
    # Where the copied text forks, the run does not carry over.
    assert a.rate(CONTESTED_MATCH) == contested
    a.verified(CONTESTED_MATCH, drafted=4, accepted=0)
    assert a.rate(CONTESTED_MATCH) < contested
    # The grammar's choices learn apart from the n-grams they were found with.
    b = Acceptance()
    assert b.rate(AGREED_MATCH) == b.rate(4)  # a 4-gram's prior
    for _ in range(10):
        b.verified(AGREED_MATCH, drafted=4, accepted=0)
    assert b.rate(AGREED_MATCH) < 0.2 and b.rate(4) == Acceptance().rate(4)


def test_a_pool_draft_is_cut_where_the_grammar_refuses_it() -> None:
    pool = NgramPool(1000, n=2)
    PooledDrafter(NgramDrafter([]), pool, [5, 6, 7, 8, 9, 10])  # (5, 6) -> 7 8 9 10
    tokens = [1, 2, 5, 6]

    def refusing(token: int) -> Callable[[Sequence[int]], int]:
        return lambda draft: list(draft).index(token) if token in draft else len(draft)

    fits = refusing(9)
    drafter = PooledDrafter(NgramDrafter(tokens, fits=fits), pool, tokens, fits=fits)
    assert drafter.propose(4) == ([7, 8], POOL_MATCH)
    # Refused at once: the pool has nothing to offer, and the own lookup finds nothing.
    fits = refusing(7)
    drafter = PooledDrafter(NgramDrafter(tokens, fits=fits), pool, tokens, fits=fits)
    assert drafter.propose(4) == ([], 0)


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


def costs(points: dict[int, float], *, batches: int = 1) -> StepCosts:
    c = StepCosts()
    for outputs, ms in points.items():
        c.measured(ms, outputs=outputs, batches=batches)
    return c


def linear(fixed: float, position: float, shapes: list[tuple[int, int]]) -> StepCosts:
    """Steps measured exactly at ``fixed`` ms a micro-batch plus ``position`` ms a position."""
    c = StepCosts()
    for batches, outputs in shapes:
        c.measured(fixed * batches + position * outputs, outputs=outputs, batches=batches)
    return c


def test_step_costs_fit_a_fixed_cost_per_micro_batch_and_a_cost_per_position() -> None:
    c = linear(12.0, 8.5, [(1, 1), (1, 8), (5, 12), (1, 16)])
    fixed, position = c.coefficients
    assert abs(fixed - 12.0) < 1e-6 and abs(position - 8.5) < 1e-6
    assert abs(c.predict(24, batches=3) - (36.0 + 204.0)) < 1e-6
    c.measured(30.0, outputs=0, prefill=10)
    assert abs(c.predict(1, prefill=10, batches=1) - (20.5 + 30.0)) < 1e-6
    assert not StepCosts().known and StepCosts().predict(4) == 0.0


def test_one_shape_is_split_by_the_prior() -> None:
    # Eight sequences at 85 ms: a micro-batch's fixed cost is taken to be nine positions'
    # (45 + 8 x 5).
    c = costs({8: 85.0})
    assert c.coefficients == (45.0, 5.0)
    assert c.predict(12) == 105.0


def test_a_stalled_step_moves_nothing() -> None:
    # Another process took the cores for seconds: one step among many. Each shape keeps
    # the median of its recent steps, so the fit does not see it.
    c = linear(12.0, 8.5, [(1, 1), (1, 8)] * 4)
    before = c.coefficients
    c.measured(4000.0, outputs=8)
    assert c.coefficients == pytest.approx(before)


@pytest.mark.parametrize(
    ("tokens", "split", "expected"),
    [
        ([1] * 8, True, 1),  # one token each: one micro-batch
        ([2] * 8, True, 1),  # equal drafts: still one
        ([1, 2] * 4, True, 5),  # the first tokens, then each drafting sequence alone
        ([1, 2, 3, 4] * 2, True, 7),
        ([1] * 7 + [9], True, 2),
        ([1] * 8 + [512], True, 2),  # a prompt chunk beside eight decoding sequences
        ([1, 2] * 4, False, 1),  # one pool: cut only at n_ubatch
        ([1] * 8 + [600], False, 2),
    ],
)
def test_micro_batches_follow_llama_cpp_split(
    tokens: list[int], split: bool, expected: int
) -> None:
    assert micro_batches(list(enumerate(tokens)), split=split, n_ubatch=584) == expected


def test_a_gap_in_sequence_ids_splits_a_micro_batch() -> None:
    # llama.cpp takes consecutive ids only: 0, 1, 3 with two tokens each are two.
    assert micro_batches([(0, 2), (1, 2), (3, 2)], split=True, n_ubatch=584) == 2


def test_memory_bound_steps_draft_and_compute_bound_steps_do_not() -> None:
    # One sequence, memory-bound: 25 ms a micro-batch, under 1 ms a position.
    cheap = linear(25.0, 0.6, [(1, 1), (1, 9)])
    assert plan_drafts([Candidate(8, 0.9)], cheap, outputs=1) == [8]
    # Eight sequences, compute-bound: every position costs what a token is worth.
    dear = linear(2.0, 10.0, [(1, 8), (1, 16), (1, 24)])
    assert plan_drafts([Candidate(8, 0.9)] * 8, dear, outputs=8) == [0] * 8
    # A draft that is rarely right is not worth even a cheap position.
    assert plan_drafts([Candidate(8, 0.01)], cheap, outputs=1) == [0]


def test_a_prompt_chunk_in_the_step_does_not_make_drafts_look_free() -> None:
    # Compute-bound decoding beside a 512-token prompt chunk: the chunk is ingested either
    # way, so drafts are judged against decoding's own rate, not the whole step's.
    dear = linear(2.0, 10.0, [(1, 8), (1, 16), (1, 24)])
    dear.measured(2000.0, outputs=0, prefill=512)
    assert plan_drafts([Candidate(8, 0.9)] * 8, dear, outputs=8, prefill=512) == [0] * 8
    cheap = linear(25.0, 0.6, [(1, 1), (1, 9)])
    cheap.measured(2000.0, outputs=0, prefill=512)
    assert plan_drafts([Candidate(8, 0.9)], cheap, outputs=1, prefill=512) == [8]


def test_gemma_on_two_cores_drafts_for_one_sequence_and_not_for_eight() -> None:
    # A fit measured on a loaded AVX2 EPYC (gemma-3-270m, 2 threads, per-slot, a line
    # through one and a few tokens): 12 ms a micro-batch, 8.5 ms a position; drafts right
    # 85% of the time.
    c = linear(12.0, 8.5, [(1, 1), (1, 8), (5, 12), (1, 16)])
    assert sum(plan_drafts([Candidate(8, 0.85)], c, outputs=1)) >= 2
    assert plan_drafts([Candidate(8, 0.85)] * 8, c, outputs=8) == [0] * 8


def test_a_slow_sampler_prices_its_own_drafts_out() -> None:
    # One stream, memory-bound: drafts pay with a greedy sampler (0.1 ms a position) but not
    # with one that takes 12 ms a position (top-p over 262k tokens without top-k): the
    # sampler runs at every position verified.
    c = linear(10.0, 2.0, [(1, 1), (1, 5)])
    fast = plan_drafts([Candidate(8, 0.5, sample_ms=0.1)], c, outputs=1, sampling_ms=0.1)
    slow = plan_drafts([Candidate(8, 0.5, sample_ms=12.0)], c, outputs=1, sampling_ms=12.0)
    assert fast[0] > 0 and slow == [0]
    # Among several sequences, the ones with cheap samplers draft.
    mixed = plan_drafts(
        [Candidate(8, 0.8, sample_ms=12.0), Candidate(8, 0.8, sample_ms=0.1)],
        linear(10.0, 2.0, [(1, 2), (1, 6)]),
        outputs=2,
        sampling_ms=12.1,
    )
    assert mixed[1] > mixed[0]


def split_batches(counts: Sequence[int]) -> list[int]:
    """Per-slot memory, every sequence decoding: ids 0, 1, ... with one token and drafts."""
    tokens = [(i, 1 + n) for i, n in enumerate(counts)]
    return micro_batch_sizes(tokens, split=True, n_ubatch=584)


def test_per_slot_memory_drafts_equal_lengths_or_none() -> None:
    # Drafting pays for four sequences when they stay in one micro-batch; the greedy plan
    # (the best sequences' tokens first) would split the batch into several, each reading
    # all the weights again.
    c = linear(40.0, 2.0, [(1, 4), (1, 12), (3, 8)])
    offers = [Candidate(6, 0.95), Candidate(6, 0.8), Candidate(6, 0.95), Candidate(6, 0.8)]
    counts = plan_drafts(offers, c, outputs=4, batches=split_batches)
    assert sum(counts) > 0
    assert len(split_batches(counts)) == 1
    # The same costs on one pool (never split): the best tokens first, and lengths that
    # differ, which per-slot memory would run in several micro-batches.
    pooled = plan_drafts(offers, c, outputs=4)
    assert sum(pooled) > 0 and len(split_batches(pooled)) > 1


def test_drafts_go_to_the_sequences_most_likely_to_be_right() -> None:
    c = linear(28.0, 1.0, [(1, 2), (1, 10), (1, 18)])
    counts = plan_drafts([Candidate(8, 0.3), Candidate(8, 0.95)], c, outputs=2)
    assert counts[1] > counts[0]
    assert sum(counts) < 16


def test_target_step_ms_caps_the_drafts() -> None:
    c = linear(19.0, 1.0, [(1, 1), (1, 17)])  # 1 ms a position
    free = plan_drafts([Candidate(16, 0.99)], c, outputs=1)
    capped = plan_drafts([Candidate(16, 0.99)], c, outputs=1, target_ms=25.5)
    assert free == [16]
    assert capped == [5]
    assert c.predict(1 + capped[0]) <= 25.5 < c.predict(2 + capped[0])


def test_nothing_measured_nothing_drafted() -> None:
    assert plan_drafts([Candidate(4, 0.9)], StepCosts(), outputs=1) == [0]


def test_a_cost_not_measured_for_a_while_is_forgotten() -> None:
    # Drafts looked ruinous (a busy moment): 2 ms a micro-batch, 30 a position.
    c = linear(2.0, 30.0, [(1, n) for n in range(1, 10)] * 3)
    assert plan_drafts([Candidate(8, 0.9)], c, outputs=1) == [0]
    for _ in range(c.horizon + 1):
        c.measured(20.0, outputs=1)  # steps without drafts
    # The old figures are forgotten: the one shape left is split by the prior, drafts are
    # tried, and measured again.
    assert plan_drafts([Candidate(8, 0.9)], c, outputs=1)[0] > 0
    for _ in range(3):
        c.measured(24.0, outputs=9)
    assert plan_drafts([Candidate(8, 0.9)], c, outputs=1) == [8]


def test_a_shape_seen_once_or_twice_does_not_decide() -> None:
    # One stall on the first step with drafts must not rule drafts out: a shape takes part
    # in the fit from its third step (a median of three).
    c = linear(12.0, 8.5, [(1, 1)] * 5)
    c.measured(900.0, outputs=5)
    assert plan_drafts([Candidate(8, 0.9)], c, outputs=1)[0] > 0
    for ms in (54.0, 56.0):
        c.measured(ms, outputs=5)
    assert c.coefficients == pytest.approx((12.0, 8.5), rel=0.05)


def test_a_run_of_right_drafts_is_priced_apart_and_drafts_long() -> None:
    """On copied text a draft right to its end is followed by drafts right far more often
    than a first draft is: those are counted apart (the run's bucket), and with gemma's costs
    on two cores (a step ~15 ms, a position ~9.5 ms) the budget then drafts the 16 tokens it
    is offered, where the per-n-gram rate of the same sequence (its first drafts, 2 right in
    4) drafts one token at most."""
    a = Acceptance()
    for _ in range(3):
        a.verified(3, drafted=4, accepted=2)  # first drafts: half right
    assert not a.on_run
    off_run = a.rate(3)
    for _ in range(30):
        a.verified(3, drafted=8, accepted=8)  # a copy on track
    assert a.on_run and a.rate(3) > 0.95
    run_rate = a.rate(3)
    steps = linear(5.5, 9.5, [(1, 1), (1, 2), (1, 4), (1, 8), (1, 1), (1, 3)])
    assert plan_drafts([Candidate(16, a.rate(3))], steps, outputs=1) == [16]
    assert plan_drafts([Candidate(16, off_run)], steps, outputs=1)[0] <= 1
    # The run ends at the first wrong token, and at a step without drafts.
    a.verified(3, drafted=8, accepted=5)
    assert not a.on_run and a.rate(3) < run_rate  # the 3-grams' own bucket again
    a.verified(3, drafted=2, accepted=2)
    assert a.on_run
    a.idle()
    assert not a.on_run


def test_micro_batch_sizes_follow_llama_cpp_split() -> None:
    assert micro_batch_sizes(list(enumerate([1, 2] * 4)), split=True, n_ubatch=584) == [
        8,
        1,
        1,
        1,
        1,
    ]
    assert micro_batch_sizes([(0, 17)], split=True, n_ubatch=584) == [17]
    assert micro_batch_sizes(list(enumerate([1] * 8 + [600])), split=False, n_ubatch=584) == [
        584,
        24,
    ]


#: ``benchmarks/step_shapes.py --repeat 5`` here (gemma-3-270m, 2 threads, per slot,
#: 2026-12-02 15:56): ms by (micro-batches, positions, micro-batches of one token).
GEMMA_STEPS = {
    (1, 1, 1): 13.4,
    (1, 2, 0): 29.1,
    (1, 3, 0): 34.7,
    (1, 4, 0): 37.6,
    (1, 6, 0): 61.8,
    (1, 9, 0): 61.8,
    (1, 13, 0): 76.1,
    (1, 17, 0): 83.4,
    (1, 25, 0): 101.2,
    (1, 33, 0): 124.2,
    (1, 65, 0): 210.2,
    (1, 8, 0): 45.3,
    (1, 16, 0): 62.7,
    (1, 32, 0): 107.2,
    (5, 12, 4): 95.5,
}


def gemma_steps(shapes: Sequence[tuple[int, int, int]] = tuple(GEMMA_STEPS)) -> StepCosts:
    c = StepCosts()
    for _ in range(3):
        for shape in shapes:
            batches, outputs, singles = shape
            c.measured(GEMMA_STEPS[shape], outputs=outputs, batches=batches, singles=singles)
    return c


def test_a_micro_batch_of_one_token_is_priced_apart() -> None:
    # llama.cpp's matrix-vector kernels (one token) and matrix products (two or more) do not
    # lie on one line: one token 13 ms, two 29, 17 83, 65 210.
    c = gemma_steps()
    fixed, position = c.coefficients
    assert c.single == pytest.approx(13.4)
    assert 20 < fixed < 35 and 2.0 < position < 3.5
    for shape in [(1, 17, 0), (1, 33, 0), (1, 65, 0), (1, 32, 0), (5, 12, 4)]:
        batches, outputs, singles = shape
        predicted = c.predict(outputs, batches=batches, singles=singles)
        assert predicted == pytest.approx(GEMMA_STEPS[shape], rel=0.15)
    # Without the single-token steps priced apart (no ``singles``), one line through one
    # and a few tokens: a 16-token draft at several times its cost.
    line = StepCosts()
    for _ in range(3):
        for outputs in (1, 2, 3, 4, 6):
            line.measured(GEMMA_STEPS[(1, outputs, 1 if outputs == 1 else 0)], outputs=outputs)
    assert line.predict(17) > 1.5 * GEMMA_STEPS[(1, 17, 0)]
    # Only steps of one token measured: the prior's split, which prices a first draft cheap
    # (it is tried, and measured).
    first = gemma_steps([(1, 1, 1)])
    assert first.single == pytest.approx(13.4)
    assert first.predict(17) < GEMMA_STEPS[(1, 17, 0)]


def test_one_stream_on_a_run_drafts_long_and_short_drafts_do_not_pay() -> None:
    """With gemma's costs on two cores a draft of one token costs a second step (29 ms
    against 13) and one of 16 about six (83): drafts pay only long and mostly right, so a
    sequence on a run of copied text drafts all 16 it is offered, and one whose drafts are
    right 70% of the time drafts nothing."""
    c = gemma_steps()
    assert plan_drafts([Candidate(16, 0.97)], c, outputs=1) == [16]
    assert plan_drafts([Candidate(16, 0.7)], c, outputs=1) == [0]
    # Offered 32 on a run (a longer --spec-draft-max), it verifies more than 16.
    assert plan_drafts([Candidate(32, 0.98)], c, outputs=1)[0] > 16


#: ``benchmarks/step_shapes.py --scan 24 --repeat 5`` here (gemma-3-270m, 2 threads, per
#: slot, 2026-12-02 19:22): ms of one sequence's step by its tokens, all with logits.
GEMMA_SCAN = {
    1: 16.6, 2: 34.4, 3: 40.4, 4: 44.5, 5: 66.5, 6: 73.5, 7: 78.1, 8: 58.5, 9: 82.2, 10: 82.1,
    11: 93.4, 12: 74.3, 13: 93.8, 14: 98.7, 15: 107.2, 16: 86.3, 17: 113.1, 18: 123.7,
    19: 124.2, 20: 95.8, 21: 117.5, 22: 129.2, 23: 134.2, 24: 116.1,
}  # fmt: skip


def scanned(sizes: Sequence[int] = tuple(GEMMA_SCAN)) -> StepCosts:
    c = StepCosts()
    for _ in range(3):
        for n in sizes:
            c.measured(GEMMA_SCAN[n], outputs=n, shape=Shape.of([n]))
    return c


def test_a_micro_batch_that_fills_its_blocks_is_priced_below_one_token_shorter() -> None:
    # llama.cpp multiplies repacked weights four tokens at a time and runs the tokens past
    # the last four as matrix-vector products, a second pass: 16 tokens 86 ms, 15 107, 17 113.
    c = scanned()
    assert c.remainder > 10.0
    for n, ms in GEMMA_SCAN.items():
        # Two or three tokens are priced as that many one-token steps (33 and 50 ms).
        rel = 0.25 if n < 4 else 0.12
        assert c.predict(n, shape=Shape.of([n])) == pytest.approx(ms, rel=rel), n
    # One stream on a run drafts 15 (16 positions: whole blocks), not the 16 it is offered.
    assert plan_drafts([Candidate(16, 0.99)], c, outputs=1) == [15]
    # Seen only in whole blocks, a remainder is not known to cost anything: a plan with one
    # is tried, and measured.
    blocks = scanned([1, 4, 8, 12, 16, 20, 24])
    assert blocks.remainder == 0.0
    assert plan_drafts([Candidate(16, 0.99)], blocks, outputs=1) == [16]


def test_one_streams_steps_leave_a_fit_that_prices_eight_streams_drafts() -> None:
    # What a core had measured after one stream of free chat (here, 20:08): one token 11.7
    # ms, 2-3 tokens 25-32, 4 and 8 36 and 41, 5 and 9 55 and 62. Two or three tokens are as
    # many matrix-vector passes, not a dear micro-batch's positions: fitted as positions
    # they priced one at 6.5 ms, and eight streams drafted nothing where drafts paid.
    c = StepCosts()
    for _ in range(3):
        for n, ms in {1: 11.7, 2: 24.8, 3: 31.5, 4: 35.5, 5: 54.7, 8: 40.9, 9: 61.5}.items():
            c.measured(ms, outputs=n, shape=Shape.of([n]))
    assert c.coefficients[1] < 3.0  # ms a position
    assert sum(plan_drafts([Candidate(2, 0.9)] * 8, c, outputs=8, batches=split_batches)) > 0


def test_shapes_count_micro_batches_by_what_llama_cpp_runs_them_with() -> None:
    assert Shape.of([1]) == Shape(batches=1, singles=1)
    shape = Shape.of([2, 3, 4, 5, 8, 1])
    assert shape == Shape(batches=6, singles=1, short=2, short_tokens=5, partial=1)
    assert shape.long == 3
    assert Shape.of([]) == Shape.of([1])


def test_eight_streams_draft_equal_lengths_when_mostly_right() -> None:
    # Eight sequences on gemma's costs: a position ~2.5 ms against a step of 45 for eight
    # tokens; drafts of equal length keep one micro-batch and pay when mostly right.
    c = gemma_steps()
    right = plan_drafts([Candidate(8, 0.95)] * 8, c, outputs=8, batches=split_batches)
    assert sum(right) > 0 and len(split_batches(right)) == 1
    assert plan_drafts([Candidate(8, 0.3)] * 8, c, outputs=8, batches=split_batches) == [0] * 8


def test_a_new_sequence_starts_from_what_the_cores_sequences_earned() -> None:
    shared = Acceptance(relax=0.01)
    first = Acceptance(shared=shared)
    prior = Acceptance().rate(4)
    first.verified(4, drafted=8, accepted=8)
    for _ in range(20):
        first.verified(4, drafted=16, accepted=16)  # a copy on track: runs
    assert first.on_run
    # A request that comes after starts its run bucket where the core's stands.
    second = Acceptance(shared=shared)
    second.verified(4, drafted=4, accepted=4)
    assert second.on_run and second.rate(4) > 0.97 > prior
    # A sequence's step without drafts moves its own rates only; the core's drift back to
    # the fixed prior, slowly, once a step (test below).
    before = shared.rate(4)
    second.idle()
    assert shared.rate(4) == before
    shared.idle()
    assert Acceptance().rate(4) < shared.rate(4) < before


def attention_budget(plan: Callable[..., list[int]]) -> DraftBudget:
    """A core's draft budget for an attention-only model on per-slot memory (the model is
    read for its memory's layout only), 64 tokens a batch."""
    model = SimpleNamespace(
        is_recurrent=False,
        is_hybrid=False,
        n_swa=0,
        swa_full=False,
        kv_unified=False,
        meta=lambda key: None,
    )
    return DraftBudget(model, EngineConfig(spec="ngram"), 64, plan)  # type: ignore[arg-type]


def test_a_step_without_drafts_moves_the_cores_acceptance_once_however_many_sequences() -> None:
    budget = attention_budget(plan_drafts)

    def step(sequences: int) -> float:
        """The core's rate after one step of ``sequences`` sequences that drafted nothing
        (none has a drafter), from one same high rate."""
        budget.acceptance = Acceptance(memory=0.99, relax=0.01)
        budget.acceptance.verified(4, drafted=16, accepted=15)
        requests = [core_request(i, [1, 2, 3], 32) for i in range(sequences)]
        parts = [
            Part(Job(r, seq=i, pos=3, acceptance=Acceptance(shared=budget.shared(r))), None, 1, i)
            for i, r in enumerate(requests)
        ]
        budget.draft(parts, [])
        assert not any(part.draft for part in parts)
        return budget.acceptance.rate(4)

    one, eight = step(1), step(8)
    assert one == eight  # one step's drift, not eight
    unmoved = Acceptance(memory=0.99, relax=0.01)
    unmoved.verified(4, drafted=16, accepted=15)
    assert one < unmoved.rate(4)


def test_requests_held_to_a_grammar_share_their_own_rates() -> None:
    """A batch of JSON-schema requests, whose drafts mostly fail (the structure the model
    writes is not in the prompt), does not lower the rates free-text requests start from;
    a lazy grammar (tool calls: free text until its trigger) counts as free text."""
    budget = attention_budget(plan_drafts)
    schema = core_request(0, [1, 2, 3], 32, grammar='root ::= "x"')
    lazy = core_request(1, [1, 2, 3], 32, grammar='root ::= "x"')
    assert lazy.grammar is not None
    lazy = attrs.evolve(lazy, grammar=attrs.evolve(lazy.grammar, trigger="<tool_call>"))
    free = core_request(2, [1, 2, 3], 32)
    assert budget.shared(schema) is budget.constrained
    assert budget.shared(lazy) is budget.acceptance is budget.shared(free)
    before = budget.acceptance.rate(4)
    extraction = Acceptance(shared=budget.shared(schema))
    for _ in range(10):
        extraction.verified(4, drafted=8, accepted=0)
    assert budget.constrained.rate(4) < before == budget.acceptance.rate(4)


@pytest.mark.parametrize("drafts_fit", [False, True])
def test_the_budget_cuts_a_draft_where_the_grammar_refuses_unless_its_drafter_did(
    drafts_fit: bool,
) -> None:
    """A drafter that does not know the sequence's grammar (a lazy one, a test's own)
    gets its drafts cut by the budget at the first token the grammar refuses; the core's
    drafter under a grammar cuts its own, and the grammar is not walked again."""
    every = lambda candidates, *_, **__: [c.tokens for c in candidates]  # noqa: E731
    budget = attention_budget(every)
    budget.costs.measured(20.0, outputs=1)
    asked: list[list[int]] = []

    class Sampler:
        def allowed(self, tokens: list[int]) -> int:
            asked.append(list(tokens))
            return 2  # refuses the third

    job = Job(core_request(0, [1, 2, 3], 32), seq=0, pos=3, drafts_fit=drafts_fit)
    job.sampler = Sampler()  # type: ignore[assignment]
    job.drafter = NgramDrafter([5, 6, 7, 8, 9, 4, 5])  # proposes 6, 7, 8, 9, 4, 5
    part = Part(job, None, 1, 0)
    budget.draft([part], [])
    if drafts_fit:
        assert part.draft == [6, 7, 8, 9, 4, 5] and asked == []
    else:
        assert part.draft == [6, 7] and asked == [[6, 7, 8, 9, 4, 5]]


def test_a_draft_not_verified_puts_the_sequence_on_a_run_once_it_proves_right() -> None:
    """A sequence the budget gives no drafts keeps its drafter's proposal's first four
    tokens and checks them against what it emits: all four right (a copy back on track
    after a change) put it on a run, so it drafts long again at once; its rates do not
    count them."""
    never = lambda candidates, *_, **__: [0] * len(candidates)  # noqa: E731
    budget = attention_budget(never)
    job = Job(core_request(0, [1, 2, 3], 32), seq=0, pos=3)
    job.acceptance = Acceptance()
    budget.costs.measured(20.0, outputs=1)

    def step(emitted: int) -> None:
        part = Part(job, None, 1, 0)
        budget.draft([part], [])
        assert part.draft == []
        judge_shadow(job, [emitted])
        assert job.drafter is not None
        job.drafter.extend([emitted])

    job.drafter = NgramDrafter([5, 6, 7, 8, 9, 4, 5, 6, 7, 8, 9, 4])  # proposes 5, 6, 7, 8...
    rates = [job.acceptance.rate(n) for n in range(1, 5)]
    step(5)
    assert job.shadow == [6, 7, 8] and not job.acceptance.on_run
    step(6)
    step(7)
    assert not job.acceptance.on_run
    step(8)
    assert job.shadow == [] and job.acceptance.on_run
    # A wrong token ends the shadow draft: no run.
    job.drafter = NgramDrafter([5, 6, 7, 8, 9, 4, 5, 6, 7, 8, 9, 4])
    job.acceptance = Acceptance()
    step(5)
    step(0)
    assert job.shadow == [] and not job.acceptance.on_run
    assert [job.acceptance.rate(n) for n in range(1, 5)] == rates  # shadows are not counted
    # A proposal shorter than four tokens is not kept.
    job.drafter = NgramDrafter([7, 8, 9, 7])  # proposes 8, 9, 7
    budget.draft([Part(job, None, 1, 0)], [])
    assert job.shadow == []


def test_several_streams_draft_only_for_a_gain_past_the_step_costs_spread() -> None:
    # 10 ms a micro-batch, 1 ms a position. Eight sequences' one-token drafts right 59% of
    # the time are predicted at 1.1x the step without. Steps that came out exactly as
    # measured (no spread): the gain is real, so all eight draft.
    c = linear(10.0, 1.0, [(1, 1), (1, 2), (1, 8), (1, 16)] * 3)
    assert c.spread == 0.0
    assert plan_drafts([Candidate(1, 0.59)] * 8, c, outputs=8) == [1] * 8
    # Each shape's steps 20% apart (interquartile, over its median): a 1.1x gain is within
    # what either prediction may be off by, so none; a margin given overrides it.
    noisy = StepCosts()
    for batches, outputs in [(1, 1), (1, 2), (1, 8), (1, 16)]:
        for spread in (0.9, 1.0, 1.1):
            ms = (10.0 * batches + outputs) * spread
            noisy.measured(ms, outputs=outputs, batches=batches)
    assert abs(noisy.spread - 0.2) < 1e-9
    assert plan_drafts([Candidate(1, 0.59)] * 8, noisy, outputs=8) == [0] * 8
    assert plan_drafts([Candidate(1, 0.59)] * 8, noisy, outputs=8, margin=0.0) == [1] * 8
    # Drafts right 95% of the time clear it.
    assert plan_drafts([Candidate(1, 0.95)] * 8, noisy, outputs=8) == [1] * 8
    # One stream's draft predicted at 1.09x is taken, spread or not.
    assert plan_drafts([Candidate(1, 0.2)], c, outputs=1) == [1]
    assert plan_drafts([Candidate(1, 0.2)], noisy, outputs=1) == [1]


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 4)), min_size=1, max_size=10))
def test_drafts_keep_the_micro_batches_of_no_drafts_only_if_equal_in_each_run(
    items: list[tuple[bool, int]],
) -> None:
    # What the draft budget relies on to reject most plans without counting micro-batches:
    # per slot, sequences decoding one token each (ascending ids, gaps where a slot is
    # free) run in one micro-batch per run of consecutive ids; with drafts, in as many only
    # if every sequence of a run carries as many, else in more.
    ids, seq = [], 0
    for gap, _ in items:
        seq += 1 + gap
        ids.append(seq)
    counts = [count for _, count in items]
    zero = micro_batch_sizes([(s, 1) for s in ids], split=True, n_ubatch=512)
    plan = micro_batch_sizes(
        [(s, 1 + c) for s, c in zip(ids, counts, strict=True)], split=True, n_ubatch=512
    )
    equal = all(len({counts[j] for j in run}) == 1 for run in _runs(ids))
    assert len(zero) == len(_runs(ids))
    assert len(plan) >= len(zero)
    assert (len(plan) == len(zero)) == equal


def test_the_spread_counts_settled_shapes_only_weighted_by_their_steps() -> None:
    c = StepCosts()
    assert c.spread == 0.0
    c.measured(10.0, outputs=1)
    c.measured(30.0, outputs=1)
    assert c.spread == 0.0  # two steps: not settled
    c.measured(20.0, outputs=1)
    assert abs(c.spread - 1.0) < 1e-9  # 10, 20, 30: (30 - 10) / 20
    for _ in range(6):
        c.measured(50.0, outputs=8)
    # (3 x 1.0 + 6 x 0.0) / 9
    assert abs(c.spread - 1 / 3) < 1e-9


# --- the pool of n-grams shared by a core's sequences --------------------------------------


def test_the_pool_chains_what_followed_each_n_gram() -> None:
    pool = NgramPool(100, n=3)
    pool.add((), [1, 2, 3, 4, 5, 6, 7])
    assert pool.propose([9, 1, 2, 3], 10) == [4, 5, 6, 7]  # chained to the end
    assert pool.propose([9, 1, 2, 3], 2) == [4, 5]
    assert pool.propose([2, 3, 4, 5, 6], 10) == [7]
    assert pool.propose([1, 2], 10) == []  # shorter than n
    assert pool.propose([9, 9, 9], 10) == []  # never seen
    assert pool.propose([1, 2, 3], 0) == []


def test_the_pool_keeps_the_latest_continuation_and_joins_what_was_added_in_pieces() -> None:
    pool = NgramPool(100, n=2)
    pool.add((), [1, 2, 3])
    pool.add([0, 1, 2, 3], [4])  # the context's last n tokens carry over: (2, 3) -> 4
    pool.add((), [1, 2, 7])  # a later sequence wrote (1, 2) -> 7
    assert pool.propose([1, 2], 3) == [7]
    assert pool.propose([5, 2, 3], 3) == [4]


def test_a_cycle_in_the_pool_is_bounded_by_the_limit() -> None:
    pool = NgramPool(100, n=1)
    pool.add((), [1, 2, 1])
    assert pool.propose([1], 5) == [2, 1, 2, 1, 2]


def test_the_pool_holds_at_most_its_size_and_evicts_the_least_recently_written() -> None:
    pool = NgramPool(4, n=1)
    pool.add((), [1, 2, 3, 4, 5])  # (1)->2 (2)->3 (3)->4 (4)->5
    assert len(pool) == 4
    pool.add([1], [9])  # (1) rewritten: the most recent now
    pool.add([6], [7])  # a fifth entry: (2), the least recently written, goes
    assert len(pool) == 4
    assert pool.propose([2], 1) == []
    assert pool.propose([1], 1) == [9]
    assert pool.propose([3], 1) == [4]
    assert pool.propose([6], 1) == [7]


@given(st.lists(st.integers(0, 5), max_size=60), st.integers(1, 8), st.integers(1, 4))
def test_the_pool_never_exceeds_its_size(tokens: list[int], size: int, n: int) -> None:
    pool = NgramPool(size, n=n)
    for i in range(0, len(tokens), 7):
        pool.add(tokens[:i], tokens[i : i + 7])
        assert len(pool) <= size


def test_the_pool_rejects_a_size_or_n_below_one() -> None:
    with pytest.raises(ValueError):
        NgramPool(0)
    with pytest.raises(ValueError):
        NgramPool(10, n=0)


def test_a_sequence_drafts_what_another_sequence_wrote() -> None:
    pool = NgramPool(1000, n=3)
    writer = PooledDrafter(NgramDrafter([1, 2, 3]), pool, [1, 2, 3])
    writer.extend([10, 11, 12, 13, 14, 15])
    # A sequence whose own tokens never held 11, 12, 13: its own lookup finds nothing.
    reader = PooledDrafter(NgramDrafter([7, 8, 11, 12, 13]), pool, [7, 8, 11, 12, 13])
    assert reader.propose(10) == ([14, 15], POOL_MATCH)
    # What the reader emits feeds the pool too, past where the writer's text ended.
    reader.extend([14, 15, 16])
    assert pool.propose([14, 15, 16], 5) == []
    assert pool.propose([13, 14, 15], 5) == [16]


def test_the_own_lookup_wins_where_it_is_longer_than_the_pools() -> None:
    pool = NgramPool(1000, n=3)
    PooledDrafter(NgramDrafter([]), pool, [5, 6, 7, 8])  # (5, 6, 7) -> 8 only
    tokens = [7, 20, 21, 22, 23, 5, 6, 7]  # own: 7 -> 20 21 22 23 5 ...
    drafter = PooledDrafter(NgramDrafter(tokens), pool, tokens)
    draft, match = drafter.propose(4)
    assert (draft, match) == ([20, 21, 22, 23], 1)
    # Where the own draft is no longer than the pool's, the pool's (its longer match) wins.
    assert drafter.propose(1) == ([8], POOL_MATCH)


def test_the_draft_worth_more_tokens_at_its_rate_wins() -> None:
    pool = NgramPool(1000, n=3)
    PooledDrafter(NgramDrafter([]), pool, [5, 6, 7, 8, 9])  # (5, 6, 7) -> 8, 9
    tokens = [7, 20, 21, 5, 6, 7]  # own: 7 -> 20 21 5 ...
    rates = {1: 0.9, POOL_MATCH: 0.9}
    drafter = PooledDrafter(NgramDrafter(tokens), pool, tokens, rates.__getitem__)
    assert drafter.propose(2) == ([8, 9], POOL_MATCH)  # a tie: the pool's longer match
    assert drafter.propose(4) == ([20, 21, 5, 6], 1)  # longer at the same rate
    rates[POOL_MATCH] = 0.3  # the pool's drafts have been wrong
    assert drafter.propose(2) == ([20, 21], 1)
    assert drafter.propose(1) == ([20], 1)


def test_pool_drafts_are_priced_apart_from_prompt_lookups() -> None:
    acceptance = Acceptance()
    before = acceptance.rate(4)
    for _ in range(20):
        acceptance.verified(POOL_MATCH, 8, 0)  # wrong at once: no run
    assert not acceptance.on_run
    assert acceptance.rate(POOL_MATCH) < 0.2
    assert acceptance.rate(4) == pytest.approx(before)


def test_a_draft_stops_before_the_first_token_the_requests_grammar_refuses() -> None:
    """The budget offers a sequence held to a grammar only the draft tokens its sampler's
    grammar takes in turn (``SlotSampler.allowed``, tested on the real grammar in
    test_constrained.py): a token past the first refused one could never be accepted."""
    seen: list[list[Candidate]] = []

    def every(candidates: Sequence[Candidate], *_: object, **__: object) -> list[int]:
        seen.append(list(candidates))
        return [c.tokens for c in candidates]

    budget = attention_budget(every)
    budget.costs.measured(20.0, outputs=1)
    job = Job(core_request(0, [1, 2, 3], 32), seq=0, pos=3, acceptance=Acceptance())
    job.drafter = NgramDrafter([5, 6, 7, 8, 9, 4, 5])  # proposes 6, 7, 8, 9, 4, 5
    job.sampler = SimpleNamespace(allowed=lambda draft: 3)  # type: ignore[assignment]
    part = Part(job, None, 1, 0)
    budget.draft([part], [])
    assert part.draft == [6, 7, 8] and seen[-1][0].tokens == 3
    # Nothing the grammar takes: no offer at all.
    job.sampler = SimpleNamespace(allowed=lambda draft: 0)  # type: ignore[assignment]
    part = Part(job, None, 1, 0)
    budget.draft([part], [])
    assert part.draft == [] and seen[-1] == []


def test_a_remainder_the_steps_cannot_tell_apart_is_priced_by_the_prior() -> None:
    """One stream that only ever drafted 16 (17 positions: four blocks and one token) and
    stepped alone: the shapes cannot tell a remainder's cost apart. Without a prior the fit
    prices 16 positions a position cheaper than 17 (so a run drafts 16); with the prior of
    repacked weights (a one-token step) a whole-block step comes out that much cheaper, and
    one stream's plan drafts 15, as the scan measured (86 ms against 113)."""

    def measured(prior: float) -> StepCosts:
        c = StepCosts(remainder_prior=prior)
        for _ in range(3):
            c.measured(17.0, outputs=1, shape=Shape.of([1]))
            c.measured(113.0, outputs=17, shape=Shape.of([17]))
        return c

    plain, primed = measured(0.0), measured(1.0)
    # Only one-token steps measured: the prior is there already, for the first plans.
    first = StepCosts(remainder_prior=1.0)
    for _ in range(3):
        first.measured(17.0, outputs=1, shape=Shape.of([1]))
    assert first.remainder == 17.0
    assert plan_drafts([Candidate(16, 0.99)], first, outputs=1) == [15]
    assert plain.remainder == 0.0 and primed.remainder == 17.0
    for c in (plain, primed):
        assert abs(c.predict(17, shape=Shape.of([17])) - 113.0) < 1e-6  # what it measured
    saved = [
        c.predict(17, shape=Shape.of([17])) - c.predict(16, shape=Shape.of([16]))
        for c in (plain, primed)
    ]
    # Without: one position's cost. With: the remainder's pass as well.
    assert abs(saved[0] - plain.coefficients[1]) < 1e-6
    assert abs(saved[1] - (17.0 + primed.coefficients[1])) < 1e-6
    run = [Candidate(16, 0.99)]
    assert plan_drafts(run, plain, outputs=1) == [16]
    assert plan_drafts(run, primed, outputs=1) == [15]
    # Whole blocks measured beside the remainder: the measurement wins over the prior.
    for _ in range(3):
        primed.measured(86.0, outputs=16, shape=Shape.of([16]))
        primed.measured(44.5, outputs=4, shape=Shape.of([4]))
    # 4 and 16 positions: 30.67 + 3.458 a position; so 17 with the remainder: 23.54.
    assert abs(primed.remainder - 23.54) < 0.01


def test_repacked_file_types() -> None:
    assert repacked("15") and repacked("2") and not repacked("7") and not repacked(None)


def test_a_stalled_step_moves_no_shape() -> None:
    c = StepCosts()
    plain, drafted = Shape.of([8]), Shape.of([24])
    for shape, outputs, ms in ((plain, 8, 80.0), (drafted, 24, 200.0)):
        for _ in range(5):
            c.measured(ms, outputs=outputs, shape=shape)
    c.measured(3000.0, outputs=8, shape=plain)  # another process held the cores
    assert c.predict(8, shape=plain) == pytest.approx(80.0, rel=0.01)
    assert c.predict(24, shape=drafted) == pytest.approx(200.0, rel=0.01)


def test_after_several_stalled_steps_every_shape_is_priced_as_before() -> None:
    """Another process held the cores for five steps (two to six times slower): once the
    steps are back to their time, a shape not measured since is priced as before (a fit
    that followed the machine's speed with one factor, tried and reverted, kept the
    stalled steps' speed and priced the drafts 20% cheap for good)."""
    c = StepCosts()
    plain, drafted = Shape.of([8]), Shape.of([24])
    for shape, outputs, ms in ((plain, 8, 80.0), (drafted, 24, 200.0)):
        for _ in range(5):
            c.measured(ms, outputs=outputs, shape=shape)
    for ms in (480.0, 160.0, 400.0, 200.0, 320.0, *[80.0] * 100):
        c.measured(ms, outputs=8, shape=plain)
    assert c.predict(8, shape=plain) == pytest.approx(80.0, rel=0.01)
    assert c.predict(24, shape=drafted) == pytest.approx(200.0, rel=0.01)


@pytest.mark.parametrize("idle_s", [60.0, 1.0])
def test_after_an_idle_gap_every_shape_follows_the_machines_new_speed(idle_s: float) -> None:
    """An engine idle past ``gap_s`` may find the machine faster (another process left):
    the first shape measured again sets the speed of all those measured before, so plain
    steps measured fast are not fitted against drafting steps measured slow (which made
    drafts look dear for a whole batch)."""
    c = StepCosts(gap_s=5.0)
    plain, drafted = Shape.of([8]), Shape.of([24])
    t = 0.0
    for shape, outputs, ms in ((plain, 8, 80.0), (drafted, 24, 200.0)):
        for _ in range(5):
            c.measured(ms, outputs=outputs, shape=shape, at=t)
            t += 0.1
    before = c.predict(24, shape=drafted)
    assert before == pytest.approx(200.0, rel=0.01)
    t += idle_s
    for _ in range(3):  # now twice as fast
        c.measured(40.0, outputs=8, shape=plain, at=t)
        t += 0.1
    if idle_s > c.gap_s:
        assert c.predict(8, shape=plain) == pytest.approx(40.0, rel=0.01)
        assert c.predict(24, shape=drafted) == pytest.approx(100.0, rel=0.01)
    else:
        # No gap: each shape keeps its own last times (the plain shape's median is still
        # that of its five from before; three fast steps may be a lull, not a new speed).
        assert c.predict(8, shape=plain) == pytest.approx(80.0, rel=0.01)
        assert c.predict(24, shape=drafted) == pytest.approx(200.0, rel=0.01)
